import AppStoreVerification
import ArgumentParser
import EntitlementDomain
import FleetIngest
import FleetKafka
import FleetOperations
import FleetWorker
import Foundation
import Logging
import ServiceLifecycle

/// `fleet ingest`: the HTTP front door for App Store Server Notifications V2 and the apps' purchases.
struct Ingest: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "HTTP front door: accept Apple's notifications and the apps' transactions, publish them to the raw topic.",
        discussion: """
            POST <notifications-path> (default /apple/notifications): Apple's {"signedPayload": "..."} body, published \
            to the raw topic unchanged; 200 only after the broker's delivery report, 503 + Retry-After when it cannot \
            take it in time. POST <transactions-path> (default /v1/transactions): {"signedTransaction": "..."} or \
            {"receipt-data": "..."}, verified inline with the workers' policy (200 verified / 422 rejected, both after \
            publishing). Settings: --config file section `ingest:` (verification keys fall back to `worker:`) < FLEET_* \
            environment < flags.
            """)

    @Option(help: "YAML config file (default: $FLEET_CONFIG).")
    var config: String?

    @Option(help: "Kafka bootstrap servers, host:port[,host:port...].")
    var bootstrapServers: String?

    @Option(name: .customLong("kafka-property"), help: "Any librdkafka property, key=value (repeatable).")
    var kafkaProperties: [String] = []

    @Option(help: "Raw topic to publish to (default appstore.raw).")
    var topic: String?

    @Option(help: "Address the HTTP endpoints listen on (default 0.0.0.0: Apple and the apps must reach them).")
    var host: String?

    @Option(help: "HTTP port of the endpoints (default 8080).")
    var port: Int?

    @Option(help: "Path of Apple's notification endpoint (default /apple/notifications).")
    var notificationsPath: String?

    @Option(help: "Path of the transactions endpoint (default /v1/transactions).")
    var transactionsPath: String?

    @Option(help: "Largest accepted body in bytes (default 65536); larger bodies get 413.")
    var maxBodyBytes: Int?

    @Option(help: "Requests handled at once (default 1024); beyond it 503 + Retry-After.")
    var maxInFlight: Int?

    @Option(help: "Threads verifying /v1/transactions (default: one per core).")
    var verifierThreads: Int?

    @Option(help: "Event-loop threads of the HTTP server, each handling its connections' requests (default: one per core).")
    var eventLoopThreads: Int?

    @Option(help: "Milliseconds a request may wait for its delivery report before 503 (default 5000).")
    var publishTimeoutMs: Int?

    @Option(help: "Seconds a client may take to send its body (default 10).")
    var requestTimeoutSeconds: Int?

    @Option(help: "Seconds an idle connection is kept (default 60).")
    var idleTimeoutSeconds: Int?

    @Option(help: "Retry-After seconds sent with 503 (default 5).")
    var retryAfterSeconds: Int?

    @Option(help: "File holding the bearer token required on the transactions endpoint (none: no check).")
    var apiTokenFile: String?

    @Option(help: "Port for /metrics, /healthz and /readyz (default 9092).")
    var metricsPort: Int?

    @Option(help: "Address the operations port binds to (default 127.0.0.1; the Helm chart sets 0.0.0.0).")
    var metricsHost: String?

    @Option(help: "Seconds allowed for a graceful shutdown after SIGTERM (default 25).")
    var shutdownDeadlineSeconds: Int?

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel: String?

    @Option(help: "Log format: json or text.")
    var logFormat: String?

    @OptionGroup var verification: VerificationOptions

    func run() async throws {
        let settings: FleetSettings
        let workerSettings: FleetSettings
        do {
            settings = try await FleetSettings(section: "ingest", configFile: config)
            workerSettings = try await FleetSettings(section: "worker", configFile: config)
        } catch {
            throw ValidationError("\(error)")
        }
        FleetLogging.bootstrap(format: settings.string("log-format", flag: logFormat, default: "json")!,
                               level: settings.string("log-level", flag: logLevel, default: "info")!)
        let logger = Logger(label: "fleet.ingest")
        let resolved: IngestConfiguration
        let processor: InputProcessor
        let opsPort: Int
        let opsHost = settings.string("metrics-host", flag: metricsHost, default: "127.0.0.1")!
        do {
            resolved = try resolve(settings)
            try resolved.validate()
            processor = try resolveProcessor(settings, worker: workerSettings)
            opsPort = try settings.int("metrics-port", flag: metricsPort, default: 9092)
        } catch {
            throw ValidationError("\(error)")
        }
        FleetMetrics.bootstrap()
        let readiness = Readiness()
        let ingest = try IngestService(configuration: resolved, processor: processor, readiness: readiness, logger: logger)
        let ops = OperationsServer(host: opsHost, port: opsPort, readiness: readiness, logger: logger)
        let group = ServiceGroup(configuration: .init(
            services: [
                .init(service: ingest, successTerminationBehavior: .gracefullyShutdownGroup, failureTerminationBehavior: .gracefullyShutdownGroup),
                .init(service: ops),
            ],
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger))
        try await group.run()
    }

    func resolve(_ s: FleetSettings) throws -> IngestConfiguration {
        let bootstrap = try s.requiredString("bootstrap-servers", flag: bootstrapServers)
        var token: [UInt8]?
        if let path = s.string("api-token-file", flag: apiTokenFile) {
            // The file's content is never echoed: errors name the file only.
            guard let data = FileManager.default.contents(atPath: path) else {
                throw FleetSettings.Error.invalidValue(key: "api-token-file", value: path, expected: "a readable file")
            }
            let text = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            guard !text.isEmpty else {
                throw FleetSettings.Error.invalidValue(key: "api-token-file", value: path, expected: "a file holding a token")
            }
            token = Array(text.utf8)
        }
        let kafka = KafkaConfiguration(bootstrapServers: bootstrap, clientId: "fleet-ingest",
                                       properties: try s.kafkaProperties(flag: kafkaProperties))
        var configuration = IngestConfiguration(
            kafka: kafka, topic: s.string("topic", flag: topic, default: FleetTopics.raw)!,
            host: s.string("host", flag: host, default: "0.0.0.0")!,
            port: try s.int("port", flag: port, default: 8080),
            notificationsPath: s.string("notifications-path", flag: notificationsPath, default: "/apple/notifications")!,
            transactionsPath: s.string("transactions-path", flag: transactionsPath, default: "/v1/transactions")!,
            maxBodyBytes: try s.int("max-body-bytes", flag: maxBodyBytes, default: 64 * 1024),
            maxInFlight: try s.int("max-in-flight", flag: maxInFlight, default: 1024),
            publishTimeout: .milliseconds(try s.int("publish-timeout-ms", flag: publishTimeoutMs, default: 5000)),
            requestTimeout: .seconds(try s.int("request-timeout-seconds", flag: requestTimeoutSeconds, default: 10)),
            idleTimeout: .seconds(try s.int("idle-timeout-seconds", flag: idleTimeoutSeconds, default: 60)),
            retryAfterSeconds: try s.int("retry-after-seconds", flag: retryAfterSeconds, default: 5),
            apiToken: token,
            shutdownDeadline: .seconds(try s.int("shutdown-deadline-seconds", flag: shutdownDeadlineSeconds, default: 25)))
        configuration.verifierThreads = try s.int("verifier-threads", flag: verifierThreads, default: configuration.verifierThreads)
        configuration.eventLoopThreads = try s.int("event-loop-threads", flag: eventLoopThreads, default: configuration.eventLoopThreads)
        return configuration
    }

    /// The workers' verification entry point with the workers' policy keys (`ingest:` first, then `worker:`).
    func resolveProcessor(_ s: FleetSettings, worker w: FleetSettings) throws -> InputProcessor {
        func string(_ key: String, _ flag: String?) -> String? { w.string(key, flag: s.string(key, flag: flag)) }
        func strings(_ key: String, _ flag: [String]) -> [String] { w.strings(key, flag: s.strings(key, flag: flag)) }
        guard let bundle = string("bundle-id", verification.bundleId) else { throw FleetSettings.Error.missing(key: "bundle-id") }
        let policy = try verificationPolicy(
            rootPaths: strings("root-certificate", verification.rootCertificates), environments: strings("environment", verification.environments),
            validationTime: string("validation-time", verification.validationTime) ?? "signed-date", bundleId: bundle,
            appAppleId: try s.optionalInt64("app-apple-id", flag: verification.appAppleId) ?? w.optionalInt64("app-apple-id", flag: nil),
            allowUnsignedEnvironments: try s.bool("allow-unsigned-environments", flag: verification.allowUnsignedEnvironments)
                || w.bool("allow-unsigned-environments", flag: false),
            maxReceiptBytes: try s.int(
                "max-receipt-bytes", flag: verification.maxReceiptBytes,
                default: try w.int("max-receipt-bytes", flag: nil, default: VerificationPolicy.defaultMaxReceiptBytes)),
            trustedIntermediatePaths: strings("trusted-intermediate", verification.trustedIntermediates))
        var catalogue = ProductCatalogue()
        if let path = string("products", verification.products) { catalogue = try ProductCatalogue.load(path: path) }
        let requireKnown = try s.bool("require-known-products", flag: verification.requireKnownProducts)
            || w.bool("require-known-products", flag: false)
        let revocation = try verification.revocation.checker(
            lookup: { string($0, $1) }, logger: Logger(label: "fleet.ingest.revocation"))
        return InputProcessor(
            verifier: SignedDataVerifier(policy: policy, revocation: revocation),
            mapper: EntitlementMapper(catalogue: catalogue, requireKnownProducts: requireKnown))
    }
}
