import FleetKafka
import FleetOperations
import Foundation
import Logging
import ServiceLifecycle

/// A whole `fleet sink` process as one `Service`, as `VerifierWorker` is for the worker: its writers (consumer-group
/// members with their own database connections), the sink-rejected producer, the consumer-lag gauge and the readiness
/// condition `database-and-assignment`. On graceful shutdown every writer finishes its batch in flight, then all commit
/// their stored offsets while still members, leave the group, and the producer is flushed.
public final class KafkaSinkProcess: Service, Sendable {
    public struct Configuration: Sendable {
        public var kafka: KafkaConfiguration
        public var group: String
        public var topic: String
        public var rejectedTopic: String
        public var writers: Int
        public var sink: SinkConfiguration
        public var shutdownDeadline: Duration
        public var lagInterval: Duration

        public init(kafka: KafkaConfiguration, group: String, topic: String, rejectedTopic: String, writers: Int,
                    sink: SinkConfiguration, shutdownDeadline: Duration = .seconds(25), lagInterval: Duration = .seconds(5)) {
            self.kafka = kafka
            self.group = group
            self.topic = topic
            self.rejectedTopic = rejectedTopic
            self.writers = writers
            self.sink = sink
            self.shutdownDeadline = shutdownDeadline
            self.lagInterval = lagInterval
        }
    }

    public static let readinessCondition = "database-and-assignment"

    public let configuration: Configuration
    public let readiness: Readiness
    public let writers: KafkaSinkWriters
    private let producer: KafkaProducer
    private let logger: Logger

    public init(configuration: Configuration, readiness: Readiness, logger: Logger,
                onBatch: (@Sendable (SinkService.BatchReport) -> Void)? = nil) throws {
        self.configuration = configuration
        self.readiness = readiness
        self.logger = logger
        producer = try KafkaProducer(configuration: configuration.kafka)
        writers = try KafkaSinkWriters(
            count: configuration.writers, kafka: configuration.kafka, groupId: configuration.group, topic: configuration.topic,
            configuration: configuration.sink, rejected: KafkaRejectedSink(producer: producer, topic: configuration.rejectedTopic),
            logger: logger, onBatch: onBatch)
        readiness.set(Self.readinessCondition, false)
    }

    public func run() async throws {
        let c = configuration
        logger.info("sink starting", metadata: [
            "group": "\(c.group)", "topic": "\(c.topic)", "rejected-topic": "\(c.rejectedTopic)",
            "database": "\(c.sink.databaseURL)", "writers": "\(c.writers)",
        ])
        let writers = self.writers, readiness = self.readiness
        let mirror = Task { await ReadinessMirror.run(readiness, condition: Self.readinessCondition) { writers.isReady } }
        let admin = KafkaAdmin(configuration: c.kafka)
        let lag = Task {
            await ConsumerLagGauge.run(group: c.group, every: c.lagInterval) {
                try await admin.consumerLag(groupId: c.group, topics: [c.topic])
                    .map { ConsumerLagGauge.Sample(topic: $0.topic, partition: $0.partition, lag: $0.lag) }
            }
        }
        defer {
            mirror.cancel()
            lag.cancel()
        }
        // Each writer returns once its batch in flight is finished (graceful shutdown reaches the children).
        let outcome: Result<Void, any Error>
        do {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for service in writers.services { group.addTask { try await service.run() } }
                try await group.waitForAll()
            }
            outcome = .success(())
        } catch { outcome = .failure(error) }
        readiness.set(Self.readinessCondition, false)
        // In-flight batches finished (or abandoned uncommitted while the database was down): commit stored offsets,
        // leave the group, flush rejections.
        let closed = await writers.close(deadline: max(.seconds(1), c.shutdownDeadline / 2))
        _ = await producer.flush(deadline: .seconds(5))
        producer.close(timeout: .seconds(2))
        logger.info("sink stopped", metadata: ["consumer-closed-cleanly": "\(closed)"])
        try outcome.get()
    }
}
