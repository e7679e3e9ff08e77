import AppStoreServerAPI
import ArgumentParser
import EntitlementDomain
import FleetKafka
import FleetOperations
import FleetResponder
import FleetSink
import Foundation
import Logging
import ServiceLifecycle

/// `fleet responder`: a service that answers CONSUMPTION_REQUESTs (Send Consumption Information v2).
struct Responder: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Answer App Store CONSUMPTION_REQUESTs from the result topic with Consumption Information, recorded in PostgreSQL.",
        discussion: """
            Reads verified events from --result-topic (its own consumer group), records every CONSUMPTION_REQUEST once
            in consumption_answers (run `fleet migrate` first), and sends Consumption Information v2 within Apple's
            12-hour window: customerConsented from consumption_consent (false unless the app recorded consent),
            deliveryStatus DELIVERED when the purchase was credited or granted, consumptionPercentage from
            consumption_usage when the app recorded it, refundPreference from --refund-preference. Each request is
            sent at most once; 429/5xx/network failures are retried until the window closes.
            """
    )

    @OptionGroup var api: AppStoreAPIOptions

    @Option(help: "Kafka bootstrap servers, host:port[,host:port...].") var bootstrapServers: String?
    @Option(name: .customLong("kafka-property"), help: "Any librdkafka property, key=value (repeatable).") var kafkaProperties: [String] = []
    @Option(help: "Consumer group (default fleet-responder).") var group: String?
    @Option(help: "Result topic (default entitlements.verified).") var resultTopic: String?
    @Option(name: .customLong("database-url"), help: "Sink database, postgres:// URL (env FLEET_DATABASE_URL).") var databaseURL: String?
    @Option(help: "refundPreference to send: none, decline, grant-full, grant-prorated (default none).") var refundPreference: String?
    @Flag(help: "The app offers a free sample or trial (sampleContentProvided).") var sampleContentProvided = false
    @Option(help: "Seconds before a retryable failure is tried again (default 60).") var retryIntervalSeconds: Int?
    @Option(help: "Port for /metrics, /healthz and /readyz (default 9093).") var metricsPort: Int?
    @Option(help: "Address the operations port binds to (default 127.0.0.1).") var metricsHost: String?
    @Option(help: "Log level (default info).") var logLevel: String?
    @Option(help: "Log format: json or text (default json).") var logFormat: String?

    func run() async throws {
        let s = try await api.settings()
        FleetLogging.bootstrap(format: s.string("log-format", flag: logFormat, default: "json")!,
                               level: s.string("log-level", flag: logLevel, default: "info")!)
        let logger = Logger(label: "fleet.responder")
        let client = try api.client(s, progress: false)
        let config: ResponderConfiguration
        let port: Int
        do {
            let preferenceText = s.string("refund-preference", flag: refundPreference, default: "none")!
            let preference: ConsumptionRequest.RefundPreference?
            switch preferenceText.lowercased() {
            case "none": preference = nil
            case "decline": preference = .decline
            case "grant-full": preference = .grantFull
            case "grant-prorated": preference = .grantProrated
            default:
                throw FleetSettings.Error.invalidValue(key: "refund-preference", value: preferenceText, expected: "none, decline, grant-full or grant-prorated")
            }
            let kafka = KafkaConfiguration(
                bootstrapServers: try s.requiredString("bootstrap-servers", flag: bootstrapServers), clientId: "fleet-responder",
                properties: try s.kafkaProperties(flag: kafkaProperties))
            config = ResponderConfiguration(
                kafka: kafka, group: s.string("group", flag: group, default: "fleet-responder")!,
                resultTopic: s.string("result-topic", flag: resultTopic, default: FleetTopics.result)!,
                databaseURL: try DatabaseURL(try s.requiredString("database-url", flag: databaseURL)),
                policy: ConsumptionPolicy(refundPreference: preference,
                                          sampleContentProvided: try s.bool("sample-content-provided", flag: sampleContentProvided)),
                retryInterval: .seconds(try s.int("retry-interval-seconds", flag: retryIntervalSeconds, default: 60)))
            port = try s.int("metrics-port", flag: metricsPort, default: 9093)
        } catch {
            throw ValidationError("\(error)")
        }
        FleetMetrics.bootstrap()
        let readiness = Readiness()
        readiness.set("database", false)
        let responder = ConsumptionResponder(configuration: config, client: client, logger: logger,
                                             onDatabaseReady: { readiness.set("database", $0) })
        let group = ServiceGroup(configuration: .init(
            services: [
                .init(service: responder, successTerminationBehavior: .gracefullyShutdownGroup, failureTerminationBehavior: .gracefullyShutdownGroup),
                .init(service: OperationsServer(host: s.string("metrics-host", flag: metricsHost, default: "127.0.0.1")!,
                                                port: port, readiness: readiness, logger: logger)),
            ],
            gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        try await group.run()
    }
}
