import CRdKafka
import Foundation

/// Lag of one partition for a consumer group.
public struct PartitionLag: Sendable, Hashable, Codable {
    public var topic: String
    public var partition: Int32
    /// The group's committed offset, or nil when the group has none for this partition.
    public var committedOffset: Int64?
    public var lowWatermark: Int64
    public var highWatermark: Int64
    /// `highWatermark - committedOffset`; without a committed offset, `highWatermark - lowWatermark` (everything
    /// retained is unconsumed, as with `auto.offset.reset=earliest`).
    public var lag: Int64

    public init(topic: String, partition: Int32, committedOffset: Int64?, lowWatermark: Int64, highWatermark: Int64, lag: Int64) {
        self.topic = topic
        self.partition = partition
        self.committedOffset = committedOffset
        self.lowWatermark = lowWatermark
        self.highWatermark = highWatermark
        self.lag = lag
    }

    /// The committed offset is below the low watermark: records the group never read were deleted (retention).
    public var committedOutOfRange: Bool { committedOffset.map { $0 < lowWatermark } ?? false }

    private enum CodingKeys: String, CodingKey { case topic, partition, committedOffset, lowWatermark, highWatermark, lag }

    /// Encodes a missing committed offset as an explicit `null`.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(topic, forKey: .topic)
        try c.encode(partition, forKey: .partition)
        try c.encode(committedOffset, forKey: .committedOffset)
        try c.encode(lowWatermark, forKey: .lowWatermark)
        try c.encode(highWatermark, forKey: .highWatermark)
        try c.encode(lag, forKey: .lag)
    }
}

extension Array where Element == PartitionLag {
    public var totalLag: Int64 { reduce(0) { $0 + $1.lag } }
}

public struct TopicSpec: Sendable, Hashable {
    public var name: String
    public var partitions: Int
    public var replicationFactor: Int
    public init(name: String, partitions: Int, replicationFactor: Int = 1) {
        self.name = name
        self.partitions = partitions
        self.replicationFactor = replicationFactor
    }
}

/// Administrative operations. Every call opens a short-lived client on a dedicated thread (blocking librdkafka
/// calls never run on the cooperative pool).
public struct KafkaAdmin: Sendable {
    public var configuration: KafkaConfiguration
    /// Per-request timeout.
    public var timeout: Duration

    public init(configuration: KafkaConfiguration, timeout: Duration = .seconds(10)) {
        self.configuration = configuration
        self.timeout = timeout
    }

    private var timeoutMs: Int32 {
        Int32(clamping: timeout.components.seconds * 1000 + timeout.components.attoseconds / 1_000_000_000_000_000)
    }

    private func withHandle<T: Sendable>(
        _ type: rd_kafka_type_t = RD_KAFKA_PRODUCER, groupId: String? = nil,
        _ body: @escaping @Sendable (OpaquePointer) throws(KafkaError) -> T
    ) async throws(KafkaError) -> T {
        let props = configuration.adminProperties(groupId: groupId)
        let result: Result<T, KafkaError> = await runBlocking(name: "fleet-kafka-admin") {
            do {
                let conf = try makeConf(props)
                let rk = try makeHandle(type, conf: conf)
                defer { rd_kafka_destroy(rk) }
                return .success(try body(rk))
            } catch let e as KafkaError {
                return .failure(e)
            } catch {
                return .failure(.invalidArgument("\(error)"))
            }
        }
        return try result.get()
    }

    /// Creates topics with the CreateTopics admin API (a real broker; the embedded mock cluster does not implement
    /// it: use `EmbeddedKafkaCluster.createTopic`). Topics that already exist are accepted when `ignoreExisting`.
    public func createTopics(_ topics: [TopicSpec], ignoreExisting: Bool = true) async throws(KafkaError) {
        guard !topics.isEmpty else { return }
        let ms = timeoutMs
        try await withHandle { rk throws(KafkaError) in
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
    }

    /// Tuple form of `createTopics(_:ignoreExisting:)`.
    public func createTopics(_ topics: [(name: String, partitions: Int, replicationFactor: Int)],
                             ignoreExisting: Bool = true) async throws(KafkaError) {
        try await createTopics(topics.map { TopicSpec(name: $0.name, partitions: $0.partitions, replicationFactor: $0.replicationFactor) },
                               ignoreExisting: ignoreExisting)
    }

    /// Partition counts of the given topics that exist (with leaders for every partition) right now.
    public func partitionCounts(topics: [String]) async throws(KafkaError) -> [String: Int] {
        let ms = timeoutMs
        return try await withHandle { rk throws(KafkaError) in try metadataPartitions(rk, topics: topics, timeoutMs: ms) }
    }

    /// Waits until every topic exists with all partitions led, or throws a timed-out error after `timeout`.
    public func waitForTopics(_ topics: [String], timeout: Duration = .seconds(30)) async throws(KafkaError) -> [String: Int] {
        let deadline = ContinuousClock.now + timeout
        var last: [String: Int] = [:]
        while true {
            do {
                last = try await partitionCounts(topics: topics)
                if topics.allSatisfy({ (last[$0] ?? 0) > 0 }) { return last }
            } catch where !error.isFatal && ContinuousClock.now < deadline {
                // retry until the deadline
            }
            if ContinuousClock.now >= deadline {
                let missing = topics.filter { (last[$0] ?? 0) == 0 }
                throw .timedOut("topics not available: \(missing.joined(separator: ", "))")
            }
            try? await Task.sleep(for: .milliseconds(200))
        }
    }

    /// Per-partition lag of `groupId` on `topics`: committed offset (OffsetFetch) versus high watermark (ListOffsets).
    public func consumerLag(groupId: String, topics: [String]) async throws(KafkaError) -> [PartitionLag] {
        let ms = timeoutMs
        return try await withHandle(RD_KAFKA_CONSUMER, groupId: groupId) { rk throws(KafkaError) in
            let counts = try metadataPartitions(rk, topics: topics, timeoutMs: ms)
            for t in topics where counts[t] == nil {
                throw KafkaError(RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART, message: "topic \(t) does not exist")
            }
            let ordered = topics.flatMap { t in (0..<(counts[t] ?? 0)).map { TopicPartition(topic: t, partition: Int32($0)) } }
            guard let list = rd_kafka_topic_partition_list_new(Int32(ordered.count)) else { return [] }
            defer { rd_kafka_topic_partition_list_destroy(list) }
            for tp in ordered { rd_kafka_topic_partition_list_add(list, tp.topic, tp.partition) }
            let err = rd_kafka_committed(rk, list, ms)
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
            var out: [PartitionLag] = []
            for tp in ordered {
                var low: Int64 = 0, high: Int64 = 0
                let werr = rd_kafka_query_watermark_offsets(rk, tp.topic, tp.partition, &low, &high, ms)
                if werr != RD_KAFKA_RESP_ERR_NO_ERROR {
                    throw KafkaError(werr, message: "watermarks of \(tp): \(String(cString: rd_kafka_err2str(werr)))")
                }
                let c = committed[tp]
                out.append(PartitionLag(topic: tp.topic, partition: tp.partition, committedOffset: c,
                                        lowWatermark: low, highWatermark: high,
                                        lag: max(0, high - (c ?? low))))
            }
            return out
        }
    }
}

private func metadataPartitions(_ rk: OpaquePointer, topics: [String], timeoutMs: Int32) throws(KafkaError) -> [String: Int] {
    var md: UnsafePointer<rd_kafka_metadata>?
    let err = rd_kafka_metadata(rk, 1, nil, &md, timeoutMs)
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
