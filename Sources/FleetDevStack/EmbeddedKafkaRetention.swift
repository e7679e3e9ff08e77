import FleetKafka
import Foundation
import Logging
import Synchronization

/// Watches the partitions of an embedded (mock) cluster for the one limit that loses data: librdkafka 2.0.2's mock keeps
/// at most `partitionBytes` (5 MiB, hard-coded as `mpart->max_size`, no setting changes it) and 100,000 message sets per
/// partition, and deletes the oldest records beyond that whether or not anyone has read them.
///
/// A reader assigned to every partition (no group, no commits) sums the bytes each partition holds; the watch warns once
/// per partition when it passes `warnFraction` of the limit and logs an error whenever a partition's low watermark moves
/// (records deleted). For `fleet dev-kafka`, `fleet demo` and the chaos soak; the remedy is more partitions
/// (`partitions(forBytes:)`). Production brokers retain by their operators' policy, and consumers make any reset loud
/// (`OffsetResetPolicy`).
public final class EmbeddedKafkaRetentionWatch: Sendable {
    /// The mock's per-partition byte limit.
    public static let partitionBytes = 5 * 1024 * 1024
    /// The mock's per-partition message-set limit.
    public static let partitionMessageSets = 100_000

    /// Partitions a topic needs to retain `bytes` with headroom (each partition filled to at most half the limit:
    /// keys do not hash perfectly evenly).
    public static func partitions(forBytes bytes: Int, minimum: Int = 1) -> Int {
        max(minimum, Int((Double(bytes) / (0.5 * Double(partitionBytes))).rounded(.up)))
    }

    public struct PartitionState: Sendable, Hashable {
        public var retainedBytes: Int64 = 0
        public var lowWatermark: Int64 = 0
        public var highWatermark: Int64 = 0
        public var warned = false
    }

    private let state = Mutex<(stop: Bool, partitions: [TopicPartition: PartitionState])>((false, [:]))
    private let done = DispatchSemaphore(value: 0)
    private let logger: Logger
    private let warnFraction: Double

    /// Starts watching `topics` (with their partition counts) on `bootstrapServers`.
    public init(bootstrapServers: String, topics: [String: Int], warnFraction: Double = 0.8,
                logger: Logger = Logger(label: "fleet.embedded-kafka.retention")) throws(KafkaError) {
        self.logger = logger
        self.warnFraction = warnFraction
        let all = topics.sorted(by: { $0.key < $1.key }).flatMap { topic, count in
            (0..<count).map { TopicPartition(topic: topic, partition: Int32($0)) }
        }
        let reader = try RDKafkaPartitionSizeReader(bootstrapServers: bootstrapServers, clientId: "fleet-retention-watch", partitions: all)
        let thread = Thread { [self] in self.loop(reader) }
        thread.name = "fleet-retention-watch"
        thread.start()
    }

    /// What the watch knows now, per partition.
    public var partitions: [TopicPartition: PartitionState] { state.withLock { $0.partitions } }

    /// Stops the watch and waits for its thread.
    public func stop() {
        state.withLock { $0.stop = true }
        if done.wait(timeout: .now() + 10) == .success { done.signal() }  // stays signalled for a second stop()
    }

    private func loop(_ reader: RDKafkaPartitionSizeReader) {
        var lastCheck = ContinuousClock.now
        while !state.withLock({ $0.stop }) {
            if let (tp, bytes) = reader.poll(timeoutMilliseconds: 200) {
                state.withLock { $0.partitions[tp, default: PartitionState()].retainedBytes += bytes }
            }
            if ContinuousClock.now - lastCheck >= .seconds(1) {
                lastCheck = .now
                check(reader)
            }
        }
        reader.close()
        done.signal()
    }

    private func check(_ reader: RDKafkaPartitionSizeReader) {
        let tps = state.withLock { Array($0.partitions.keys) }
        for tp in tps {
            guard let (low, high) = reader.watermarks(tp) else { continue }
            let (previousLow, bytes, warn) = state.withLock { s -> (Int64, Int64, Bool) in
                var p = s.partitions[tp, default: PartitionState()]
                let previous = p.lowWatermark
                // Judged before the deleted share is taken off: a partition that had to delete was at the limit.
                let near = Double(p.retainedBytes) >= warnFraction * Double(Self.partitionBytes)
                if low > previous, high > previous {
                    // Deleted records' bytes are not known: scale by the share of records still retained.
                    p.retainedBytes = p.retainedBytes * (high - low) / (high - previous)
                }
                p.lowWatermark = low
                p.highWatermark = high
                let warn = (near || low > previous) && !p.warned
                if warn { p.warned = true }
                s.partitions[tp] = p
                return (previous, p.retainedBytes, warn)
            }
            if warn {
                logger.warning("embedded cluster partition near the mock's retention limit: further writes delete its oldest records, read or not; use more partitions", metadata: [
                    "event": "embedded_retention_near", "partition": "\(tp)", "retained_bytes": "\(bytes)",
                    "limit_bytes": "\(Self.partitionBytes)",
                ])
            }
            if low > previousLow {
                logger.error("embedded cluster deleted records: the mock keeps about 5 MiB per partition; consumers behind these offsets lose them (see offset_reset)", metadata: [
                    "event": "embedded_retention_deleted", "partition": "\(tp)", "deleted_offsets": "\(previousLow)..<\(low)",
                    "limit_bytes": "\(Self.partitionBytes)",
                ])
            }
        }
    }
}
