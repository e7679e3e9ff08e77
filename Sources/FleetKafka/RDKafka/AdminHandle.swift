import CRdKafka

/// A short-lived librdkafka handle for admin and metadata requests. Every call blocks: `KafkaAdmin` runs them on a
/// dedicated thread. Destroyed on deinit.
final class RDKafkaAdminHandle {
    private let rk: OpaquePointer

    init(consumer: Bool, properties: [(String, String)]) throws(KafkaError) {
        let conf = try makeConf(properties)
        rk = try makeHandle(consumer ? RD_KAFKA_CONSUMER : RD_KAFKA_PRODUCER, conf: conf)
    }

    deinit { rd_kafka_destroy(rk) }

    /// CreateTopics; topics that already exist are accepted when `ignoreExisting`.
    func createTopics(_ topics: [TopicSpec], ignoreExisting: Bool, timeoutMilliseconds ms: Int32) throws(KafkaError) {
        let rk = self.rk
        var errstr = [CChar](repeating: 0, count: 512)
        var newTopics: [OpaquePointer?] = []
        defer { newTopics.forEach { rd_kafka_NewTopic_destroy($0) } }
        for t in topics {
            guard let nt = rd_kafka_NewTopic_new(t.name, Int32(t.partitions), Int32(t.replicationFactor), &errstr, errstr.count) else {
                throw .invalidArgument("topic \(t.name): \(errorString(errstr))")
            }
            newTopics.append(nt)
        }
        let queue = rd_kafka_queue_new(rk)
        defer { rd_kafka_queue_destroy(queue) }
        let options = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS)
        defer { rd_kafka_AdminOptions_destroy(options) }
        _ = rd_kafka_AdminOptions_set_operation_timeout(options, ms, &errstr, errstr.count)
        _ = rd_kafka_AdminOptions_set_request_timeout(options, ms, &errstr, errstr.count)
        newTopics.withUnsafeMutableBufferPointer { buf in
            rd_kafka_CreateTopics(rk, buf.baseAddress, buf.count, options, queue)
        }
        guard let event = rd_kafka_queue_poll(queue, ms + 2_000) else {
            throw .timedOut("CreateTopics got no answer")
        }
        defer { rd_kafka_event_destroy(event) }
        let err = rd_kafka_event_error(event)
        if err != RD_KAFKA_RESP_ERR_NO_ERROR {
            let text = rd_kafka_event_error_string(event).map { String(cString: $0) } ?? ""
            throw KafkaError(err, message: "CreateTopics: \(text)")
        }
        guard let res = rd_kafka_event_CreateTopics_result(event) else { throw .invalidArgument("CreateTopics: unexpected event") }
        var cnt = 0
        guard let results = rd_kafka_CreateTopics_result_topics(res, &cnt) else { return }
        for i in 0..<cnt {
            let r = results[i]
            let e = rd_kafka_topic_result_error(r)
            if e == RD_KAFKA_RESP_ERR_NO_ERROR || (ignoreExisting && e == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) { continue }
            let name = String(cString: rd_kafka_topic_result_name(r))
            let text = rd_kafka_topic_result_error_string(r).map { String(cString: $0) } ?? ""
            throw KafkaError(e, message: "create topic \(name): \(text)")
        }
    }

    /// Partition counts of the given topics that exist with a leader for every partition.
    func partitionCounts(topics: [String], timeoutMilliseconds: Int32) throws(KafkaError) -> [String: Int] {
        var md: UnsafePointer<rd_kafka_metadata>?
        let err = rd_kafka_metadata(rk, 1, nil, &md, timeoutMilliseconds)
        guard err == RD_KAFKA_RESP_ERR_NO_ERROR, let md else {
            throw KafkaError(err, message: "metadata: \(String(cString: rd_kafka_err2str(err)))")
        }
        defer { rd_kafka_metadata_destroy(md) }
        let wanted = Set(topics)
        var out: [String: Int] = [:]
        for i in 0..<Int(md.pointee.topic_cnt) {
            let t = md.pointee.topics[i]
            let name = String(cString: t.topic)
            guard wanted.contains(name), t.err == RD_KAFKA_RESP_ERR_NO_ERROR, t.partition_cnt > 0 else { continue }
            var led = true
            for p in 0..<Int(t.partition_cnt) where t.partitions[p].leader < 0 { led = false }
            if led { out[name] = Int(t.partition_cnt) }
        }
        return out
    }

    /// The committed offsets of this handle's group (OffsetFetch) for `partitions`; partitions without one are absent.
    func committedOffsets(_ partitions: [TopicPartition], groupId: String, timeoutMilliseconds: Int32) throws(KafkaError) -> [TopicPartition: Int64] {
        guard let list = makePartitionList(partitions) else { return [:] }
        defer { rd_kafka_topic_partition_list_destroy(list) }
        let err = rd_kafka_committed(rk, list, timeoutMilliseconds)
        if err != RD_KAFKA_RESP_ERR_NO_ERROR {
            throw KafkaError(err, message: "fetching committed offsets of group \(groupId): \(String(cString: rd_kafka_err2str(err)))")
        }
        var committed: [TopicPartition: Int64] = [:]
        for i in 0..<Int(list.pointee.cnt) {
            let e = list.pointee.elems[i]
            let tp = TopicPartition(topic: String(cString: e.topic), partition: e.partition)
            if e.err != RD_KAFKA_RESP_ERR_NO_ERROR {
                throw KafkaError(e.err, message: "committed offset of \(tp): \(String(cString: rd_kafka_err2str(e.err)))")
            }
            if e.offset >= 0 { committed[tp] = e.offset }
        }
        return committed
    }

    /// The partition's low and high watermarks, asked of its leader (ListOffsets).
    func queryWatermarks(_ tp: TopicPartition, timeoutMilliseconds: Int32) throws(KafkaError) -> (low: Int64, high: Int64) {
        var low: Int64 = 0, high: Int64 = 0
        let err = rd_kafka_query_watermark_offsets(rk, tp.topic, tp.partition, &low, &high, timeoutMilliseconds)
        if err != RD_KAFKA_RESP_ERR_NO_ERROR {
            throw KafkaError(err, message: "watermarks of \(tp): \(String(cString: rd_kafka_err2str(err)))")
        }
        return (low, high)
    }
}
