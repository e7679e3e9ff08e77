import Foundation
import Logging
import Metrics
import Synchronization

/// A partition this member owns that has messages waiting (high watermark above its position) and yet has delivered
/// nothing for longer than the stall timeout, while the application was ready to take more (the consumer's buffer was
/// not full and the partition was not paused by us). Or one whose leader has not answered a watermark query for as long.
///
/// librdkafka retries and reconnects on its own, so such a stall should not last; when it does (seen on the embedded
/// cluster after broker restarts: a connection the broker no longer serves), lag grows while the process looks idle
/// and ready. The watch makes it loud: an error log `"event":"consumer_stalled"`, `fleet_consumer_stalls_total`,
/// `fleet_consumer_stalled_partitions`, a `/readyz` line, not ready, and, past `2 x` the timeout, not live (`/healthz`
/// 503), so that an orchestrator restarts the process: a restarted consumer has new connections and resumes from its
/// committed offsets, nothing lost.
public struct ConsumerStall: Sendable, Hashable, CustomStringConvertible {
    public var group: String
    public var topic: String
    public var partition: Int32
    /// Next offset this member would deliver (nil: nothing delivered yet and no committed offset known).
    public var position: Int64?
    /// The partition's high watermark, when the leader answered.
    public var highWatermark: Int64?
    /// Seconds without a delivered message when the stall was declared.
    public var seconds: Int
    /// Why: messages waiting but none delivered, or the leader not answering.
    public var reason: String

    public var description: String {
        "\(topic)[\(partition)] group \(group): no message for \(seconds) s at offset \(position.map(String.init) ?? "unknown")"
            + (highWatermark.map { ", high watermark \($0)" } ?? "") + " (\(reason))"
    }
}

/// Every stall currently open in this process (all consumers), for `/readyz`, liveness and tests.
public enum ConsumerStalls {
    private static let open = Mutex<[String: (stall: ConsumerStall, since: ContinuousClock.Instant, timeout: Duration)]>([:])
    static let logger = Logger(label: "fleet.kafka.stall")

    private static func key(_ s: ConsumerStall) -> String { "\(s.group)\u{0}\(s.topic)\u{0}\(s.partition)" }

    static func report(_ stall: ConsumerStall, timeout: Duration) {
        let isNew = open.withLock { o -> Bool in
            let k = key(stall)
            let isNew = o[k] == nil
            o[k] = (stall, o[k]?.since ?? .now, timeout)
            return isNew
        }
        guard isNew else { return }
        Counter(label: "fleet_consumer_stalls_total", dimensions: [("topic", stall.topic), ("partition", String(stall.partition))]).increment()
        updateGauge()
        logger.error("consumer_stalled: partition has messages waiting but delivers none; lag grows", metadata: [
            "event": "consumer_stalled", "group": "\(stall.group)", "topic": "\(stall.topic)",
            "partition": "\(stall.partition)", "position": "\(stall.position.map(String.init) ?? "unknown")",
            "high_watermark": "\(stall.highWatermark.map(String.init) ?? "unknown")",
            "seconds": "\(stall.seconds)", "reason": "\(stall.reason)",
        ])
    }

    static func clear(group: String, topic: String, partition: Int32, recovered: Bool) {
        let k = "\(group)\u{0}\(topic)\u{0}\(partition)"
        guard let was = open.withLock({ $0.removeValue(forKey: k) }) else { return }
        updateGauge()
        if recovered {
            logger.notice("consumer_stall_recovered", metadata: [
                "event": "consumer_stall_recovered", "group": "\(group)", "topic": "\(topic)", "partition": "\(partition)",
                "stalled_seconds": "\(Int((ContinuousClock.now - was.since).components.seconds) + was.stall.seconds)",
            ])
        }
    }

    private static func updateGauge() {
        Gauge(label: "fleet_consumer_stalled_partitions").record(open.withLock { $0.count })
    }

    /// Stalls open now (oldest first).
    public static var all: [ConsumerStall] {
        open.withLock { o in o.values.sorted { $0.since < $1.since }.map(\.stall) }
    }

    /// One line per open stall, for `/readyz`.
    public static var report: [String] { all.map { "stalled: \($0)" } }

    /// False once a stall has lasted longer than twice its timeout past being declared: for `/healthz`, so that an
    /// orchestrator restarts a process whose consumer does not recover by itself.
    public static var isLive: Bool {
        let now = ContinuousClock.now
        return open.withLock { o in !o.values.contains { now - $0.since > $0.timeout * 2 } }
    }

    /// For tests.
    public static func reset() { open.withLock { $0 = [:] }; updateGauge() }
}

/// The per-consumer watch: samples the delivered positions every few seconds and, for partitions without progress
/// past the timeout, asks the leader for the high watermark (one blocking query on the watch's own thread).
final class StallWatch: Sendable {
    struct Snapshot: Sendable {
        var partitions: Set<TopicPartition>
        var delivered: [TopicPartition: Int64]
        var backpressured: Bool
        /// Set when the application has not asked for messages for the whole timeout while some wait in the buffer:
        /// per partition, how many and the first offset (empty otherwise).
        var untaken: [TopicPartition: (count: Int, first: Int64)] = [:]
    }

    private struct Track {
        var position: Int64?
        var since: ContinuousClock.Instant
        var stalled = false
    }

    let timeout: Duration
    private let group: String
    private let tracks = Mutex<[TopicPartition: Track]>([:])

    init(timeout: Duration, group: String) {
        self.timeout = timeout
        self.group = group
    }

    /// One sampling round. `query` returns (low, high) watermarks or an error text; `committed` the committed offset.
    func check(_ snap: Snapshot, now: ContinuousClock.Instant = .now,
               query: (TopicPartition) -> Result<(Int64, Int64), KafkaError>,
               committed: (TopicPartition) -> Int64?) {
        // Forget partitions no longer owned (their stalls end without "recovered": another member owns them now).
        let gone = tracks.withLock { t -> [TopicPartition] in
            let gone = t.keys.filter { !snap.partitions.contains($0) }
            gone.forEach { t.removeValue(forKey: $0) }
            return gone
        }
        for tp in gone { ConsumerStalls.clear(group: group, topic: tp.topic, partition: tp.partition, recovered: false) }
        // The application itself not taking what is buffered for it (a writer stuck on its database, say).
        for (tp, waiting) in snap.untaken where snap.partitions.contains(tp) {
            let idle = tracks.withLock { $0[tp].map { now - $0.since } } ?? timeout
            mark(tp, ConsumerStall(group: group, topic: tp.topic, partition: tp.partition, position: waiting.first,
                                   highWatermark: nil, seconds: Int(max(idle, timeout).components.seconds),
                                   reason: "the application took none of \(waiting.count) buffered message(s)"),
                 tracking: Track(position: snap.delivered[tp], since: now))
        }
        var suspects: [(TopicPartition, Int64?, Duration)] = []
        tracks.withLock { t in
            for tp in snap.partitions {
                let position = snap.delivered[tp]
                guard var track = t[tp] else { t[tp] = Track(position: position, since: now); continue }
                if snap.untaken[tp] != nil {
                    // Reported above; stays open until messages flow and the partition is caught up again.
                } else if position != track.position || snap.backpressured {
                    // Progress, or the application is the slow side: not a fetch stall.
                    if track.stalled { ConsumerStalls.clear(group: group, topic: tp.topic, partition: tp.partition, recovered: true) }
                    track = Track(position: position, since: now)
                } else if now - track.since >= timeout {
                    suspects.append((tp, position, now - track.since))
                }
                t[tp] = track
            }
        }
        for (tp, delivered, idle) in suspects {
            let position = delivered ?? committed(tp)
            let seconds = Int(idle.components.seconds)
            switch query(tp) {
            case .success(let (_, high)):
                if let position, position >= high {
                    // Caught up: idle, not stalled.
                    let wasStalled = tracks.withLock { t -> Bool in
                        let was = t[tp]?.stalled ?? false
                        t[tp] = Track(position: delivered, since: now)
                        return was
                    }
                    if wasStalled { ConsumerStalls.clear(group: group, topic: tp.topic, partition: tp.partition, recovered: true) }
                    continue
                }
                mark(tp, ConsumerStall(group: group, topic: tp.topic, partition: tp.partition, position: position,
                                       highWatermark: high, seconds: seconds, reason: "messages waiting, none delivered"))
            case .failure(let error):
                mark(tp, ConsumerStall(group: group, topic: tp.topic, partition: tp.partition, position: position,
                                       highWatermark: nil, seconds: seconds, reason: "leader not answering: \(error)"))
            }
        }
    }

    /// Reports a stall and marks its partition stalled (`hasStall`, so `isReady` says so too), tracking the partition
    /// from `tracking` if this round is the first to see it: a stall seen in a partition's first round (messages
    /// buffered and untaken before any round ran) must not be reported while the consumer still reads as ready.
    private func mark(_ tp: TopicPartition, _ stall: ConsumerStall, tracking first: Track? = nil) {
        tracks.withLock { t in
            guard var track = t[tp] ?? first else { return }
            track.stalled = true
            t[tp] = track
        }
        ConsumerStalls.report(stall, timeout: timeout)
    }

    /// True while one of this consumer's partitions is stalled.
    var hasStall: Bool { tracks.withLock { $0.values.contains { $0.stalled } } }

    /// Ends every open stall of this consumer (on close).
    func stop() {
        let all = tracks.withLock { t -> [TopicPartition] in defer { t = [:] }; return Array(t.keys) }
        for tp in all { ConsumerStalls.clear(group: group, topic: tp.topic, partition: tp.partition, recovered: false) }
    }
}

extension ConsumerCore {
    /// Low and high watermark from the partition's leader (a ListOffsets round trip, blocking up to `timeoutMs`).
    func queryWatermarks(_ tp: TopicPartition, timeoutMs: Int32) -> Result<(Int64, Int64), KafkaError> {
        handle.queryWatermarks(tp, timeoutMilliseconds: timeoutMs)
    }

    /// The group's committed offset for the partition, nil when none or on error.
    func committedOffset(_ tp: TopicPartition, timeoutMs: Int32) -> Int64? {
        handle.committedOffset(tp, timeoutMilliseconds: timeoutMs)
    }
}

extension ConsumerCore {
    /// Tests only: pauses fetching of a partition inside librdkafka without telling this consumer, which is what a
    /// wedged fetcher looks like from the application (messages waiting, none delivered, nothing paused by us).
    func pauseFetchBehindTheConsumersBackForTesting(_ tp: TopicPartition, resume: Bool = false) {
        handle.setPausedForTesting(tp, paused: !resume)
    }
}

extension ConsumerCore {
    /// Tests only: replaces librdkafka's assignment without going through the rebalance callback (nil: unassign all),
    /// so that librdkafka refuses to store offsets (`__STATE`) while this consumer still owns the partition.
    func assignBehindTheConsumersBackForTesting(_ tp: TopicPartition?, offset: Int64 = 0) {
        handle.assignForTesting(tp, offset: offset)
    }
}
