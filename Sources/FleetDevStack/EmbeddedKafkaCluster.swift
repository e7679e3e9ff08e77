import FleetKafka
import Foundation
import Synchronization

/// librdkafka's Kafka-protocol mock cluster hosted in this process, reachable over TCP (127.0.0.1) by any client,
/// including other processes. For development (`fleet dev-kafka`), tests and benchmarks.
///
/// Limits (librdkafka 2.0.2): data in memory only and each partition retains only about the last 5 MB (older
/// records are deleted and the low watermark moves up), no SASL/SSL, no admin APIs (topics are created with
/// `createTopic`), consumer-group joins of an existing group take about `session.timeout.ms - 1s`.
/// Broker ids are 1...brokers.
public final class EmbeddedKafkaCluster: Sendable {
    /// librdkafka's mock cluster (FleetKafka's binding); destroyed once, under `lock`, in `shutdown()`.
    private let mock: RDKafkaMockCluster
    private let lock = Mutex<Bool>(false)  // true once shut down
    public let bootstrapServers: String
    public let brokerCount: Int

    public init(brokers: Int = 3) throws(KafkaError) {
        guard brokers >= 1 else { throw KafkaError(code: KafkaErrorCode.invalidArgument, message: "an embedded cluster needs at least one broker") }
        mock = try RDKafkaMockCluster(brokers: brokers)
        bootstrapServers = mock.bootstrapServers
        brokerCount = brokers
    }

    deinit { shutdown() }

    private func withCluster(_ body: (RDKafkaMockCluster) throws(KafkaError) -> Void) throws(KafkaError) {
        var failure: KafkaError?
        let open = lock.withLock { down -> Bool in
            guard !down else { return false }
            do throws(KafkaError) { try body(mock) } catch { failure = error }
            return true
        }
        guard open else { throw KafkaError(code: KafkaErrorCode.destroyed, message: "embedded cluster is closed", isRetriable: false) }
        if let failure { throw failure }
    }

    /// Creates a topic (the mock's replacement for the CreateTopics API).
    public func createTopic(_ name: String, partitions: Int, replicationFactor: Int = 1) throws(KafkaError) {
        guard partitions >= 1 else { throw KafkaError(code: KafkaErrorCode.invalidArgument, message: "partitions must be >= 1") }
        guard replicationFactor >= 1, replicationFactor <= brokerCount else {
            throw KafkaError(code: KafkaErrorCode.invalidArgument, message: "replication factor \(replicationFactor) needs 1...\(brokerCount)")
        }
        try withCluster { c throws(KafkaError) in try c.createTopic(name, partitions: partitions, replicationFactor: replicationFactor) }
    }

    /// Takes a broker down: its connections are closed and it refuses new ones until `setBrokerUp`.
    public func setBrokerDown(_ id: Int32) throws(KafkaError) {
        try withCluster { c throws(KafkaError) in try c.setBrokerDown(id) }
    }

    public func setBrokerUp(_ id: Int32) throws(KafkaError) {
        try withCluster { c throws(KafkaError) in try c.setBrokerUp(id) }
    }

    /// Adds a round-trip delay to every response of a broker.
    public func setBrokerRTT(_ id: Int32, milliseconds: Int) throws(KafkaError) {
        try withCluster { c throws(KafkaError) in try c.setBrokerRTT(id, milliseconds: milliseconds) }
    }

    /// The next `errors.count` requests of API `apiKey` (see `KafkaAPIKey`), on any broker, fail with these error
    /// codes in order (see `KafkaErrorCode`).
    public func pushRequestErrors(apiKey: Int16, errors: [Int32]) throws(KafkaError) {
        try withCluster { $0.pushRequestErrors(apiKey: apiKey, errors: errors) }
    }

    public func clearRequestErrors(apiKey: Int16) throws(KafkaError) {
        try withCluster { $0.clearRequestErrors(apiKey: apiKey) }
    }

    /// Makes every request about `topic` fail with `error` (0 clears).
    public func setTopicError(_ topic: String, error: Int32) throws(KafkaError) {
        try withCluster { $0.setTopicError(topic, error: error) }
    }

    /// Stops every broker and frees the cluster. Idempotent.
    public func shutdown() {
        lock.withLock { down in
            guard !down else { return }
            down = true
            mock.destroy()
        }
    }
}
