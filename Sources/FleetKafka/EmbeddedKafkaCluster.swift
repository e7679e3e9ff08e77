import CRdKafka
import Foundation

/// librdkafka's Kafka-protocol mock cluster hosted in this process, reachable over TCP (127.0.0.1) by any client,
/// including other processes. For development (`fleet dev-kafka`), tests and benchmarks.
///
/// Limits (librdkafka 2.0.2): data in memory only and each partition retains only about the last 5 MB (older
/// records are deleted and the low watermark moves up), no SASL/SSL, no admin APIs (topics are created with
/// `createTopic`), consumer-group joins of an existing group take about `session.timeout.ms - 1s`.
/// Broker ids are 1...brokers.
public final class EmbeddedKafkaCluster: Sendable {
    /// The `rd_kafka_t*` the mock cluster lives in, and the cluster. Thread-safe in librdkafka (the mock cluster
    /// serialises operations on its own thread); destroyed once under `lock` in `shutdown()`.
    nonisolated(unsafe) private let handle: OpaquePointer
    nonisolated(unsafe) private let cluster: OpaquePointer
    private let lock = ConditionLock<Bool>(false)  // true once shut down
    public let bootstrapServers: String
    public let brokerCount: Int

    public init(brokers: Int = 3) throws(KafkaError) {
        guard brokers >= 1 else { throw .invalidArgument("an embedded cluster needs at least one broker") }
        let conf = try makeConf([("client.id", "fleet-embedded-cluster"), ("log_level", "3")])
        handle = try makeHandle(RD_KAFKA_PRODUCER, conf: conf)
        guard let mc = rd_kafka_mock_cluster_new(handle, Int32(brokers)) else {
            rd_kafka_destroy(handle)
            throw .invalidArgument("rd_kafka_mock_cluster_new failed")
        }
        cluster = mc
        bootstrapServers = String(cString: rd_kafka_mock_cluster_bootstraps(mc))
        brokerCount = brokers
    }

    deinit { shutdown() }

    private func withCluster<R>(_ body: (OpaquePointer) -> R) throws(KafkaError) -> R {
        let r: R? = lock.withLock { down in down ? nil : body(cluster) }
        guard let r else { throw .closed("embedded cluster") }
        return r
    }

    private func check(_ err: rd_kafka_resp_err_t, _ what: String) throws(KafkaError) {
        if err != RD_KAFKA_RESP_ERR_NO_ERROR { throw KafkaError(err, message: "\(what): \(String(cString: rd_kafka_err2str(err)))") }
    }

    /// Creates a topic (the mock's replacement for the CreateTopics API).
    public func createTopic(_ name: String, partitions: Int, replicationFactor: Int = 1) throws(KafkaError) {
        guard partitions >= 1 else { throw .invalidArgument("partitions must be >= 1") }
        guard replicationFactor >= 1, replicationFactor <= brokerCount else {
            throw .invalidArgument("replication factor \(replicationFactor) needs 1...\(brokerCount)")
        }
        let err = try withCluster { rd_kafka_mock_topic_create($0, name, Int32(partitions), Int32(replicationFactor)) }
        try check(err, "create topic \(name)")
    }

    /// Takes a broker down: its connections are closed and it refuses new ones until `setBrokerUp`.
    public func setBrokerDown(_ id: Int32) throws(KafkaError) {
        try check(try withCluster { rd_kafka_mock_broker_set_down($0, id) }, "broker \(id) down")
    }

    public func setBrokerUp(_ id: Int32) throws(KafkaError) {
        try check(try withCluster { rd_kafka_mock_broker_set_up($0, id) }, "broker \(id) up")
    }

    /// Adds a round-trip delay to every response of a broker.
    public func setBrokerRTT(_ id: Int32, milliseconds: Int) throws(KafkaError) {
        try check(try withCluster { rd_kafka_mock_broker_set_rtt($0, id, Int32(milliseconds)) }, "broker \(id) rtt")
    }

    /// The next `errors.count` requests of API `apiKey` (see `KafkaAPIKey`), on any broker, fail with these error
    /// codes in order (see `KafkaErrorCode`).
    public func pushRequestErrors(apiKey: Int16, errors: [Int32]) throws(KafkaError) {
        let codes = errors.map { rd_kafka_resp_err_t(rawValue: $0) }
        try withCluster { mc in
            codes.withUnsafeBufferPointer { rd_kafka_mock_push_request_errors_array(mc, apiKey, codes.count, $0.baseAddress) }
        }
    }

    public func clearRequestErrors(apiKey: Int16) throws(KafkaError) {
        try withCluster { rd_kafka_mock_clear_request_errors($0, apiKey) }
    }

    /// Makes every request about `topic` fail with `error` (0 clears).
    public func setTopicError(_ topic: String, error: Int32) throws(KafkaError) {
        try withCluster { rd_kafka_mock_topic_set_error($0, topic, rd_kafka_resp_err_t(rawValue: error)) }
    }

    /// Stops every broker and frees the cluster. Idempotent.
    public func shutdown() {
        lock.withLock { down in
            guard !down else { return }
            down = true
            rd_kafka_mock_cluster_destroy(cluster)
            rd_kafka_destroy(handle)
        }
    }
}
