import Foundation

/// A change of this member's partition assignment.
public enum AssignmentChange: Sendable, Hashable {
    /// Partitions added to this member.
    case assigned(Set<TopicPartition>)
    /// Partitions taken away (revoked or lost). Work in flight for them must be dropped: the new owner redelivers it,
    /// and `markProcessed` for them is ignored from now on.
    case revoked(Set<TopicPartition>, lost: Bool)
}

struct BatchWaiter {
    let id: UInt64
    let maxMessages: Int
    let deadline: ContinuousClock.Instant
    let continuation: CheckedContinuation<Result<[KafkaMessage], KafkaError>, Never>
}

/// The consumer's state, and every decision about it: rebalances, which fetched messages are handed out, which
/// offsets to store, what an offset reset does. Plain Swift (no librdkafka), so the rules are unit-tested without a
/// cluster; `ConsumerCore` performs the actions these methods return.
struct ConsumerState {
    /// Fetched messages in chunks (one per poll round), handed out whole when possible (no per-message copies).
    var chunks: [[KafkaMessage]] = []
    var chunkHead = 0
    var buffered = 0
    var waiters: [BatchWaiter] = []
    var nextWaiterId: UInt64 = 0
    var assignment: Set<TopicPartition> = []
    var trackers: [TopicPartition: OffsetTracker] = [:]
    /// Partitions whose position went out of range under `OffsetResetPolicy.fail`: paused, messages filtered.
    var blocked: Set<TopicPartition> = []
    /// Next offset after the last message fetched per assigned partition (for the stall watch).
    var fetched: [TopicPartition: Int64] = [:]
    /// When the application last asked for messages (`nextBatch`), for the stall watch.
    var lastAsk = ContinuousClock.now
    /// The application holds its work on purpose and says so elsewhere (a worker waiting for revocation status in
    /// hard mode): not a stall.
    var holding = false
    var joined = false
    var stopRequested = false
    /// Since the last fetch wake (`stalledFetchPositions`), the poll thread stopped polling for backpressure or a poll
    /// round found librdkafka's queue near its limit (`prefetchQueueNearLimit`).
    var fetchMayStall = false
    /// What armed the wake last (the `cause` of `fleet_consumer_fetch_wakes_total`).
    var fetchWakeCause = FetchWakeCause.backpressure
    /// Seeks made to wake a stalled fetch (tests, logs).
    var fetchWakes = 0
    /// The poll thread has finished closing; the handle is destroyed or about to be.
    var handleGone = false
    var fatal: KafkaError?

    // MARK: rebalance

    /// Partitions added to this member: tracked from now on. librdkafka must assign them.
    mutating func assign(_ partitions: Set<TopicPartition>) -> (RebalanceAction, AssignmentChange) {
        joined = true
        for tp in partitions {
            assignment.insert(tp)
            trackers[tp] = OffsetTracker()
        }
        return (.assign, .assigned(partitions))
    }

    /// Partitions taken away: tracking dropped first, so completions for them no longer store anything (offsets stored
    /// so far are committed by librdkafka when it unassigns, auto-commit on); buffered messages of them are dropped.
    mutating func revoke(_ partitions: Set<TopicPartition>, lost: Bool) -> (RebalanceAction, AssignmentChange) {
        assignment.subtract(partitions)
        drop(partitions)
        return (.unassign, .revoked(partitions, lost: lost))
    }

    /// A rebalance error: the whole assignment is given up as lost.
    mutating func rebalanceFailed() -> (RebalanceAction, AssignmentChange) {
        let all = assignment
        assignment = []
        drop(all)
        return (.unassignAll, .revoked(all, lost: true))
    }

    mutating func rebalance(_ event: RebalanceEvent) -> (RebalanceAction, AssignmentChange) {
        switch event.kind {
        case .assign: return assign(event.partitions)
        case .revoke(let lost): return revoke(event.partitions, lost: lost)
        case .failed: return rebalanceFailed()
        }
    }

    // MARK: fetched messages and offsets

    /// A poll round's messages: those of partitions no longer assigned (revoked meanwhile: the new owner gets them) or
    /// blocked (offset reset under policy `fail`: nothing past the gap) are dropped, the rest buffered.
    mutating func accept(_ batch: [KafkaMessage]) {
        guard !batch.isEmpty else { return }
        var lastTP: TopicPartition?
        var allAssigned = true
        for m in batch where lastTP?.partition != m.partition || lastTP?.topic != m.topic {
            lastTP = m.topicPartition
            if !assignment.contains(m.topicPartition) || blocked.contains(m.topicPartition) { allAssigned = false; break }
        }
        let kept = allAssigned ? batch : batch.filter { assignment.contains($0.topicPartition) && !blocked.contains($0.topicPartition) }
        noteFetched(kept)
        append(kept)
    }

    /// Messages finished: the next offset to store for every partition whose contiguous finished prefix advanced.
    /// Revoked, lost or unknown partitions have no tracker: their completions are dropped.
    mutating func complete(_ items: [(TopicPartition, Int64)]) -> [TopicPartition: Int64] {
        var advances: [TopicPartition: Int64] = [:]
        for (tp, offset) in items {
            if let next = trackers[tp]?.complete(offset) { advances[tp] = next }
        }
        return advances
    }

    /// `complete` for the messages' offsets: one tracker access per run of one partition (batches come in such runs).
    mutating func complete(offsetsOf messages: [KafkaMessage]) -> [TopicPartition: Int64] {
        var advances: [TopicPartition: Int64] = [:]
        forEachPartitionRun(messages) { tp, run in
            if let next = trackers[tp]?.complete(run.lazy.map(\.offset)) { advances[tp] = next }
        }
        return advances
    }

    /// librdkafka refused to store an offset. `_STATE` (librdkafka does not consider the partition assigned right now)
    /// changes nothing here: our assignment follows the rebalance callback only, and a revoke under way arrives there.
    /// Dropping the partition here instead desynchronised the two views (librdkafka kept fetching it and every message
    /// was filtered as not assigned, silently: the chaos soak's wedged sink). The offset is simply not stored; a later
    /// completion stores past it, or the next owner redelivers it. Returns whether the failure is a warning (true) or
    /// only a notice (false).
    func storeFailed(_ tp: TopicPartition, _ error: KafkaError) -> Bool {
        error.code != KafkaErrorCode.state
    }

    /// An offset reset of `tp` (records skipped): under `fail` an assigned partition is blocked, and librdkafka must
    /// pause it (returns true).
    mutating func offsetReset(_ tp: TopicPartition, policy: OffsetResetPolicy) -> Bool {
        guard policy == .fail, assignment.contains(tp) else { return false }
        blocked.insert(tp)
        return true
    }

    mutating func append(_ chunk: [KafkaMessage]) {
        guard !chunk.isEmpty else { return }
        chunks.append(chunk)
        buffered += chunk.count
    }

    mutating func take(_ max: Int) -> [KafkaMessage] {
        var out: [KafkaMessage] = []
        while out.count < max, chunkHead < chunks.count {
            let room = max - out.count
            if chunks[chunkHead].count <= room {
                if out.isEmpty { out = chunks[chunkHead] } else { out.append(contentsOf: chunks[chunkHead]) }
                chunks[chunkHead] = []
                chunkHead += 1
            } else {
                out.append(contentsOf: chunks[chunkHead].prefix(room))
                chunks[chunkHead].removeFirst(room)
            }
        }
        if chunkHead == chunks.count {
            chunks.removeAll(keepingCapacity: true)
            chunkHead = 0
        } else if chunkHead > 64 {
            chunks.removeFirst(chunkHead)
            chunkHead = 0
        }
        buffered -= out.count
        // Messages arrive in runs per partition: one dictionary access per run, trackers mutated in place.
        forEachPartitionRun(out) { tp, run in trackers[tp, default: OffsetTracker()].handOut(run.lazy.map(\.offset)) }
        return out
    }

    /// Records the next offset per partition; messages come in runs per partition, so one write per run.
    mutating func noteFetched(_ messages: [KafkaMessage]) {
        forEachPartitionRun(messages) { tp, run in fetched[tp] = run[run.endIndex - 1].offset + 1 }
    }

    /// A poll round found librdkafka's queue near its limit (`PrefetchLimit`): its fetch may stop as after
    /// backpressure, so the next empty poll wakes it the same way.
    mutating func prefetchQueueNearLimit() {
        guard !stopRequested else { return }
        fetchMayStall = true
        fetchWakeCause = .queueLimit
    }

    /// Backpressure: the poll thread stops polling, librdkafka's queue fills.
    mutating func pollingStoppedForBackpressure() {
        fetchMayStall = true
        fetchWakeCause = .backpressure
    }

    /// Once armed (backpressure, or a queue near its limit) and a poll found librdkafka's queue empty: the partitions
    /// to seek to the next offset this consumer expects, so that librdkafka fetches again at once instead of up to a
    /// second later.
    ///
    /// While the application is behind, the poll thread stops polling and librdkafka's prefetch queue fills to
    /// `queued.max.messages.kbytes`. librdkafka 2.0.2 then takes its partitions out of the fetch and its broker thread
    /// sleeps until something wakes it, at the latest after a second (2.4 made that pause configurable as
    /// `fetch.queue.backoff.ms`). A consumer that drains the queue faster than that waits with nothing to do: `fleet
    /// bench worker` on a fast machine, with notifications of ~14 KB, 20 MB of queue lasted ~0.45 s and the worker
    /// then idled ~0.4 s of every cycle. A seek is one of the few things that wakes the broker thread; seeking to the
    /// offset after the last message polled drops nothing (the queue is empty: at most a fetch in flight is fetched
    /// again) and hands out nothing twice (librdkafka discards messages fetched before the seek).
    ///
    /// Only partitions with messages behind the last one polled (the high watermark of their last fetch, from
    /// `highWatermark`) are sought, blocked ones never; armed again by the next backpressure or full queue.
    mutating func stalledFetchPositions(highWatermark: (TopicPartition) -> Int64?) -> [TopicPartition: Int64] {
        guard fetchMayStall, !stopRequested, !handleGone else { return [:] }
        fetchMayStall = false
        var positions: [TopicPartition: Int64] = [:]
        for tp in assignment where !blocked.contains(tp) {
            guard let next = fetched[tp], let high = highWatermark(tp), high > next else { continue }
            positions[tp] = next
        }
        if !positions.isEmpty { fetchWakes += 1 }
        return positions
    }

    /// Messages waiting in the buffer per partition: how many, and the first offset.
    func bufferedPerPartition() -> [TopicPartition: (count: Int, first: Int64)] {
        var out: [TopicPartition: (count: Int, first: Int64)] = [:]
        for chunk in chunks[chunkHead...] {
            for m in chunk {
                let tp = m.topicPartition
                if let e = out[tp] { out[tp] = (e.count + 1, e.first) } else { out[tp] = (1, m.offset) }
            }
        }
        return out
    }

    mutating func drop(_ partitions: Set<TopicPartition>) {
        for tp in partitions { trackers.removeValue(forKey: tp); fetched.removeValue(forKey: tp) }
        blocked.subtract(partitions)
        if buffered > 0 {
            let kept = chunks[chunkHead...].map { $0.filter { !partitions.contains($0.topicPartition) } }
            chunks = kept.filter { !$0.isEmpty }
            chunkHead = 0
            buffered = chunks.reduce(0) { $0 + $1.count }
        }
    }
}

/// What armed a fetch wake: the consumer's own backpressure, or a poll round that found librdkafka's queue near its
/// limit (`PrefetchLimit`).
enum FetchWakeCause: String, Sendable {
    case backpressure
    case queueLimit = "queue_limit"
}

/// Calls `body` once per run of consecutive messages of one partition (fetched and handed-out batches come in such
/// runs), with the partition and the run.
private func forEachPartitionRun(_ messages: [KafkaMessage], _ body: (TopicPartition, ArraySlice<KafkaMessage>) -> Void) {
    var i = messages.startIndex
    while i < messages.endIndex {
        let tp = messages[i].topicPartition
        var j = i + 1
        while j < messages.endIndex, messages[j].partition == tp.partition, messages[j].topic == tp.topic { j += 1 }
        body(tp, messages[i..<j])
        i = j
    }
}
