import ArgumentParser
import Foundation
import FleetSink
import Logging
import PostgresNIO
import FleetKafka
import ServiceLifecycle

/// Reads `FLEET_<NAME>` when a flag was not given (CONTRACTS.md: flag > environment > config file > default;
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

    func run() async throws {
        guard let raw = databaseURL ?? fleetEnvironment("DATABASE_URL") else {
            throw ValidationError("--database-url (or FLEET_DATABASE_URL) is required")
        }
        let url = try DatabaseURL(raw)
        let logger = sinkLogger("fleet.migrate")
        let connection = try await PostgresConnection.connect(
            configuration: try url.connectionConfiguration(), id: 1, logger: logger)
        do {
            let applied = try await SinkSchema.migrate(connection: connection, logger: logger)
            let version = try await SinkSchema.currentVersion(connection: connection, logger: logger) ?? 0
            try await connection.close()
            print(applied.isEmpty
                  ? "schema up to date at version \(version) (\(url))"
                  : "applied migrations \(applied.map(String.init).joined(separator: ", ")); schema at version \(version) (\(url))")
        } catch {
            try? await connection.close()
            throw error
        }
    }
}

/// `fleet sink`: result topic -> PostgreSQL (CONTRACTS.md "Processes").
struct Sink: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sink",
        abstract: "Consume verified entitlement events and write them to PostgreSQL, one transaction per batch.")

    @Option(help: "Kafka bootstrap servers, host:port[,host:port] (env FLEET_BOOTSTRAP_SERVERS)")
    var bootstrapServers: String?
    @Option(help: "Consumer group (env FLEET_GROUP; default fleet-sink)")
    var group: String?
    @Option(help: "Result topic (env FLEET_RESULT_TOPIC; default entitlements.verified)")
    var resultTopic: String?
    @Option(help: "Sink-rejected topic (env FLEET_REJECTED_TOPIC; default entitlements.sink-rejected)")
    var rejectedTopic: String?
    @Option(help: "postgres:// URL (env FLEET_DATABASE_URL)")
    var databaseURL: String?
    @Option(help: "Port of /metrics, /healthz, /readyz (env FLEET_METRICS_PORT; default 9091)")
    var metricsPort: Int?
    @Option(help: "Seconds to finish in-flight work on SIGTERM (env FLEET_SHUTDOWN_DEADLINE_SECONDS; default 25)")
    var shutdownDeadlineSeconds: Int?
    @Option(help: "Most events per database transaction (default 2000)")
    var maxBatchSize: Int = 2000
    @Option(name: .customLong("kafka-property"), help: "librdkafka property key=value (repeatable)")
    var kafkaProperties: [String] = []

    func run() async throws {
        let logger = sinkLogger("fleet.sink")
        guard let servers = bootstrapServers ?? fleetEnvironment("BOOTSTRAP_SERVERS") else {
            throw ValidationError("--bootstrap-servers (or FLEET_BOOTSTRAP_SERVERS) is required")
        }
        guard let rawURL = databaseURL ?? fleetEnvironment("DATABASE_URL") else {
            throw ValidationError("--database-url (or FLEET_DATABASE_URL) is required")
        }
        guard maxBatchSize > 0 else { throw ValidationError("--max-batch-size must be positive") }
        let url = try DatabaseURL(rawURL)
        let groupId = group ?? fleetEnvironment("GROUP") ?? "fleet-sink"
        let topic = resultTopic ?? fleetEnvironment("RESULT_TOPIC") ?? "entitlements.verified"
        let rejected = rejectedTopic ?? fleetEnvironment("REJECTED_TOPIC") ?? "entitlements.sink-rejected"
        let deadline = shutdownDeadlineSeconds ?? fleetEnvironment("SHUTDOWN_DEADLINE_SECONDS").flatMap(Int.init) ?? 25

        var properties: [String: String] = [:]
        for (name, value) in ProcessInfo.processInfo.environment where name.hasPrefix("FLEET_KAFKA_") {
            properties[name.dropFirst("FLEET_KAFKA_".count).lowercased().replacingOccurrences(of: "_", with: ".")] = value
        }
        properties.merge(try KafkaConfiguration.parseProperties(kafkaProperties)) { _, flag in flag }
        let kafka = KafkaConfiguration(bootstrapServers: servers, clientId: "fleet-sink", properties: properties)
        let consumer = try KafkaConsumer(configuration: kafka, groupId: groupId, topics: [topic])
        let producer = try KafkaProducer(configuration: kafka)
        let service = SinkService(
            configuration: SinkConfiguration(databaseURL: url, maxBatchSize: maxBatchSize),
            source: KafkaEventBatchSource(consumer: consumer),
            rejected: KafkaRejectedSink(producer: producer, topic: rejected),
            logger: logger)
        logger.info("sink starting", metadata: [
            "group": "\(groupId)", "topic": "\(topic)", "rejected-topic": "\(rejected)", "database": "\(url)",
        ])
        var groupConfiguration = ServiceGroupConfiguration(
            services: [.init(service: service)],
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger)
        groupConfiguration.maximumGracefulShutdownDuration = .seconds(deadline)
        let group = ServiceGroup(configuration: groupConfiguration)
        try await group.run()
        // In-flight batch finished (or abandoned uncommitted while the database was down): commit stored offsets,
        // leave the group.
        let closed = await consumer.close(deadline: .seconds(max(1, deadline / 2)))
        _ = await producer.flush(deadline: .seconds(5))
        producer.close(timeout: .seconds(2))
        logger.info("sink stopped", metadata: ["consumer-closed-cleanly": "\(closed)"])
    }
}
