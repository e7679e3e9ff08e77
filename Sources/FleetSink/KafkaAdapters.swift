import FleetKafka
import Foundation

/// The result topic through `FleetKafka.KafkaConsumer`: batches in, `markProcessed` after the database commit
/// (the consumer stores offset+1 for the contiguous processed prefix and commits it in the background, on revoke
/// and on close; a crash in between only causes a redelivery, which the applier absorbs).
public final class KafkaEventBatchSource: EventBatchSource {
    public let consumer: KafkaConsumer
    let pollTimeout: Duration

    public init(consumer: KafkaConsumer, pollTimeout: Duration = .milliseconds(500)) {
        self.consumer = consumer
        self.pollTimeout = pollTimeout
    }

    public func nextBatch(maxRecords: Int) async throws -> [SinkRecord] {
        let messages = try await consumer.nextBatch(maxMessages: maxRecords, timeout: pollTimeout)
        return messages.map { m in
            SinkRecord(topic: m.topic, partition: m.partition, offset: m.offset, key: m.key, value: m.value,
                       headers: m.headers.map { (key: $0.key, value: $0.value) })
        }
    }

    public func markProcessed(_ records: [SinkRecord]) async throws {
        consumer.markProcessed(records.map {
            KafkaMessage(topic: $0.topic, partition: $0.partition, offset: $0.offset, key: nil, value: [], headers: [],
                         timestampMilliseconds: nil)
        })
    }

    public var isReady: Bool { consumer.isReady }
}

/// The sink-rejected topic through `FleetKafka.KafkaProducer`: the original bytes and key, headers `reason`,
/// `detail`, `source-topic`, `source-partition`, `source-offset`; returns once the broker acknowledged it.
public final class KafkaRejectedSink: RejectedRecordSink {
    public let producer: KafkaProducer
    public let topic: String

    public init(producer: KafkaProducer, topic: String) {
        self.producer = producer
        self.topic = topic
    }

    public func reject(_ record: SinkRecord, reason: String, detail: String) async throws {
        _ = try await producer.send(OutgoingMessage(
            topic: topic, key: record.key, value: record.value,
            headers: [
                KafkaHeader(key: "reason", string: reason),
                KafkaHeader(key: "detail", string: String(detail.prefix(2000))),
                KafkaHeader(key: "source-topic", string: record.topic),
                KafkaHeader(key: "source-partition", string: String(record.partition)),
                KafkaHeader(key: "source-offset", string: String(record.offset)),
            ]))
    }
}
