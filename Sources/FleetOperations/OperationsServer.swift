import Foundation
import Hummingbird
import Logging
import Metrics
import Prometheus
import ServiceLifecycle
import Synchronization

/// The process-wide Prometheus registry behind swift-metrics. Call `bootstrap()` once at process start.
public enum FleetMetrics {
    private static let state = Mutex<PrometheusCollectorRegistry?>(nil)

    /// Installs Prometheus as the swift-metrics backend (idempotent) and returns its registry.
    @discardableResult
    public static func bootstrap() -> PrometheusCollectorRegistry {
        state.withLock { current in
            if let current { return current }
            let registry = PrometheusCollectorRegistry()
            var factory = PrometheusMetricsFactory(registry: registry)
            factory.defaultDurationHistogramBuckets = [
                .microseconds(50), .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1),
                .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
                .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(2.5), .seconds(5),
            ]
            factory.defaultValueHistogramBuckets = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000]
            MetricsSystem.bootstrap(factory)
            current = registry
            return registry
        }
    }

    public static var registry: PrometheusCollectorRegistry { bootstrap() }
}

/// Readiness as a thread-safe flag set by the service that knows (consumer assigned, database reachable, ...).
public final class Readiness: Sendable {
    private let conditions = Mutex<[String: Bool]>([:])
    private let detailSources = Mutex<[@Sendable () -> [String]]>([])
    private let livenessChecks = Mutex<[(name: String, check: @Sendable () -> Bool)]>([])
    private let gauge = Gauge(label: "fleet_ready")

    public init() { gauge.record(0) }

    /// Sets one named condition; the process is ready when every condition set so far is true.
    public func set(_ name: String, _ value: Bool) {
        let ready = conditions.withLock { c -> Bool in
            c[name] = value
            return c.values.allSatisfy { $0 }
        }
        gauge.record(ready ? 1 : 0)
    }

    public var isReady: Bool {
        conditions.withLock { c in !c.isEmpty && c.values.allSatisfy { $0 } }
    }

    /// Adds lines that `/readyz` prints whether ready or not (e.g. offset resets: a ready process may still have
    /// skipped records, and an operator must see it).
    public func addDetails(_ source: @escaping @Sendable () -> [String]) {
        detailSources.withLock { $0.append(source) }
    }

    public var details: [String] {
        detailSources.withLock { $0 }.flatMap { $0() }
    }

    /// Adds a liveness check: `/healthz` answers 503 naming it while it returns false (e.g. a consumer stalled far
    /// past its timeout), so that an orchestrator restarts the process.
    public func addLivenessCheck(_ name: String, _ check: @escaping @Sendable () -> Bool) {
        livenessChecks.withLock { $0.append((name, check)) }
    }

    /// Names of the liveness checks that fail now (empty: live).
    public var notLive: [String] {
        livenessChecks.withLock { $0 }.filter { !$0.check() }.map(\.name)
    }

    /// Names of the conditions that are false, for `/readyz` bodies and logs.
    public var failing: [String] {
        conditions.withLock { c in c.filter { !$0.value }.map(\.key).sorted() }
    }
}

/// `GET /metrics` (Prometheus text), `GET /healthz` (200 while running), `GET /readyz` (200 / 503), as a Service.
public struct OperationsServer: Service {
    public let host: String
    public let port: Int
    public let readiness: Readiness
    private let logger: Logger

    public init(host: String = "127.0.0.1", port: Int, readiness: Readiness, logger: Logger) {
        self.host = host
        self.port = port
        self.readiness = readiness
        self.logger = logger
    }

    public func run() async throws {
        let registry = FleetMetrics.registry
        let readiness = self.readiness
        let router = Router()
        router.get("/metrics") { _, _ -> Response in
            var buffer = [UInt8]()
            buffer.reserveCapacity(16 * 1024)
            registry.emit(into: &buffer)
            return Response(
                status: .ok,
                headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(bytes: buffer))
            )
        }
        router.get("/healthz") { _, _ -> Response in
            let failing = readiness.notLive
            if failing.isEmpty { return Response(status: .ok, body: .init(byteBuffer: ByteBuffer(string: "ok\n"))) }
            let text = "not live: " + failing.joined(separator: ", ") + "\n" + readiness.details.map { $0 + "\n" }.joined()
            return Response(status: .serviceUnavailable, body: .init(byteBuffer: ByteBuffer(string: text)))
        }
        router.get("/readyz") { _, _ -> Response in
            let details = readiness.details.map { $0 + "\n" }.joined()
            if readiness.isReady {
                return Response(status: .ok, body: .init(byteBuffer: ByteBuffer(string: "ready\n" + details)))
            }
            let failing = readiness.failing
            let text = "not ready: " + (failing.isEmpty ? "starting" : failing.joined(separator: ", ")) + "\n" + details
            return Response(status: .serviceUnavailable, body: .init(byteBuffer: ByteBuffer(string: text)))
        }
        var quiet = logger
        quiet.logLevel = max(logger.logLevel, .notice)
        let app = Application(
            router: router,
            configuration: .init(address: .hostname(host, port: port), serverName: "fleet"),
            logger: quiet
        )
        try await app.runService(gracefulShutdownSignals: [])
    }
}

/// Publishes a consumer group's lag as `fleet_consumer_lag{group,topic,partition}` at an interval, until cancelled.
public enum ConsumerLagGauge {
    public struct Sample: Sendable {
        public var topic: String
        public var partition: Int32
        public var lag: Int64
        public init(topic: String, partition: Int32, lag: Int64) {
            self.topic = topic
            self.partition = partition
            self.lag = lag
        }
    }

    public static func run(group: String, every interval: Duration, fetch: @Sendable () async throws -> [Sample]) async {
        while !Task.isCancelled {
            if let samples = try? await fetch() {
                for s in samples {
                    Gauge(label: "fleet_consumer_lag", dimensions: [("group", group), ("topic", s.topic), ("partition", String(s.partition))]).record(s.lag)
                }
            }
            try? await Task.sleep(for: interval)
        }
    }
}

/// Keeps a `Readiness` condition in step with a probe, until cancelled.
public enum ReadinessMirror {
    public static func run(_ readiness: Readiness, condition: String, every interval: Duration = .milliseconds(500), probe: @Sendable () -> Bool) async {
        while !Task.isCancelled {
            readiness.set(condition, probe())
            try? await Task.sleep(for: interval)
        }
    }
}
