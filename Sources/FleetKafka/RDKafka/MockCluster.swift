import CRdKafka

/// The C binding of librdkafka's Kafka-protocol mock cluster (`rd_kafka_mock_*`), package-visible only: the
/// development-facing cluster, with its lifecycle and checks, is `FleetDevStack.EmbeddedKafkaCluster`. Not part of
/// FleetKafka's public client API; no locking here (the caller serialises `destroy()` against the other calls).
package final class RDKafkaMockCluster: @unchecked Sendable {
    /// The `rd_kafka_t*` the mock cluster lives in, and the cluster.
    private let handle: OpaquePointer
    private let cluster: OpaquePointer
    package let bootstrapServers: String

    package init(brokers: Int) throws(KafkaError) {
        let conf = try makeConf([("client.id", "fleet-embedded-cluster"), ("log_level", "3")])
        handle = try makeHandle(RD_KAFKA_PRODUCER, conf: conf)
        guard let mc = rd_kafka_mock_cluster_new(handle, Int32(brokers)) else {
            rd_kafka_destroy(handle)
            throw .invalidArgument("rd_kafka_mock_cluster_new failed")
        }
        cluster = mc
        bootstrapServers = String(cString: rd_kafka_mock_cluster_bootstraps(mc))
    }

    private func check(_ err: rd_kafka_resp_err_t, _ what: String) throws(KafkaError) {
        if err != RD_KAFKA_RESP_ERR_NO_ERROR { throw KafkaError(err, message: "\(what): \(String(cString: rd_kafka_err2str(err)))") }
    }

    package func createTopic(_ name: String, partitions: Int, replicationFactor: Int) throws(KafkaError) {
        try check(rd_kafka_mock_topic_create(cluster, name, Int32(partitions), Int32(replicationFactor)), "create topic \(name)")
    }

    package func setBrokerDown(_ id: Int32) throws(KafkaError) {
        try check(rd_kafka_mock_broker_set_down(cluster, id), "broker \(id) down")
    }

    package func setBrokerUp(_ id: Int32) throws(KafkaError) {
        try check(rd_kafka_mock_broker_set_up(cluster, id), "broker \(id) up")
    }

    package func setBrokerRTT(_ id: Int32, milliseconds: Int) throws(KafkaError) {
        try check(rd_kafka_mock_broker_set_rtt(cluster, id, Int32(milliseconds)), "broker \(id) rtt")
    }

    package func pushRequestErrors(apiKey: Int16, errors: [Int32]) {
        let codes = errors.map { rd_kafka_resp_err_t(rawValue: $0) }
        codes.withUnsafeBufferPointer { rd_kafka_mock_push_request_errors_array(cluster, apiKey, codes.count, $0.baseAddress) }
    }

    package func clearRequestErrors(apiKey: Int16) {
        rd_kafka_mock_clear_request_errors(cluster, apiKey)
    }

    package func setTopicError(_ topic: String, error: Int32) {
        rd_kafka_mock_topic_set_error(cluster, topic, rd_kafka_resp_err_t(rawValue: error))
    }

    /// Stops every broker and frees the cluster. Call once; no other call after it.
    package func destroy() {
        rd_kafka_mock_cluster_destroy(cluster)
        rd_kafka_destroy(handle)
    }
}

/// A group-less reader assigned to given partitions from their beginning, reporting each record's partition and size,
/// and the partitions' watermarks (package-visible: used by `FleetDevStack.EmbeddedKafkaRetentionWatch`). One thread
/// at a time.
package final class RDKafkaPartitionSizeReader: @unchecked Sendable {
    private let rk: OpaquePointer

    package init(bootstrapServers: String, clientId: String, partitions: [TopicPartition]) throws(KafkaError) {
        let conf = try makeConf([
            ("bootstrap.servers", bootstrapServers), ("client.id", clientId),
            ("group.id", "\(clientId)-\(UInt64.random(in: 0...UInt64.max))"), ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"), ("enable.partition.eof", "false"),
            ("auto.offset.reset", "earliest"), ("queued.max.messages.kbytes", "4096"),
        ])
        let rk = try makeHandle(RD_KAFKA_CONSUMER, conf: conf)
        rd_kafka_poll_set_consumer(rk)
        let list = rd_kafka_topic_partition_list_new(Int32(partitions.count))
        for tp in partitions {
            rd_kafka_topic_partition_list_add(list, tp.topic, tp.partition)?.pointee.offset = Int64(RD_KAFKA_OFFSET_BEGINNING)
        }
        let err = rd_kafka_assign(rk, list)
        rd_kafka_topic_partition_list_destroy(list)
        if err != RD_KAFKA_RESP_ERR_NO_ERROR {
            rd_kafka_destroy(rk)
            throw KafkaError(err, message: "\(clientId): assign: \(String(cString: rd_kafka_err2str(err)))")
        }
        self.rk = rk
    }

    /// The next record's partition and size (key + value bytes), or nil when none arrived within the timeout.
    package func poll(timeoutMilliseconds: Int32) -> (TopicPartition, Int64)? {
        guard let rkm = rd_kafka_consumer_poll(rk, timeoutMilliseconds) else { return nil }
        defer { rd_kafka_message_destroy(rkm) }
        let m = rkm.pointee
        guard m.err == RD_KAFKA_RESP_ERR_NO_ERROR, let rkt = m.rkt else { return nil }
        return (TopicPartition(topic: String(cString: rd_kafka_topic_name(rkt)), partition: m.partition), Int64(m.len + m.key_len))
    }

    /// The partition's low and high watermarks as last fetched (no broker round trip), when known.
    package func watermarks(_ tp: TopicPartition) -> (low: Int64, high: Int64)? {
        var low: Int64 = -1, high: Int64 = -1
        guard rd_kafka_get_watermark_offsets(rk, tp.topic, tp.partition, &low, &high) == RD_KAFKA_RESP_ERR_NO_ERROR,
              low >= 0 else { return nil }
        return (low, high)
    }

    /// Closes and frees the reader. Call once; no other call after it.
    package func close() {
        _ = rd_kafka_consumer_close(rk)
        rd_kafka_destroy(rk)
    }
}
