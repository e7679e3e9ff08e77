import Foundation

/// A Kafka record header.
public struct KafkaHeader: Sendable, Hashable {
    public var key: String
    public var value: [UInt8]
    public init(key: String, value: [UInt8]) {
        self.key = key
        self.value = value
    }
    public init(key: String, string: String) {
        self.key = key
        self.value = Array(string.utf8)
    }
}

public struct TopicPartition: Sendable, Hashable, CustomStringConvertible, Comparable {
    public var topic: String
    public var partition: Int32
    public init(topic: String, partition: Int32) {
        self.topic = topic
        self.partition = partition
    }
    public var description: String { "\(topic)[\(partition)]" }
    public static func < (a: TopicPartition, b: TopicPartition) -> Bool {
        (a.topic, a.partition) < (b.topic, b.partition)
    }
}

/// A message to produce.
public struct OutgoingMessage: Sendable {
    public var topic: String
    public var key: [UInt8]?
    public var value: [UInt8]
    public var headers: [KafkaHeader]
    /// Explicit partition; `nil` lets the partitioner choose (by key hash when keyed).
    public var partition: Int32?

    public init(topic: String, key: [UInt8]? = nil, value: [UInt8], headers: [KafkaHeader] = [], partition: Int32? = nil) {
        self.topic = topic
        self.key = key
        self.value = value
        self.headers = headers
        self.partition = partition
    }
}

/// Where a produced message was written.
public struct DeliveryReport: Sendable, Hashable {
    public var topic: String
    public var partition: Int32
    /// Offset in the partition; -1 when the broker acknowledgement did not carry it (idempotent retry case).
    public var offset: Int64
}

/// A consumed message.
public struct KafkaMessage: Sendable {
    public var topic: String
    public var partition: Int32
    public var offset: Int64
    public var key: [UInt8]?
    public var value: [UInt8]
    public var headers: [KafkaHeader]
    /// Record timestamp in milliseconds since the epoch, when available.
    public var timestampMilliseconds: Int64?

    public init(topic: String, partition: Int32, offset: Int64, key: [UInt8]?, value: [UInt8], headers: [KafkaHeader],
                timestampMilliseconds: Int64?) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.headers = headers
        self.timestampMilliseconds = timestampMilliseconds
    }

    public var timestamp: Date? {
        timestampMilliseconds.map { Date(timeIntervalSince1970: Double($0) / 1000) }
    }
    public var topicPartition: TopicPartition { TopicPartition(topic: topic, partition: partition) }
    /// First header with that key.
    public func header(_ key: String) -> [UInt8]? { headers.first { $0.key == key }?.value }
}
