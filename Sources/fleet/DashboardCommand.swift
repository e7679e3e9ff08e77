import AppStoreVerification
import ArgumentParser
import EntitlementDomain
import FleetDashboard
import FleetKafka
import FleetOperations
import Foundation
import Logging
import ServiceLifecycle

/// `fleet dashboard`: a live web dashboard of the result topic (and the rejected topic's reasons).
struct Dashboard: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Serve a live web dashboard of the result and rejected topics.",
        discussion: """
            Reads the topics with a throwaway consumer group that never commits, keeps the aggregates in memory and \
            serves GET / (the page), /api/summary (JSON), /healthz, /readyz and /metrics. By default it reads every \
            record still retained, from the beginning of each partition (it stores no position, so every start \
            rebuilds the aggregates); --since reads only records with a Kafka timestamp at or after TIME. Settings \
            also come from FLEET_* environment variables and the `dashboard:` section of $FLEET_CONFIG (flags win); \
            librdkafka properties (security, credentials) from FLEET_KAFKA_* or the config file's kafka.properties.
            """)

    @Option(help: "Kafka bootstrap servers, host:port[,host:port...].")
    var bootstrapServers: String?

    @Option(help: "Topic of verified entitlement events (default: entitlements.verified).")
    var resultTopic: String?

    @Option(help: "Topic of rejected inputs, counted by their reason header (default: appstore.rejected).")
    var rejectedTopic: String?

    @Option(help: "HTTP port for the page, /api/summary, /healthz, /readyz and /metrics (default: 8080).")
    var port: Int?

    @Option(help: "Address that port binds to (default: 127.0.0.1; the Helm chart sets 0.0.0.0).")
    var host: String?

    @Flag(help: "Read from the beginning of the topics (the default: the dashboard stores no position).")
    var fromBeginning = false

    @Option(help: ArgumentHelp("Only records at or after TIME: ISO 8601 (2026-11-23T09:00:00Z or 2026-11-23), milliseconds since the epoch, or an age such as 90m, 6h, 2d.", valueName: "time"))
    var since: String?

    func validate() throws {
        if fromBeginning && since != nil { throw ValidationError("--from-beginning and --since exclude each other") }
        if let since, Self.parseSince(since, now: Date()) == nil {
            throw ValidationError("invalid --since '\(since)': expected ISO 8601 (2026-11-23T09:00:00Z or 2026-11-23), epoch milliseconds, or an age like 90m, 6h, 2d")
        }
        if let port, !(0...65535).contains(port) { throw ValidationError("invalid --port \(port): expected 0...65535") }
    }

    func run() async throws {
        let settings: FleetSettings
        do {
            settings = try await FleetSettings(section: "dashboard", configFile: nil)
        } catch {
            throw ValidationError("\(error)")
        }
        FleetLogging.bootstrap(format: settings.string("log-format", flag: nil, default: "json")!,
                               level: settings.string("log-level", flag: nil, default: "info")!)
        let logger = Logger(label: "fleet.dashboard")
        let config: DashboardConfiguration
        do {
            let sinceText = fromBeginning ? nil : settings.string("since", flag: since)
            var sinceMillis: Int64?
            if let sinceText {
                guard let d = Self.parseSince(sinceText, now: Date()) else {
                    throw FleetSettings.Error.invalidValue(key: "since", value: sinceText, expected: "ISO 8601, epoch milliseconds or an age like 6h")
                }
                sinceMillis = EpochMillis.millis(d)
            }
            let port = try settings.int("port", flag: self.port, default: 8080)
            guard (0...65535).contains(port) else {
                throw FleetSettings.Error.invalidValue(key: "port", value: String(port), expected: "0...65535")
            }
            let kafka = KafkaConfiguration(
                bootstrapServers: try settings.requiredString("bootstrap-servers", flag: bootstrapServers),
                clientId: "fleet-dashboard", properties: try settings.kafkaProperties(flag: []),
                // A viewer never blocks on records deleted before it read them; the reset is still logged and counted.
                offsetResetPolicy: .earliest)
            config = DashboardConfiguration(
                kafka: kafka,
                resultTopic: settings.string("result-topic", flag: resultTopic, default: FleetTopics.result)!,
                rejectedTopic: settings.string("rejected-topic", flag: rejectedTopic, default: FleetTopics.rejected)!,
                sinceMillis: sinceMillis, host: settings.string("host", flag: host, default: "127.0.0.1")!, port: port)
        } catch {
            throw ValidationError("\(error)")
        }
        FleetMetrics.bootstrap()
        let state = DashboardState(limits: config.limits, sinceMillis: config.sinceMillis)
        let service = DashboardService(configuration: config, state: state, logger: logger)
        let server = DashboardServer(host: config.host, port: config.port, state: state, logger: logger)
        logger.info("dashboard listening", metadata: ["url": "http://\(config.host == "0.0.0.0" ? "localhost" : config.host):\(config.port)/", "host": "\(config.host)"])
        let group = ServiceGroup(configuration: .init(
            services: [
                .init(service: service, successTerminationBehavior: .gracefullyShutdownGroup, failureTerminationBehavior: .gracefullyShutdownGroup),
                .init(service: server, failureTerminationBehavior: .gracefullyShutdownGroup),
            ],
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger))
        try await group.run()
    }

    /// ISO 8601 date-time or date (UTC), epoch milliseconds, or an age (`90s`, `90m`, `6h`, `2d`) before `now`.
    static func parseSince(_ text: String, now: Date) -> Date? {
        let t = text.trimmingCharacters(in: .whitespaces)
        guard !t.isEmpty else { return nil }
        if let ms = Int64(t), ms >= 0 { return EpochMillis.date(ms) }
        if let unit = t.last, let n = Double(t.dropLast()), n >= 0 {
            let seconds: Double? = ["s": 1, "m": 60, "h": 3600, "d": 86400][String(unit)]
            if let seconds { return now.addingTimeInterval(-n * seconds) }
        }
        let full = ISO8601DateFormatter()
        if let d = full.date(from: t) { return d }
        full.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        if let d = full.date(from: t) { return d }
        let day = ISO8601DateFormatter()
        day.formatOptions = [.withFullDate]
        return day.date(from: t)
    }
}
