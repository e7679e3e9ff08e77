import EntitlementDomain
import FleetKafka
import Foundation
import Logging

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
        try await records(maxRecords: maxRecords, wait: pollTimeout)
    }

    public func moreRecords(maxRecords: Int) async throws -> [SinkRecord]? {
        try await records(maxRecords: maxRecords, wait: .zero)
    }

    private func records(maxRecords: Int, wait: Duration) async throws -> [SinkRecord] {
        let messages = try await consumer.nextBatch(maxMessages: maxRecords, timeout: wait)
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
            headers: FleetHeaders.rejected(
                reason: reason, detail: detail, sourceTopic: record.topic, sourcePartition: record.partition,
                sourceOffset: record.offset, KafkaHeader.init(key:string:))))
    }
}

/// The writers of one sink process: each a member of the sink's consumer group with its own `KafkaConsumer` and its
/// own `SinkService` (hence its own database connection). The group splits the result topic's partitions between
/// them, so a subscription's events (keyed by originalTransactionId) stay with one writer; writers touching the same
/// subject serialize on the applier's advisory locks, as separate sink processes do. Each batch is still one
/// database transaction.
public final class KafkaSinkWriters: Sendable {
    public let services: [SinkService]
    private let consumers: [KafkaConsumer]

    public init(
        count: Int, kafka: KafkaConfiguration, groupId: String, topic: String, configuration: SinkConfiguration,
        rejected: any RejectedRecordSink, logger: Logger, onBatch: (@Sendable (SinkService.BatchReport) -> Void)? = nil
    ) throws {
        var consumers: [KafkaConsumer] = []
        var services: [SinkService] = []
        for _ in 0..<max(1, count) {
            let consumer = try KafkaConsumer(configuration: kafka, groupId: groupId, topics: [topic])
            consumers.append(consumer)
            services.append(SinkService(
                configuration: configuration, source: KafkaEventBatchSource(consumer: consumer), rejected: rejected,
                logger: logger, onBatch: onBatch))
        }
        self.consumers = consumers
        self.services = services
    }

    /// Every writer connected to the database and assigned.
    public var isReady: Bool { services.allSatisfy(\.isReady) }

    /// After the services stopped: every writer commits its stored offsets while all are still members (the first to
    /// leave starts a rebalance during which the others' closing commits would be refused), then all leave the group.
    /// Returns whether every consumer closed within `deadline`.
    public func close(deadline: Duration) async -> Bool {
        let consumers = self.consumers
        await withTaskGroup(of: Void.self) { group in
            for consumer in consumers { group.addTask { await consumer.commit(deadline: min(deadline, .seconds(5))) } }
        }
        return await withTaskGroup(of: Bool.self) { group in
            for consumer in consumers { group.addTask { await consumer.close(deadline: deadline) } }
            return await group.reduce(true) { $0 && $1 }
        }
    }
}
