import FleetDevStack
import FleetKafka
import Foundation
import Synchronization

/// Kafka plumbing for tests that use the embedded cluster.
public enum TestKafka {
    /// Consumer-group timings from docs/kafka-notes.md (the mock makes a joining member wait session.timeout - 1s).
    public static func config(_ bootstrap: String) -> KafkaConfiguration {
        var c = KafkaConfiguration(bootstrapServers: bootstrap, clientId: "fleet-tests")
        c.sessionTimeoutMilliseconds = 6000
        c.heartbeatIntervalMilliseconds = 500
        c.autoCommitIntervalMilliseconds = 200
        return c
    }

    public static func unique(_ prefix: String) -> String { "\(prefix)-\(UUID().uuidString.prefix(8).lowercased())" }

    /// A cluster with one topic, ready (metadata shows every partition led).
    public static func cluster(brokers: Int = 3, topic: String, partitions: Int, replicationFactor: Int = 1) async throws
        -> EmbeddedKafkaCluster
    {
        let cluster = try EmbeddedKafkaCluster(brokers: brokers)
        try cluster.createTopic(topic, partitions: partitions, replicationFactor: replicationFactor)
        let counts = try await KafkaAdmin(configuration: config(cluster.bootstrapServers)).waitForTopics([topic])
        guard counts[topic] == partitions else { throw TestFailure("topic \(topic) has \(counts[topic] ?? 0) partitions, not \(partitions)") }
        return cluster
    }

    /// A cluster with a new topic (named from `prefix`) whose every partition holds `perPartition` messages "p:seq".
    public static func sequencedCluster(_ prefix: String, brokers: Int = 3, partitions: Int, perPartition: Int) async throws
        -> (cluster: EmbeddedKafkaCluster, topic: String)
    {
        let topic = unique(prefix)
        let cluster = try await self.cluster(brokers: brokers, topic: topic, partitions: partitions)
        do {
            try await produceSequenced(cluster.bootstrapServers, topic: topic, partitions: partitions, perPartition: perPartition)
        } catch {
            cluster.shutdown()
            throw error
        }
        return (cluster, topic)
    }

    /// Produces `perPartition` messages to every partition with value "p:seq" and waits for every report.
    public static func produceSequenced(_ bootstrap: String, topic: String, partitions: Int, perPartition: Int) async throws {
        let producer = try KafkaProducer(configuration: config(bootstrap))
        let counts = Counts()
        try await runOnThread {
            for seq in 0..<perPartition {
                for p in 0..<partitions {
                    try producer.enqueue(OutgoingMessage(topic: topic, key: Array("k\(p)".utf8),
                                                         value: Array("\(p):\(seq)".utf8), partition: Int32(p))) {
                        counts.record($0)
                    }
                }
            }
            producer.flush(timeout: .seconds(60))
        }
        producer.close()
        guard counts.ok == partitions * perPartition, counts.failures.isEmpty else {
            throw TestFailure("\(counts.ok) of \(partitions * perPartition) delivered; failures: \(counts.failures.prefix(3))")
        }
    }

    /// Consumes until `count` messages arrived or `timeout` passed; returns them in arrival order.
    public static func consume(_ consumer: KafkaConsumer, count: Int, timeout: Duration = .seconds(30)) async throws -> [KafkaMessage] {
        var seen: [KafkaMessage] = []
        let deadline = ContinuousClock.now + timeout
        while seen.count < count, ContinuousClock.now < deadline {
            seen += try await consumer.nextBatch(maxMessages: 500, timeout: .milliseconds(500))
        }
        return seen
    }

    public static func runOnThread(_ body: @escaping @Sendable () throws -> Void) async throws {
        let result: Result<Void, any Error> = await withCheckedContinuation { c in
            let t = Thread {
                do { try body(); c.resume(returning: .success(())) } catch { c.resume(returning: .failure(error)) }
            }
            t.start()
        }
        try result.get()
    }
}

/// Delivery reports, counted.
public final class Counts: Sendable {
    public init() {}
    private let state = Mutex((ok: 0, failures: [KafkaError]()))
    public func record(_ r: Result<DeliveryReport, KafkaError>) {
        state.withLock { s in
            switch r {
            case .success: s.ok += 1
            case .failure(let e): s.failures.append(e)
            }
        }
    }
    public var ok: Int { state.withLock { $0.ok } }
    public var failures: [KafkaError] { state.withLock { $0.failures } }
}

/// Values appended from any thread.
public final class Recorder<T: Sendable>: Sendable {
    public init() {}
    private let state = Mutex<[T]>([])
    public func append(_ v: T) { state.withLock { $0.append(v) } }
    public var values: [T] { state.withLock { $0 } }
}
