import Foundation
import Logging
import Metrics
import Synchronization

/// What a consumer does when its position in a partition is no longer on the broker (retention deleted the records it
/// had not read yet, or the topic was truncated): `--offset-reset-policy`.
///
/// librdkafka resets such a position silently (one warning line) to `auto.offset.reset`; records between the old
/// position and the new one are never read. The fleet makes every such reset loud whatever the policy: an error log line
/// (`"event":"offset_reset"`, topic, partition, the offsets skipped), `fleet_consumer_offset_resets_total{topic,partition}`,
/// `fleet_consumer_offset_reset_skipped_messages_total{topic,partition}` and a line in `/readyz`.
public enum OffsetResetPolicy: String, Sendable, CaseIterable, CustomStringConvertible {
    /// Stop consuming the partition (paused, nothing past the gap handed out, no offset stored past it) and report not
    /// ready until an operator decides: restart with `earliest` or `latest` to accept the loss, or restore the data. A
    /// group without a committed offset (new group, new partition) still starts at `auto.offset.reset` (earliest).
    case fail
    /// Continue from the oldest record still on the broker (librdkafka `auto.offset.reset=earliest`).
    case earliest
    /// Continue from the end (librdkafka `auto.offset.reset=latest`; a new group starts at the end too).
    case latest

    public var description: String { rawValue }

    public static func parse(_ text: String) throws(KafkaError) -> OffsetResetPolicy {
        guard let p = OffsetResetPolicy(rawValue: text.lowercased()) else {
            throw .invalidArgument("offset reset policy '\(text)' is not one of fail, earliest, latest")
        }
        return p
    }
}

/// One reset of a consumer's position, as librdkafka reported it.
public struct OffsetReset: Sendable, Hashable, CustomStringConvertible {
    public var topic: String
    public var partition: Int32
    /// The position that was out of range (the next offset the consumer wanted), when librdkafka said it.
    public var fromOffset: Int64?
    /// Where librdkafka moved the position: an offset, or nil while it was still asking the broker (BEGINNING/END).
    public var toOffset: Int64?
    /// `BEGINNING` or `END` when `toOffset` is not known yet.
    public var toLogical: String?
    /// Messages skipped: `toOffset - fromOffset` when both are known and the reset moved forward.
    public var skippedEstimate: Int64?
    /// Under `fail`: the partition was paused and nothing past the gap is handed out.
    public var blocked: Bool
    public var detail: String

    public var topicPartition: TopicPartition { TopicPartition(topic: topic, partition: partition) }

    public var description: String {
        let from = fromOffset.map(String.init) ?? "?"
        let to = toOffset.map(String.init) ?? toLogical ?? "?"
        let skipped = skippedEstimate.map { ", \($0) message(s) skipped" } ?? ""
        return "\(topic)[\(partition)] offset \(from) out of range, reset to \(to)\(skipped)"
            + (blocked ? " (policy fail: partition paused)" : "")
    }

    /// Parses librdkafka 2.0.2's log line (facility `OFFSET`, level warning), logged only for resets caused by an error:
    /// `[thrd:main]: TOPIC [P]: offset reset (at offset 10, broker 1) to cached BEGINNING offset 416: fetch failed ...: Broker: Offset out of range`
    /// (or `... to BEGINNING: ...` / `to END: ...` / `to 123: ...`). Returns nil for any other line.
    public static func parseLibrdkafkaLog(_ line: String) -> OffsetReset? {
        guard let marker = line.range(of: "]: offset reset (at offset ") else { return nil }
        var head = line[..<marker.lowerBound]
        // librdkafka prefixes its thread: "[thrd:main]: TOPIC [P]: ...".
        if head.hasPrefix("[thrd:"), let end = head.range(of: "]: ") { head = head[end.upperBound...] }
        guard let open = head.range(of: " [", options: .backwards),
              let partition = Int32(head[open.upperBound...]) else { return nil }
        let topic = String(head[..<open.lowerBound])
        let rest = line[marker.upperBound...]
        guard let comma = rest.firstIndex(of: ",") else { return nil }
        // Only a real position skips records; "at offset BEGINNING/END" is a failed start-offset query (a new group),
        // which librdkafka also reports as an error message of its own.
        guard let fromOffset = Int64(rest[..<comma]) else { return nil }
        guard let toMarker = rest.range(of: ") to ") else { return nil }
        var target = rest[toMarker.upperBound...]
        let detail = target.range(of: ": ").map { String(target[$0.upperBound...]) } ?? ""
        if let colon = target.range(of: ": ") { target = target[..<colon.lowerBound] }
        if target.hasPrefix("cached ") { target = target.dropFirst("cached ".count) }
        var toOffset: Int64?
        var toLogical: String?
        let words = target.split(separator: " ")
        if let last = words.last, let n = Int64(last) {
            toOffset = n
        } else if let first = words.first {
            toLogical = String(first)
        }
        var skipped: Int64?
        if let t = toOffset, t > fromOffset { skipped = t - fromOffset }
        return OffsetReset(topic: topic, partition: partition, fromOffset: fromOffset, toOffset: toOffset,
                           toLogical: toLogical, skippedEstimate: skipped, blocked: false, detail: detail)
    }
}

/// Every offset reset of this process's consumers (bounded), for `/readyz` and tests.
public enum OffsetResets {
    private static let records = Mutex<[OffsetReset]>([])
    private static let limit = 1_000
    static let logger = Logger(label: "fleet.kafka.offset-reset")

    /// Records, logs (error level) and counts one reset.
    static func report(_ reset: OffsetReset, group: String) {
        records.withLock { r in
            r.append(reset)
            if r.count > limit { r.removeFirst(r.count - limit) }
        }
        let dims = [("topic", reset.topic), ("partition", String(reset.partition))]
        Counter(label: "fleet_consumer_offset_resets_total", dimensions: dims).increment()
        if let skipped = reset.skippedEstimate, skipped > 0 {
            Counter(label: "fleet_consumer_offset_reset_skipped_messages_total", dimensions: dims).increment(by: skipped)
        }
        logger.error("offset_reset: consumer position out of range; messages between the two offsets are NOT consumed", metadata: [
            "event": "offset_reset",
            "group": "\(group)",
            "topic": "\(reset.topic)",
            "partition": "\(reset.partition)",
            "from_offset": "\(reset.fromOffset.map(String.init) ?? "unknown")",
            "to_offset": "\(reset.toOffset.map(String.init) ?? reset.toLogical ?? "unknown")",
            "skipped_messages": "\(reset.skippedEstimate.map(String.init) ?? "unknown")",
            "blocked": "\(reset.blocked)",
            "detail": "\(reset.detail)",
        ])
    }

    /// All resets seen by this process so far (oldest first).
    public static var all: [OffsetReset] { records.withLock { $0 } }

    /// One line per reset, for `/readyz`.
    public static var report: [String] { all.map { "offset reset: \($0)" } }

    /// For tests.
    public static func clear() { records.withLock { $0 = [] } }
}
