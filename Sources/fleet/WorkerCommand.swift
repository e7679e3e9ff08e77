import AppStoreVerification
import ArgumentParser
import EntitlementDomain
import FleetKafka
import FleetOperations
import FleetWorker
import Foundation
import Logging
import ServiceLifecycle

/// Flags shared by the long-running processes (worker, sink): config file, Kafka, metrics, logging, shutdown.
struct ServiceOptions: ParsableArguments {
    @Option(help: "YAML config file (default: $FLEET_CONFIG, else config/fleet.yaml when present).")
    var config: String?

    @Option(help: "Kafka bootstrap servers, host:port[,host:port...].")
    var bootstrapServers: String?

    @Option(help: "Consumer group.")
    var group: String?

    @Option(name: .customLong("kafka-property"), help: "Any librdkafka property, key=value (repeatable), e.g. security.protocol=SASL_SSL.")
    var kafkaProperties: [String] = []

    @Option(help: "Port for /metrics, /healthz and /readyz.")
    var metricsPort: Int?

    @Option(help: "Address the operations port binds to (default 127.0.0.1; the Helm chart sets 0.0.0.0).")
    var metricsHost: String?

    @Option(help: """
        When a committed position is no longer on the broker (retention deleted unread records): fail (default: \
        pause that partition, report not ready, until an operator restarts with earliest or latest), earliest or \
        latest (continue there, skipping what was lost). Every reset is logged as an error and counted.
        """)
    var offsetResetPolicy: String?

    @Option(help: """
        Seconds an owned partition may have messages waiting without delivering any (while this process takes what         it is given) before the consumer reports a stall: error log, fleet_consumer_stalls_total, not ready, and         /healthz 503 after twice as long so that an orchestrator restarts it. 0 turns the watch off. Default 90.
        """)
    var stallTimeoutSeconds: Int?

    @Option(help: "Seconds allowed for a graceful shutdown after SIGTERM.")
    var shutdownDeadlineSeconds: Int?

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel: String?

    @Option(help: "Log format: json or text.")
    var logFormat: String?
}

struct Worker: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Verify raw App Store JWS from Kafka and emit verified entitlement events (or rejections).")

    @OptionGroup var service: ServiceOptions

    @Option(name: .customLong("input-topic"), help: "Raw topic to consume (repeatable).")
    var inputTopics: [String] = []

    @Option(help: "Topic for verified entitlement events.")
    var resultTopic: String?

    @Option(help: "Topic for rejected inputs (original bytes, reason in headers).")
    var rejectedTopic: String?

    @Option(help: "Verification threads (default: every core).")
    var threads: Int?

    @OptionGroup var verification: VerificationOptions

    func run() async throws {
        MemoryTuning.fixMmapThreshold(environment: ProcessInfo.processInfo.environment)
        let settings: FleetSettings
        do {
            settings = try await FleetSettings(section: "worker", configFile: service.config)
        } catch {
            throw ValidationError("\(error)")
        }
        FleetLogging.bootstrap(format: settings.string("log-format", flag: service.logFormat, default: "json")!,
                               level: settings.string("log-level", flag: service.logLevel, default: "info")!)
        let logger = Logger(label: "fleet.worker")
        let resolved: WorkerConfiguration
        let metricsPort: Int
        do {
            resolved = try await resolve(settings)
            metricsPort = try settings.int("metrics-port", flag: service.metricsPort, default: 9090)
        } catch {
            throw ValidationError("\(error)")
        }
        FleetMetrics.bootstrap()
        let readiness = Readiness()
        let worker = try VerifierWorker(configuration: resolved, readiness: readiness, logger: logger)
        let ops = try operationsServer(settings, service, port: metricsPort, readiness: readiness, logger: logger)
        let group = ServiceGroup(configuration: .init(
            services: [
                .init(service: worker, successTerminationBehavior: .gracefullyShutdownGroup, failureTerminationBehavior: .gracefullyShutdownGroup),
                .init(service: ops),
            ],
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger))
        try await group.run()
    }

    func resolve(_ s: FleetSettings) async throws -> WorkerConfiguration {
        let bootstrap = try s.requiredString("bootstrap-servers", flag: service.bootstrapServers)
        let topics = s.strings("input-topic", flag: inputTopics, default: [FleetTopics.raw])
        let policy = try verificationPolicy(
            rootPaths: s.strings("root-certificate", flag: verification.rootCertificates),
            environments: s.strings("environment", flag: verification.environments, default: ["Production"]),
            validationTime: s.string("validation-time", flag: verification.validationTime, default: "signed-date")!,
            bundleId: try s.requiredString("bundle-id", flag: verification.bundleId),
            appAppleId: try s.optionalInt64("app-apple-id", flag: verification.appAppleId),
            allowUnsignedEnvironments: try s.bool("allow-unsigned-environments", flag: verification.allowUnsignedEnvironments),
            maxReceiptBytes: try s.int(
                "max-receipt-bytes", flag: verification.maxReceiptBytes, default: VerificationPolicy.defaultMaxReceiptBytes),
            trustedIntermediatePaths: s.strings("trusted-intermediate", flag: verification.trustedIntermediates))
        var catalogue = ProductCatalogue()
        if let path = s.string("products", flag: verification.products) {
            catalogue = try ProductCatalogue.load(path: path)
        }
        // Memory: raw inputs are large (a notification is 10-20 KB), so the worker keeps a modest prefetch:
        // 2,000 messages handed over but not yet processed, and librdkafka's own fetch queue at 10 MB (its 64 MB
        // default alone would be most of the worker's memory) filled by small fetches (128 KB per partition, 4 MB per
        // request). A full queue makes librdkafka 2.0.2 stop fetching for up to a second; the consumer wakes it once
        // the queue is drained (`ConsumerState.stalledFetchPositions`). Before that wake, 20 MB lasted ~0.45 s on a
        // machine verifying 7,500 notifications/s per core, and the worker idled ~0.4 s of every cycle (`fleet bench
        // worker`, 3 alternated pairs: 0.75-0.80 x single-thread verify without the wake, 1.26-1.44 x with it); with
        // the wake, 10 MB ran as fast as 20 MB at ~8 MB less peak RSS (129-132 MB against 139 MB; 6 MB sometimes
        // starved). A fetch request asks for at most 4 MB instead of the sink's 8 MB: librdkafka holds a response's
        // whole buffer while it parses it (9 alternated pairs: peak RSS 129.1-140.7 MB, mean ~136, against
        // 140.2-145.9, mean ~143). Outputs waiting for their delivery report are bounded at 10,000 (a rejected record
        // carries its 10-20 KB input; the producer's 100,000 default could hold far more than the whole worker's
        // budget), beyond which emission waits. Measured with `fleet bench worker`; each can be overridden through
        // kafka properties.
        var properties = try s.kafkaProperties(flag: service.kafkaProperties)
        properties = KafkaConfiguration.withBoundedFetch(properties, requestBytes: 4 << 20, queueKilobytes: 10 << 10)
        var kafka = KafkaConfiguration(
            bootstrapServers: bootstrap, clientId: "fleet-worker", properties: properties, maxInFlightMessages: 10_000,
            offsetResetPolicy: try offsetResetPolicy(s, service), maxBufferedMessages: 2_000)
        kafka.stallTimeoutSeconds = try stallTimeoutSeconds(s, service)
        return WorkerConfiguration(
            kafka: kafka, group: s.string("group", flag: service.group, default: "fleet-verifiers")!,
            inputTopics: topics,
            resultTopic: s.string("result-topic", flag: resultTopic, default: FleetTopics.result)!,
            rejectedTopic: s.string("rejected-topic", flag: rejectedTopic, default: FleetTopics.rejected)!,
            policy: policy, catalogue: catalogue,
            requireKnownProducts: try s.bool("require-known-products", flag: verification.requireKnownProducts),
            threads: try s.int("threads", flag: threads, default: ProcessInfo.processInfo.activeProcessorCount),
            shutdownDeadline: .seconds(try s.int("shutdown-deadline-seconds", flag: service.shutdownDeadlineSeconds, default: 25)),
            revocation: try verification.revocation.checker(
                lookup: { s.string($0, flag: $1) }, logger: Logger(label: "fleet.worker.revocation")))
    }
}

/// `--offset-reset-policy` / `offset-reset-policy` / `FLEET_OFFSET_RESET_POLICY` (default fail).
func offsetResetPolicy(_ s: FleetSettings, _ service: ServiceOptions) throws -> OffsetResetPolicy {
    let text = s.string("offset-reset-policy", flag: service.offsetResetPolicy, default: "fail")!
    guard let policy = OffsetResetPolicy(rawValue: text) else {
        throw FleetSettings.Error.invalidValue(key: "offset-reset-policy", value: text, expected: "fail, earliest or latest")
    }
    return policy
}

/// `--stall-timeout-seconds` / `stall-timeout-seconds` / `FLEET_STALL_TIMEOUT_SECONDS` (default 90, 0 = off).
func stallTimeoutSeconds(_ s: FleetSettings, _ service: ServiceOptions) throws -> Int {
    let value = try s.int("stall-timeout-seconds", flag: service.stallTimeoutSeconds, default: 90)
    guard value >= 0 else {
        throw FleetSettings.Error.invalidValue(key: "stall-timeout-seconds", value: String(value), expected: "0 (off) or more seconds")
    }
    return value
}

/// The operations server (`/metrics`, `/healthz`, `/readyz`) of a long-running process, on `metrics-host` (default
/// loopback) and `port`; `/readyz` lists every offset reset and every open consumer stall of this process, and
/// `/healthz` fails once a stall outlasts twice its timeout.
func operationsServer(_ s: FleetSettings, _ service: ServiceOptions, port: Int, readiness: Readiness, logger: Logger) throws -> OperationsServer {
    readiness.addDetails { OffsetResets.report }
    readiness.addDetails { ConsumerStalls.report }
    readiness.addLivenessCheck("consumer-stalled") { ConsumerStalls.isLive }
    return OperationsServer(host: s.string("metrics-host", flag: service.metricsHost, default: "127.0.0.1")!,
                            port: port, readiness: readiness, logger: logger)
}
