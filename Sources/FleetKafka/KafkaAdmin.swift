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
        consumer: Bool = false, groupId: String? = nil,
        _ body: @escaping @Sendable (RDKafkaAdminHandle) throws(KafkaError) -> T
    ) async throws(KafkaError) -> T {
        let props = configuration.adminProperties(groupId: groupId)
        let result: Result<T, KafkaError> = await runBlocking(name: "fleet-kafka-admin") {
            do {
                let handle = try RDKafkaAdminHandle(consumer: consumer, properties: props)
                return .success(try body(handle))
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
        try await withHandle { handle throws(KafkaError) in
            try handle.createTopics(topics, ignoreExisting: ignoreExisting, timeoutMilliseconds: ms)
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
        return try await withHandle { handle throws(KafkaError) in try handle.partitionCounts(topics: topics, timeoutMilliseconds: ms) }
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
        return try await withHandle(consumer: true, groupId: groupId) { handle throws(KafkaError) in
            let counts = try handle.partitionCounts(topics: topics, timeoutMilliseconds: ms)
            for t in topics where counts[t] == nil {
                throw KafkaError(code: KafkaErrorCode.unknownTopicOrPartition, message: "topic \(t) does not exist")
            }
            let ordered = topics.flatMap { t in (0..<(counts[t] ?? 0)).map { TopicPartition(topic: t, partition: Int32($0)) } }
            guard !ordered.isEmpty else { return [] }
            let committed = try handle.committedOffsets(ordered, groupId: groupId, timeoutMilliseconds: ms)
            var out: [PartitionLag] = []
            for tp in ordered {
                let (low, high) = try handle.queryWatermarks(tp, timeoutMilliseconds: ms)
                let c = committed[tp]
                out.append(PartitionLag(topic: tp.topic, partition: tp.partition, committedOffset: c,
                                        lowWatermark: low, highWatermark: high,
                                        lag: max(0, high - (c ?? low))))
            }
            return out
        }
    }
}
