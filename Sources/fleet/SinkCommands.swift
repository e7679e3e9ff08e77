import ArgumentParser
import Foundation
import FleetSink
import Logging
import PostgresNIO

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
