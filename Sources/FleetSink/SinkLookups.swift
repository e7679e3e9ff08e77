import Logging
import PostgresNIO

/// The read-only questions the App Store API commands ask the sink's database: which notifications it has already
/// stored (`fleet reconcile --database-url` skips them) and which originalTransactionIds it knows (`fleet backfill
/// --from-database` walks them).
///
/// Bounded like every database call of the services: the connect by `connectTimeout`, each statement by
/// `statementTimeout` and by the connection's channel closing (`GuardedConnection`), so a database that stops answering
/// ends the command with an error instead of holding it forever.
public struct SinkLookups: Sendable {
    let guarded: GuardedConnection
    let statementTimeout: Duration
    let logger: Logger

    init(guarded: GuardedConnection, statementTimeout: Duration, logger: Logger) {
        self.guarded = guarded
        self.statementTimeout = statementTimeout
        self.logger = logger
    }

    public static func connect(
        _ url: DatabaseURL, connectTimeout: Duration = .seconds(10), statementTimeout: Duration = .seconds(30),
        logger: Logger
    ) async throws -> SinkLookups {
        let guarded = try await GuardedConnection.connect(
            try url.connectionConfiguration(), id: 1, within: connectTimeout, logger: logger)
        return SinkLookups(guarded: guarded, statementTimeout: statementTimeout, logger: logger)
    }

    /// Those of `uuids` stored in `notifications`.
    public func storedNotificationUUIDs(among uuids: [String]) async throws -> Set<String> {
        guard !uuids.isEmpty else { return [] }
        let logger = self.logger
        return try await guarded.statement(within: statementTimeout, logger: logger) { connection in
            var found = Set<String>()
            let rows = try await connection.query(
                "SELECT notification_uuid FROM notifications WHERE notification_uuid = ANY(\(uuids))", logger: logger)
            for try await uuid in rows.decode(String.self) { found.insert(uuid) }
            return found
        }
    }

    /// Every originalTransactionId of `transactions`, in order.
    public func originalTransactionIds() async throws -> [String] {
        let logger = self.logger
        return try await guarded.statement(within: statementTimeout, logger: logger) { connection in
            var ids: [String] = []
            let rows = try await connection.query(
                """
                SELECT DISTINCT original_transaction_id FROM transactions WHERE original_transaction_id IS NOT NULL
                ORDER BY original_transaction_id
                """, logger: logger)
            for try await id in rows.decode(String.self) { ids.append(id) }
            return ids
        }
    }

    public func close() async { await guarded.close() }
}
