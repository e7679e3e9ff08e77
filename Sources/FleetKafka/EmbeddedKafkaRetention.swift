import CRdKafka
import Foundation
import Logging

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

    private let state = ConditionLock<(stop: Bool, partitions: [TopicPartition: PartitionState])>((false, [:]))
    private let done = ConditionLock<Bool>(false)
    private let logger: Logger
    private let warnFraction: Double

    /// Starts watching `topics` (with their partition counts) on `bootstrapServers`.
    public init(bootstrapServers: String, topics: [String: Int], warnFraction: Double = 0.8,
                logger: Logger = Logger(label: "fleet.embedded-kafka.retention")) throws(KafkaError) {
        self.logger = logger
        self.warnFraction = warnFraction
        let conf = try makeConf([
            ("bootstrap.servers", bootstrapServers), ("client.id", "fleet-retention-watch"),
            ("group.id", "fleet-retention-watch-\(UUID().uuidString)"), ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"), ("enable.partition.eof", "false"),
            ("auto.offset.reset", "earliest"), ("queued.max.messages.kbytes", "4096"),
        ])
        let rk = try makeHandle(RD_KAFKA_CONSUMER, conf: conf)
        rd_kafka_poll_set_consumer(rk)
        let list = rd_kafka_topic_partition_list_new(Int32(topics.values.reduce(0, +)))
        for (topic, count) in topics.sorted(by: { $0.key < $1.key }) {
            for p in 0..<count {
                rd_kafka_topic_partition_list_add(list, topic, Int32(p))?.pointee.offset = Int64(RD_KAFKA_OFFSET_BEGINNING)
            }
        }
        let err = rd_kafka_assign(rk, list)
        rd_kafka_topic_partition_list_destroy(list)
        if err != RD_KAFKA_RESP_ERR_NO_ERROR {
            rd_kafka_destroy(rk)
            throw KafkaError(err, message: "retention watch: assign: \(String(cString: rd_kafka_err2str(err)))")
        }
        let handle = UInt(bitPattern: rk)
        startThread(name: "fleet-retention-watch") { [self] in self.loop(OpaquePointer(bitPattern: handle)!) }
    }

    /// What the watch knows now, per partition.
    public var partitions: [TopicPartition: PartitionState] { state.withLock { $0.partitions } }

    /// Stops the watch and waits for its thread.
    public func stop() {
        state.withLock { $0.stop = true }
        _ = done.wait(until: { $0 }, timeoutSeconds: 10) { v, _ in v }
    }

    private func loop(_ rk: OpaquePointer) {
        var lastCheck = ContinuousClock.now
        while !state.withLock({ $0.stop }) {
            if let rkm = rd_kafka_consumer_poll(rk, 200) {
                let m = rkm.pointee
                if m.err == RD_KAFKA_RESP_ERR_NO_ERROR, let rkt = m.rkt {
                    let tp = TopicPartition(topic: String(cString: rd_kafka_topic_name(rkt)), partition: m.partition)
                    let bytes = Int64(m.len + m.key_len)
                    state.withLock { $0.partitions[tp, default: PartitionState()].retainedBytes += bytes }
                }
                rd_kafka_message_destroy(rkm)
            }
            if ContinuousClock.now - lastCheck >= .seconds(1) {
                lastCheck = .now
                check(rk)
            }
        }
        _ = rd_kafka_consumer_close(rk)
        rd_kafka_destroy(rk)
        done.withLock { $0 = true }
        done.broadcast()
    }

    private func check(_ rk: OpaquePointer) {
        let tps = state.withLock { Array($0.partitions.keys) }
        for tp in tps {
            var low: Int64 = -1, high: Int64 = -1
            guard rd_kafka_get_watermark_offsets(rk, tp.topic, tp.partition, &low, &high) == RD_KAFKA_RESP_ERR_NO_ERROR,
                  low >= 0 else { continue }
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
