import ArgumentParser
import EntitlementDomain
import Foundation
import FleetOperations
import FleetSink
import Logging
import PostgresNIO
import FleetKafka
import ServiceLifecycle

/// Reads `FLEET_<NAME>` when a flag was not given (flag > environment > config file > default;
/// the YAML layer is FleetOperations').
func fleetEnvironment(_ name: String) -> String? {
    let value = ProcessInfo.processInfo.environment["FLEET_" + name]
    return value?.isEmpty == false ? value : nil
}

func sinkLogger(_ label: String) -> Logger {
    var logger = Logger(label: label)
    switch fleetEnvironment("LOG_LEVEL")?.lowercased() {
    case "trace": logger.logLevel = .trace
    case "debug": logger.logLevel = .debug
    case "warning": logger.logLevel = .warning
    case "error": logger.logLevel = .error
    default: logger.logLevel = .info
    }
    return logger
}

struct ValidationFailure: Error, CustomStringConvertible {
    var description: String
}

/// `fleet migrate --database-url URL`: creates or upgrades the sink's schema; safe to rerun and to run twice at once.
struct Migrate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "migrate",
        abstract: "Create or upgrade the PostgreSQL schema of the sink (versioned, idempotent).")

    @Option(help: "postgres://user[:password]@host[:port]/database[?sslmode=disable|prefer|require] (env FLEET_DATABASE_URL)")
    var databaseURL: String?

    @Option(help: "Seconds to wait for the database to accept the connection (default 30). The migrations themselves are not bounded: an index build on a large table takes what it takes.")
    var connectTimeoutSeconds: Int = 30

    func run() async throws {
        guard let raw = databaseURL ?? fleetEnvironment("DATABASE_URL") else {
            throw ValidationError("--database-url (or FLEET_DATABASE_URL) is required")
        }
        guard connectTimeoutSeconds > 0 else { throw ValidationError("--connect-timeout-seconds must be positive") }
        let url = try DatabaseURL(raw)
        let logger = sinkLogger("fleet.migrate")
        let guarded: GuardedConnection
        do {
            guarded = try await GuardedConnection.connect(
                try url.connectionConfiguration(), id: 1, within: .seconds(connectTimeoutSeconds), logger: logger)
        } catch {
            throw ValidationFailure(description: "cannot connect to \(url.describe(error))")
        }
        let connection = guarded.connection
        do {
            let applied = try await SinkSchema.migrate(connection: connection, logger: logger)
            let version = try await SinkSchema.currentVersion(connection: connection, logger: logger) ?? 0
            await guarded.close()
            print(applied.isEmpty
                  ? "schema up to date at version \(version) (\(url))"
                  : "applied migrations \(applied.map(String.init).joined(separator: ", ")); schema at version \(version) (\(url))")
        } catch {
            await guarded.close()
            throw error
        }
    }
}

/// `fleet sink`: result topic -> PostgreSQL. Flags, `FLEET_*` variables and the `sink:` section of the config file.
struct Sink: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sink",
        abstract: "Consume verified entitlement events and write them to PostgreSQL, one transaction per batch.")

    @OptionGroup var service: ServiceOptions

    @Option(help: "Result topic to consume (default entitlements.verified).")
    var resultTopic: String?
    @Option(help: "Topic for events the sink cannot decode (default entitlements.sink-rejected).")
    var rejectedTopic: String?
    @Option(name: .customLong("database-url"), help: "postgres:// URL.")
    var databaseURL: String?
    @Option(help: "Most events per database transaction (default \(SinkConfiguration.defaultMaxBatchSize)).")
    var maxBatchSize: Int?
    @Option(help: """
        The time one batch should take, in ms (default \(SinkConfiguration.defaultBatchTargetMilliseconds)): batches grow toward \
        --max-batch-size while they take well under it and shrink after one that takes longer, never under \
        \(SinkConfiguration.initialBatchSize) (or --max-batch-size when smaller); 0: every batch takes up to \
        --max-batch-size.
        """)
    var batchTargetMs: Int?
    @Option(help: """
        Writers in this process (default 1): each is a member of the consumer group with its own database \
        connection, so the result topic's partitions are split between them; every batch is still one transaction. \
        More writers raise throughput when PostgreSQL has cores to spare.
        """)
    var writers: Int?

    func run() async throws {
        MemoryTuning.keepBatchBlocksInHeap(environment: ProcessInfo.processInfo.environment)
        let s: FleetSettings
        do { s = try await FleetSettings(section: "sink", configFile: service.config) } catch { throw ValidationError("\(error)") }
        FleetLogging.bootstrap(format: s.string("log-format", flag: service.logFormat, default: "json")!,
                               level: s.string("log-level", flag: service.logLevel, default: "info")!)
        let logger = Logger(label: "fleet.sink")
        let servers: String, rawURL: String, groupId: String, topic: String, rejected: String
        let deadline: Int, port: Int, batch: Int, target: Int, writerCount: Int, properties: [String: String]
        do {
            servers = try s.requiredString("bootstrap-servers", flag: service.bootstrapServers)
            rawURL = try s.requiredString("database-url", flag: databaseURL)
            groupId = s.string("group", flag: service.group, default: "fleet-sink")!
            topic = s.string("result-topic", flag: resultTopic, default: FleetTopics.result)!
            rejected = s.string("rejected-topic", flag: rejectedTopic, default: FleetTopics.sinkRejected)!
            deadline = try s.int("shutdown-deadline-seconds", flag: service.shutdownDeadlineSeconds, default: 25)
            port = try s.int("metrics-port", flag: service.metricsPort, default: 9091)
            batch = try s.int("max-batch-size", flag: maxBatchSize, default: SinkConfiguration.defaultMaxBatchSize)
            target = try s.int("batch-target-ms", flag: batchTargetMs, default: SinkConfiguration.defaultBatchTargetMilliseconds)
            writerCount = try s.int("writers", flag: writers, default: 1)
            properties = try s.kafkaProperties(flag: service.kafkaProperties)
        } catch { throw ValidationError("\(error)") }
        guard batch > 0 else { throw ValidationError("--max-batch-size must be positive") }
        guard (0...60_000).contains(target) else { throw ValidationError("--batch-target-ms must be between 0 and 60000") }
        guard (1...64).contains(writerCount) else { throw ValidationError("--writers must be between 1 and 64") }
        let url = try DatabaseURL(rawURL)
        FleetMetrics.bootstrap()
        let readiness = Readiness()
        var kafka: KafkaConfiguration
        let ops: OperationsServer
        do {
            kafka = KafkaConfiguration(bootstrapServers: servers, clientId: "fleet-sink",
                                       properties: KafkaConfiguration.withBoundedFetch(properties),
                                       offsetResetPolicy: try offsetResetPolicy(s, service))
            kafka.stallTimeoutSeconds = try stallTimeoutSeconds(s, service)
            ops = try operationsServer(s, service, port: port, readiness: readiness, logger: logger)
        } catch { throw ValidationError("\(error)") }
        let sink = try KafkaSinkProcess(
            configuration: .init(kafka: kafka, group: groupId, topic: topic, rejectedTopic: rejected, writers: writerCount,
                                 sink: SinkConfiguration(databaseURL: url, maxBatchSize: batch,
                                                         batchTarget: target > 0 ? .milliseconds(target) : nil),
                                 shutdownDeadline: .seconds(deadline)),
            readiness: readiness, logger: logger)
        var groupConfiguration = ServiceGroupConfiguration(
            services: [
                .init(service: sink, successTerminationBehavior: .gracefullyShutdownGroup,
                      failureTerminationBehavior: .gracefullyShutdownGroup),
                .init(service: ops),
            ],
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger)
        groupConfiguration.maximumGracefulShutdownDuration = .seconds(deadline)
        try await ServiceGroup(configuration: groupConfiguration).run()
    }
}
