import FleetDevStack
import FleetKafka
import Foundation

/// Flow control for publishing into the embedded (mock) cluster.
///
/// librdkafka 2.0.2's mock cluster keeps at most ~5 MB (and 100,000 messages) per partition and deletes the oldest
/// data beyond that whether or not a consumer group has read it: a publisher that runs ahead of the verifier workers
/// would make the mock silently discard inputs. A real broker retains by time and size policy set by its operator, so
/// production publishers need nothing like this; the demo and the benchmarks do. The gate lets the publisher run only
/// while the group's unconsumed backlog on every partition stays under a per-partition budget.
public struct BacklogGate: Sendable {
    /// Bytes the mock keeps per partition before it starts deleting (librdkafka's `mpart->max_size`).
    public static let mockPartitionBytes = EmbeddedKafkaRetentionWatch.partitionBytes

    /// A per-partition message budget that keeps `messageBytes`-sized messages well inside the mock's retention
    /// (half of it, leaving room for key skew and the consumer's commit interval).
    public static func budget(messageBytes: Int) -> Int {
        max(50, mockPartitionBytes / 2 / max(1, messageBytes))
    }

    let admin: KafkaAdmin
    let group: String
    let topic: String
    let perPartition: Int
    let partitions: Int
    private var publishedAtCheck = 0
    private var backlogAtCheck = 0

    public init(bootstrapServers: String, group: String, topic: String, partitions: Int, perPartitionBudget: Int) {
        admin = KafkaAdmin(configuration: KafkaConfiguration(bootstrapServers: bootstrapServers, clientId: "fleet-backlog-gate"))
        self.group = group
        self.topic = topic
        self.partitions = max(1, partitions)
        perPartition = max(1, perPartitionBudget)
    }

    /// Waits until one more message may be published, `published` being how many were enqueued so far.
    /// Cheap while the estimate is far from the budget: the broker is asked only when it gets close.
    public mutating func admit(published: Int, timeout: Duration = .seconds(300)) async throws {
        // Estimate: the backlog measured last time plus everything published since, as if it all went to one partition
        // spread evenly (keys hash evenly across partitions).
        let estimate = backlogAtCheck + (published - publishedAtCheck + partitions - 1) / partitions
        if estimate < perPartition { return }
        let deadline = ContinuousClock.now + timeout
        while true {
            let lags = try await admin.consumerLag(groupId: group, topics: [topic])
            let delivered = lags.reduce(Int64(0)) { $0 + $1.highWatermark }
            let undelivered = max(0, published - Int(delivered))
            let worst = Int(lags.map(\.lag).max() ?? 0)
            backlogAtCheck = worst + (undelivered + partitions - 1) / partitions
            publishedAtCheck = published
            if backlogAtCheck < perPartition { return }
            if ContinuousClock.now > deadline {
                throw DemoError("the consumers of \(topic) made no room in \(timeout) (backlog \(backlogAtCheck) per partition)")
            }
            // Ask again soon: the lag is read from committed offsets, so it already trails the consumers (by the
            // commit interval and the delivery of their outputs). Waiting 100 ms here on top, the workers drained their
            // partitions and sat idle for 200-400 ms about once a second in `bench pipeline`'s burst.
            try await Task.sleep(for: .milliseconds(20))
        }
    }
}
