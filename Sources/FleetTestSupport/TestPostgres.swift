import FleetDevStack
import FleetSink
import Foundation
import Logging
import PostgresNIO
import Synchronization

/// One throwaway PostgreSQL server for the whole test process (destroyed at exit); each test gets a fresh database.
public actor TestPostgres {
    public static let shared = TestPostgres()
    private var server: ThrowawayPostgres?
    private var counter = 0

    /// The process's server, started on first use.
    public func get() async throws -> ThrowawayPostgres {
        if let server { return server }
        let made = try await ThrowawayPostgres(database: "fleet_tests")
        registerForCleanup(made)
        server = made
        return made
    }

    /// A fresh database, migrated to the sink's schema unless `migrate` is false, with `locale`'s collation (nil:
    /// C); returns its URL.
    public func freshDatabase(migrate: Bool = true, locale: ThrowawayPostgres.DatabaseLocale? = nil) async throws -> String {
        let server = try await get()
        counter += 1
        let url = try await server.createDatabase("t\(counter)_\(UInt32.random(in: 0...UInt32.max))", locale: locale)
        if migrate {
            try await withConnection(url) { c in try await SinkSchema.migrate(connection: c, logger: testLogger) }
        }
        return url
    }
}

private let cleanup = Mutex<[ThrowawayPostgres]>([])

/// Destroys `server` when the test process exits.
public func registerForCleanup(_ server: ThrowawayPostgres) {
    let first = cleanup.withLock { list in
        list.append(server)
        return list.count == 1
    }
    if first {
        atexit {
            for server in cleanup.withLock({ $0 }) { server.destroy() }
        }
    }
}

/// A quiet logger for test plumbing.
public let testLogger: Logger = {
    var l = Logger(label: "fleet-tests")
    l.logLevel = .warning
    return l
}()

/// Runs `body` on a new connection to `url`, closed afterwards in every case.
@discardableResult
public func withConnection<T: Sendable>(_ url: String, _ body: (PostgresConnection) async throws -> T) async throws -> T {
    let config = try DatabaseURL(url).connectionConfiguration()
    let connection = try await PostgresConnection.connect(configuration: config, id: 9, logger: testLogger)
    do {
        let result = try await body(connection)
        // The body may have closed it (a test of what happens then).
        if !connection.isClosed { try await connection.close() }
        return result
    } catch {
        try? await connection.close()
        throw error
    }
}

/// `withConnection` for multi-statement bodies that return nothing (keeps the closure's `throws` explicit).
public func onDatabase(_ url: String, _ body: (PostgresConnection) async throws -> Void) async throws {
    try await withConnection(url) { (c: PostgresConnection) async throws -> Bool in
        try await body(c)
        return true
    }
}

/// The sink's tables compared by `dump`.
public let dumpedTables = [
    "notifications", "transactions", "transaction_versions", "entitlement_events", "entitlements",
    "consumable_ledger", "schema_migrations",
]

/// Every row of every sink table as text, sorted bytewise (whatever the database's collation): equal dumps mean
/// byte-for-byte equal table contents.
public func dump(_ connection: PostgresConnection) async throws -> [String: String] {
    var result: [String: String] = [:]
    for table in dumpedTables {
        let rows = try await connection.query(
            PostgresQuery(unsafeSQL: "SELECT coalesce(string_agg(t::text, E'\\n' ORDER BY t::text COLLATE \"C\"), '') FROM \(table) t"),
            logger: testLogger)
        for try await text in rows.decode(String.self) { result[table] = text }
    }
    return result
}

/// The first column of the first row of `sql`.
public func scalar<T: PostgresDecodable & Sendable>(_ c: PostgresConnection, _ sql: String, as: T.Type = T.self) async throws -> T {
    let rows = try await c.query(PostgresQuery(unsafeSQL: sql), logger: testLogger).collect()
    guard let row = rows.first else { throw TestFailure("no row for \(sql)") }
    return try row.decode(T.self)
}

/// A failed test precondition, with its reason.
public struct TestFailure: Error, CustomStringConvertible {
    public var description: String
    public init(_ d: String) { description = d }
}
