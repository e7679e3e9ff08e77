import Foundation
import Logging
import Metrics

/// Owns the consumer handle and its poll thread. State changes are `ConsumerState`'s methods; this class runs the poll
/// loop, serves the application's waiters and performs what the state asks of librdkafka (`RDKafkaConsumerHandle`).
final class ConsumerCore: RDKafkaClientOwner {
    /// librdkafka handles are thread-safe. Destroyed only by the poll thread after it set `handleGone` under the
    /// state lock; every other use happens with the lock held and `handleGone == false` (or on the poll thread).
    let handle: RDKafkaConsumerHandle
    private let state = ConditionLock(ConsumerState())
    private let closeDone = ConditionLock<Bool>(false)
    private let maxBuffered: Int
    private let prefetchLimit: PrefetchLimit
    let logger: Logger
    let groupId: String
    let assignmentStream: AsyncStream<AssignmentChange>
    private let assignmentContinuation: AsyncStream<AssignmentChange>.Continuation
    private let handler = ConditionLock<(@Sendable (AssignmentChange) -> Void)?>(nil)
    let offsetResetPolicy: OffsetResetPolicy
    /// Resets parsed from librdkafka's log callback (any thread), applied by the poll thread. A lock of its own: the
    /// callback may run on librdkafka's main thread while this consumer's state lock waits on it (commit).
    private let pendingResets = ConditionLock<[OffsetReset]>([])
    private let watchDone = ConditionLock<Bool>(false)
    /// Nil when `stallTimeoutSeconds` is 0.
    let stallWatch: StallWatch?

    init(configuration: KafkaConfiguration, groupId: String, topics: [String]) throws(KafkaError) {
        guard !topics.isEmpty else { throw .invalidArgument("a consumer needs at least one topic") }
        guard !groupId.isEmpty else { throw .invalidArgument("a consumer needs a group id") }
        self.groupId = groupId
        self.maxBuffered = max(1, configuration.maxBufferedMessages)
        self.offsetResetPolicy = configuration.offsetResetPolicy
        self.stallWatch = configuration.stallTimeoutSeconds > 0
            ? StallWatch(timeout: .seconds(configuration.stallTimeoutSeconds), group: groupId) : nil
        var logger = Logger(label: "fleet.kafka.consumer")
        logger[metadataKey: "group"] = "\(groupId)"
        self.logger = logger
        (assignmentStream, assignmentContinuation) = AsyncStream.makeStream(of: AssignmentChange.self)
        let properties = configuration.consumerProperties(groupId: groupId)
        self.prefetchLimit = PrefetchLimit(properties: properties)
        let handle = try RDKafkaConsumerHandle(properties: properties)
        self.handle = handle
        try handle.subscribe(topics, owner: self)
        let core = self
        startThread(name: "fleet-kafka-consumer-poll") { core.pollLoop(handle) }
        if stallWatch != nil { startThread(name: "fleet-kafka-consumer-stall-watch") { core.stallWatchLoop() } }
    }

    func setHandler(_ h: (@Sendable (AssignmentChange) -> Void)?) { handler.withLock { $0 = h } }

    /// The stall watch's thread (see `ConsumerStallWatch.swift`): samples fetched positions under the state lock, then
    /// queries watermarks without it. Exits when a stop is requested; the poll thread waits for it before destroying
    /// the handle.
    fileprivate func stallWatchLoop() {
        defer { watchDone.withLock { $0 = true }; watchDone.broadcast() }
        guard let watch = stallWatch else { return }
        let interval = min(5.0, max(0.2, Double(watch.timeout.components.seconds) / 4))
        let queryMs = Int32(min(5_000, max(500, Int(watch.timeout.components.seconds) * 250)))
        while true {
            let snap = state.wait(until: { $0.stopRequested }, timeoutSeconds: interval) { s, _ -> StallWatch.Snapshot? in
                s.stopRequested || s.handleGone ? nil : StallWatch.Snapshot(
                    partitions: s.assignment.subtracting(s.blocked), delivered: s.fetched,
                    backpressured: s.buffered >= maxBuffered || s.holding,
                    untaken: !s.holding && s.buffered > 0 && ContinuousClock.now - s.lastAsk >= watch.timeout
                        ? s.bufferedPerPartition() : [:])
            }
            guard let snap else { break }
            watch.check(snap, query: { queryWatermarks($0, timeoutMs: queryMs) },
                        committed: { committedOffset($0, timeoutMs: queryMs) })
        }
        watch.stop()
    }

    // MARK: poll thread

    var stopRequestedOrGone: Bool { state.withLock { $0.stopRequested || $0.handleGone } }

    private func pollLoop(_ handle: RDKafkaConsumerHandle) {
        var batch: [KafkaMessage] = []
        batch.reserveCapacity(1000)
        while true {
            let (stop, full, mayStall) = state.withLock { s in
                let full = s.buffered >= maxBuffered
                if full { s.pollingStoppedForBackpressure() }
                return (s.stopRequested, full, s.fetchMayStall)
            }
            if stop { break }
            if full {
                // Backpressure: let the application catch up; messages stay in librdkafka's bounded fetch queue.
                state.wait(until: { $0.stopRequested || $0.buffered < self.maxBuffered }, timeoutSeconds: 0.1) { s, _ in
                    expireWaiters(&s)
                }.forEach { $0.continuation.resume(returning: .success([])) }
                continue
            }
            // After backpressure, an empty queue is noticed within 5 ms (`wakeStalledFetch`).
            let round = handle.poll(timeoutMilliseconds: mayStall ? 5 : 100, into: &batch) { error in
                if error.isFatal {
                    setFatal(error)
                } else {
                    logger.warning("consumer error", metadata: ["error": "\(error.name)", "detail": "\(error.message)"])
                }
            }
            applyPendingResets(handle)
            if batch.isEmpty && mayStall { wakeStalledFetch(handle) }
            var ready: [(BatchWaiter, Result<[KafkaMessage], KafkaError>)] = []
            let nearLimit = prefetchLimit.nearlyReached(
                drainedMessages: round.messages, drainedBytes: round.payloadBytes, queuedAfter: round.queuedAfter)
            state.withLock { s in
                if nearLimit { s.prefetchQueueNearLimit() }
                if !batch.isEmpty {
                    s.accept(batch)
                    batch = []
                    batch.reserveCapacity(1000)
                }
                while s.buffered > 0, !s.waiters.isEmpty {
                    let w = s.waiters.removeFirst()
                    ready.append((w, .success(s.take(w.maxMessages))))
                }
                if let f = s.fatal {
                    ready += s.waiters.map { ($0, .failure(f)) }
                    s.waiters = []
                }
                ready += expireWaiters(&s).map { ($0, .success([])) }
            }
            for (w, r) in ready { w.continuation.resume(returning: r) }
        }
        if let error = handle.close() {
            logger.warning("consumer close", metadata: ["error": "\(error.name)"])
        }
        let waiters = state.withLock { s -> [BatchWaiter] in
            s.handleGone = true
            s.assignment = []
            s.trackers = [:]
            defer { s.waiters = [] }
            return s.waiters
        }
        waiters.forEach { $0.continuation.resume(returning: .success([])) }
        // The stall watch queries through the handle: it stops on `stopRequested` within one query timeout.
        if stallWatch != nil { watchDone.wait(until: { $0 }, timeoutSeconds: nil) { _, _ in } }
        handle.destroy()
        assignmentContinuation.finish()
        closeDone.withLock { $0 = true }
        closeDone.broadcast()
    }

    /// Poll thread, after a poll found librdkafka's queue empty following backpressure: seeks the partitions that
    /// have more to fetch to where they stand, which wakes librdkafka's fetch (`ConsumerState.stalledFetchPositions`).
    private func wakeStalledFetch(_ handle: RDKafkaConsumerHandle) {
        // librdkafka is asked for the watermarks outside the state lock (its callbacks take that lock). Nothing else
        // polls or seeks meanwhile: rebalances are served by this thread's polls.
        let candidates = state.withLock { s in s.fetchMayStall ? s.assignment : [] }
        var highs: [TopicPartition: Int64] = [:]
        for tp in candidates { if let w = handle.cachedWatermarks(tp) { highs[tp] = w.high } }
        let (positions, cause) = state.withLock { s in (s.stalledFetchPositions { highs[$0] }, s.fetchWakeCause) }
        guard !positions.isEmpty else { return }
        let refused = handle.seek(positions)
        Counter(label: "fleet_consumer_fetch_wakes_total", dimensions: [("group", groupId), ("cause", cause.rawValue)])
            .increment()
        logger.debug("fetch woken", metadata: [
            "cause": "\(cause.rawValue)", "partitions": "\(positions.count)", "refused": "\(refused.count)",
        ])
    }

    var fetchWakes: Int { state.withLock { $0.fetchWakes } }

    private func expireWaiters(_ s: inout ConsumerState) -> [BatchWaiter] {
        guard !s.waiters.isEmpty else { return [] }
        let now = ContinuousClock.now
        var expired: [BatchWaiter] = []
        s.waiters.removeAll { w in
            if w.deadline <= now || s.stopRequested { expired.append(w); return true }
            return false
        }
        return expired
    }

    func setFatal(_ error: KafkaError) {
        logger.error("consumer fatal error", metadata: ["error": "\(error)"])
        state.withLock { s in if s.fatal == nil { s.fatal = error } }
    }

    // MARK: librdkafka callbacks (RDKafkaClientOwner)

    func clientError(_ error: KafkaError) {
        if error.isFatal {
            setFatal(error)
        } else {
            logger.debug("consumer error event", metadata: ["code": "\(error.code)", "reason": "\(error.message)"])
        }
    }

    /// Runs on the poll thread inside the poll or the close.
    func rebalance(_ event: RebalanceEvent) -> RebalanceAction {
        if case .failed(let name) = event.kind { logger.warning("rebalance error", metadata: ["error": "\(name)"]) }
        let (action, change) = state.withLock { $0.rebalance(event) }
        logger.info("assignment changed", metadata: ["change": "\(change)"])
        assignmentContinuation.yield(change)
        handler.withLock { $0 }?(change)
        return action
    }

    func rebalanceActionFailed(_ error: KafkaError) {
        logger.error("assign failed", metadata: ["error": "\(error)"])
    }

    /// Called from librdkafka's log callback (any thread): only queues the reset for the poll thread.
    func offsetResetLogged(_ reset: OffsetReset) {
        pendingResets.withLock { $0.append(reset) }
    }

    // MARK: application side

    func nextBatch(maxMessages: Int, timeout: Duration) async throws(KafkaError) -> [KafkaMessage] {
        let max = Swift.max(1, maxMessages)
        enum Immediate { case value([KafkaMessage]), fail(KafkaError), wait }
        let immediate: Immediate = state.withLock { s in
            s.lastAsk = .now
            if let f = s.fatal { return .fail(f) }
            if s.buffered > 0 { return .value(s.take(max)) }
            if s.stopRequested || timeout <= .zero { return .value([]) }
            return .wait
        }
        switch immediate {
        case .value(let v): state.broadcast(); return v
        case .fail(let e): throw e
        case .wait: break
        }
        let id = state.withLock { s -> UInt64 in s.nextWaiterId += 1; return s.nextWaiterId }
        let deadline = ContinuousClock.now + timeout
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<Result<[KafkaMessage], KafkaError>, Never>) in
                let now: Result<[KafkaMessage], KafkaError>? = state.withLock { s in
                    if let f = s.fatal { return .failure(f) }
                    if s.buffered > 0 { return .success(s.take(max)) }
                    if s.stopRequested || Task.isCancelled { return .success([]) }
                    s.waiters.append(BatchWaiter(id: id, maxMessages: max, deadline: deadline, continuation: c))
                    return nil
                }
                if let now { c.resume(returning: now) }
            }
        } onCancel: {
            let w = state.withLock { s -> BatchWaiter? in
                guard let i = s.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                return s.waiters.remove(at: i)
            }
            w?.continuation.resume(returning: .success([]))
        }
        state.broadcast()  // the poll thread may be waiting for buffer space
        return try result.get()
    }

    /// Synchronously commits the stored offsets (blocking: call it from a dedicated thread). Nothing stored since the
    /// last commit counts as success.
    func commitStoredBlocking() -> Bool {
        state.withLock { s -> Bool in
            guard !s.handleGone else { return false }
            guard let error = handle.commitStored() else { return true }
            logger.warning("offset commit failed", metadata: ["error": "\(error.name)"])
            return false
        }
    }

    /// Marks messages finished; stores offsets for every partition whose contiguous finished prefix advanced.
    func markProcessed(_ items: [(TopicPartition, Int64)]) {
        state.withLock { s in
            guard !s.handleGone else { return }
            store(s.complete(items), &s)
        }
    }

    /// `markProcessed` for whole messages (a batch as handed out), without building a list of pairs first.
    func markProcessed(messages: [KafkaMessage]) {
        state.withLock { s in
            guard !s.handleGone else { return }
            store(s.complete(offsetsOf: messages), &s)
        }
    }

    /// Under the state lock: stores the advanced offsets in librdkafka.
    private func store(_ advances: [TopicPartition: Int64], _ s: inout ConsumerState) {
        guard !advances.isEmpty else { return }
        // Stored under the lock so concurrent completions can never store an older offset after a newer one.
        let (failures, overall) = handle.storeOffsets(advances)
        for (tp, error) in failures {
            if s.storeFailed(tp, error) {
                logger.warning("offsets_store failed", metadata: ["partition": "\(tp)", "error": "\(error.name)"])
            } else {
                logger.notice("offsets_store refused: partition not assigned in librdkafka right now; offset not stored", metadata: [
                    "partition": "\(tp)", "offset": "\(advances[tp] ?? -1)",
                ])
            }
        }
        if let overall, overall.code != KafkaErrorCode.state {
            logger.debug("offsets_store", metadata: ["error": "\(overall.name)"])
        }
    }

    var assignment: Set<TopicPartition> { state.withLock { $0.assignment } }
    func setHolding(_ on: Bool) {
        state.withLock { s in
            s.holding = on
            s.lastAsk = .now
        }
    }

    var isReady: Bool {
        state.withLock { $0.joined && !$0.stopRequested && $0.fatal == nil && !$0.handleGone && $0.blocked.isEmpty }
            && !(stallWatch?.hasStall ?? false)
    }
    var blockedPartitions: Set<TopicPartition> { state.withLock { $0.blocked } }

    /// Poll thread, after each poll and before fetched messages are buffered: a reset logged before those messages
    /// were fetched is always seen here first, so under `fail` nothing past the gap is ever handed out.
    private func applyPendingResets(_ handle: RDKafkaConsumerHandle) {
        let resets = pendingResets.withLock { p -> [OffsetReset] in defer { p = [] }; return p }
        for var reset in resets {
            if reset.toOffset == nil, let from = reset.fromOffset, let (low, high) = handle.cachedWatermarks(reset.topicPartition) {
                let to = reset.toLogical == "END" ? high : low
                if to >= 0, to > from { reset.skippedEstimate = to - from }
            }
            let tp = reset.topicPartition
            reset.blocked = state.withLock { $0.offsetReset(tp, policy: offsetResetPolicy) }
            if reset.blocked, let error = handle.pause(tp) {
                logger.error("pause after offset reset failed", metadata: ["partition": "\(tp)", "error": "\(error.name)"])
            }
            OffsetResets.report(reset, group: groupId)
        }
    }
    var outstanding: [TopicPartition: Int] { state.withLock { $0.trackers.mapValues(\.outstanding) } }
    var buffered: Int { state.withLock { $0.buffered } }

    func requestStop() {
        let waiters = state.withLock { s -> [BatchWaiter] in
            s.stopRequested = true
            defer { s.waiters = [] }
            return s.waiters
        }
        state.broadcast()
        waiters.forEach { $0.continuation.resume(returning: .success([])) }
    }

    /// Returns true when the close finished within `timeout`.
    func close(timeout: Duration) async -> Bool {
        requestStop()
        if closeDone.withLock({ $0 }) { return true }
        let shot = OneShot<Bool>()
        startThread(name: "fleet-kafka-consumer-close-wait") { [closeDone] in
            closeDone.wait(until: { $0 }, timeoutSeconds: nil) { _, _ in }
            shot.fulfil(true)
        }
        let ok = await shot.wait(timeout: timeout, onTimeout: false)
        if !ok {
            logger.error("consumer close did not finish within the deadline; abandoning the handle (librdkafka #4187)")
        }
        return ok
    }

    func closeBlocking(timeoutSeconds: Double) -> Bool {
        requestStop()
        return closeDone.wait(until: { $0 }, timeoutSeconds: timeoutSeconds) { v, _ in v }
    }
}
