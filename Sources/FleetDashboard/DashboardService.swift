import AppStoreVerification
import EntitlementDomain
import FleetKafka
import FleetOperations
import Foundation
import Logging
import Metrics
import ServiceLifecycle
import Synchronization

/// What `fleet dashboard` runs: which topics, where to start, where to listen.
public struct DashboardConfiguration: Sendable {
    public var kafka: KafkaConfiguration
    public var resultTopic: String
    public var rejectedTopic: String
    /// Records with a Kafka timestamp before this time (ms since the epoch) are skipped; nil reads everything retained.
    public var sinceMillis: Int64?
    public var host: String
    /// 0 picks a free port (see `DashboardState.boundPort`).
    public var port: Int
    public var limits: DashboardAggregator.Limits
    public var lagInterval: Duration

    public init(kafka: KafkaConfiguration, resultTopic: String = FleetTopics.result,
                rejectedTopic: String = FleetTopics.rejected, sinceMillis: Int64? = nil, host: String = "127.0.0.1",
                port: Int = 8080, limits: DashboardAggregator.Limits = .init(), lagInterval: Duration = .seconds(2)) {
        self.kafka = kafka
        self.resultTopic = resultTopic
        self.rejectedTopic = rejectedTopic
        self.sinceMillis = sinceMillis
        self.host = host
        self.port = port
        self.limits = limits
        self.lagInterval = lagInterval
    }
}

/// The aggregates and read positions shared by the consumer service and the HTTP server.
public final class DashboardState: Sendable {
    private let aggregator: Mutex<DashboardAggregator>
    private let positions = Mutex<[TopicPartition: Int64]>([:])
    private let lag = Mutex(DashboardSummary.Lag())
    private let skipped = Mutex(0)
    private let port = Mutex<Int?>(nil)
    let readiness: Readiness
    public let sinceMillis: Int64?

    public init(limits: DashboardAggregator.Limits = .init(), sinceMillis: Int64? = nil, readiness: Readiness = Readiness()) {
        aggregator = Mutex(DashboardAggregator(limits: limits))
        self.sinceMillis = sinceMillis
        self.readiness = readiness
    }

    /// The port the HTTP server listens on, once it does.
    public var boundPort: Int? { port.withLock { $0 } }
    func setBoundPort(_ p: Int?) { port.withLock { $0 = p } }

    /// Feeds one batch of records from either topic.
    public func ingest(_ batch: [KafkaMessage], resultTopic: String) {
        var decoded: [(KafkaMessage, EntitlementEvent?)] = []
        decoded.reserveCapacity(batch.count)
        var skip = 0
        for m in batch {
            if let since = sinceMillis, let ts = m.timestampMilliseconds, ts < since { skip += 1; continue }
            if m.topic == resultTopic {
                decoded.append((m, try? EntitlementEvent(jsonBytes: m.value)))
            } else {
                decoded.append((m, nil))
            }
        }
        aggregator.withLock { a in
            for (m, event) in decoded {
                if m.topic == resultTopic {
                    if let event { a.ingest(event) } else { a.recordUndecodable() }
                } else {
                    let reason = m.headers.last { $0.key == FleetHeaders.reason }.map { String(decoding: $0.value, as: UTF8.self) }
                    a.ingestRejected(reason: reason, timestamp: m.timestampMilliseconds)
                }
            }
        }
        if skip > 0 { skipped.withLock { $0 += skip } }
        positions.withLock { p in
            for m in batch { p[m.topicPartition] = max(p[m.topicPartition] ?? 0, m.offset + 1) }
        }
    }

    public var readPositions: [TopicPartition: Int64] { positions.withLock { $0 } }
    func setLag(_ l: DashboardSummary.Lag) { lag.withLock { $0 = l } }

    public func summary(now: Int64 = EpochMillis.now()) -> DashboardSummary {
        var s = aggregator.withLock { $0.summary(now: now) }
        s.lag = lag.withLock { $0 }
        s.records.skipped = skipped.withLock { $0 }
        if let sinceMillis { s.readingFrom = String(sinceMillis) }
        return s
    }
}

/// Reads the result and rejected topics into a `DashboardState`: a consumer of its own throwaway group that never
/// stores or commits an offset, so it always starts where `auto.offset.reset=earliest` puts it (the oldest retained
/// record) and leaves no trace in the cluster. The aggregates live in memory, so reading from the beginning on every
/// start is what rebuilds them.
public struct DashboardService: Service {
    public let configuration: DashboardConfiguration
    public let state: DashboardState
    private let logger: Logger

    public init(configuration: DashboardConfiguration, state: DashboardState, logger: Logger) {
        self.configuration = configuration
        self.state = state
        self.logger = logger
    }

    public func run() async throws {
        var kafka = configuration.kafka
        kafka.autoOffsetReset = "earliest"
        if kafka.properties["enable.auto.commit"] == nil { kafka.properties["enable.auto.commit"] = "false" }
        // A topic created after the start (no rejection yet) is picked up within seconds, not librdkafka's 5 minutes.
        if kafka.properties["topic.metadata.refresh.interval.ms"] == nil { kafka.properties["topic.metadata.refresh.interval.ms"] = "10000" }
        let group = "fleet-dashboard-\(UUID().uuidString.prefix(8).lowercased())"
        let topics = [configuration.resultTopic, configuration.rejectedTopic]
        let consumer = try KafkaConsumer(configuration: kafka, groupId: group, topics: topics)
        logger.info("dashboard reading", metadata: [
            "topics": "\(topics)", "group": "\(group)",
            "from": "\(configuration.sinceMillis.map { "since \($0)" } ?? "beginning")",
        ])
        let state = self.state
        let admin = KafkaAdmin(configuration: kafka, timeout: .seconds(5))
        let resultTopic = configuration.resultTopic
        let rejectedTopic = configuration.rejectedTopic
        let interval = configuration.lagInterval
        let records = Counter(label: "fleet_dashboard_records_total")
        let lagGauge = Gauge(label: "fleet_dashboard_lag")
        let stopping = StopFlag()
        let failure: (any Error)? = await withTaskGroup(of: Void.self, returning: (any Error)?.self) { tasks in
            tasks.addTask {
                await ReadinessMirror.run(state.readiness, condition: "kafka", probe: { consumer.isReady })
            }
            tasks.addTask {
                while !Task.isCancelled {
                    let lag = await Self.measureLag(admin: admin, group: group, resultTopic: resultTopic,
                                                    rejectedTopic: rejectedTopic, positions: state.readPositions)
                    state.setLag(lag)
                    if let t = lag.total { lagGauge.record(t) }
                    try? await Task.sleep(for: interval)
                }
            }
            let failure: (any Error)? = await withGracefulShutdownHandler {
                while !Task.isCancelled && !stopping.isSet {
                    do {
                        let batch = try await consumer.nextBatch(maxMessages: 1000, timeout: .milliseconds(500))
                        if batch.isEmpty { continue }
                        state.ingest(batch, resultTopic: resultTopic)
                        records.increment(by: batch.count)
                    } catch {
                        logger.error("dashboard consumer failed", metadata: ["error": "\(error)"])
                        return error as any Error
                    }
                }
                return nil
            } onGracefulShutdown: {
                stopping.set()
            }
            tasks.cancelAll()
            return failure
        }
        state.readiness.set("kafka", false)
        _ = await consumer.close(deadline: .seconds(5))
        if let failure { throw failure }
    }

    /// Records between the dashboard's read position and each topic's end (high watermark). A partition not read yet
    /// counts from its low watermark.
    static func measureLag(admin: KafkaAdmin, group: String, resultTopic: String, rejectedTopic: String,
                           positions: [TopicPartition: Int64]) async -> DashboardSummary.Lag {
        var out = DashboardSummary.Lag()
        out.measuredAt = EpochMillis.now()
        var errors: [String] = []
        for topic in [resultTopic, rejectedTopic] {
            do {
                let parts = try await admin.consumerLag(groupId: group, topics: [topic])
                let lag = parts.reduce(Int64(0)) { sum, p in
                    let pos = max(positions[TopicPartition(topic: p.topic, partition: p.partition)] ?? p.lowWatermark, p.lowWatermark)
                    return sum + max(0, p.highWatermark - pos)
                }
                if topic == resultTopic { out.result = lag } else { out.rejected = lag }
            } catch {
                errors.append("\(topic): \(error)")
            }
        }
        if out.result != nil || out.rejected != nil { out.total = (out.result ?? 0) + (out.rejected ?? 0) }
        if !errors.isEmpty { out.error = errors.joined(separator: "; ") }
        return out
    }
}

private final class StopFlag: Sendable {
    private let flag = Mutex(false)
    var isSet: Bool { flag.withLock { $0 } }
    func set() { flag.withLock { $0 = true } }
}
