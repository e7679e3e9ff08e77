import EntitlementDomain
import FleetTestSupport
import PostgresNIO
import Synchronization
import Testing

@testable import FleetSink

@Suite("The App Store API commands' lookups in the sink's database")
struct SinkLookupsTests {
    @Test("stored notificationUUIDs and originalTransactionIds are read back as the sink wrote them")
    func answers() async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        let stream = mixedStream()
        let originals = try await withConnection(url) { (c: PostgresConnection) async throws -> Set<String> in
            _ = try await EventApplier().apply(stream, connection: c, logger: testLogger)
            var all = Set<String>()
            for try await id in try await c.query("SELECT original_transaction_id FROM transactions", logger: testLogger)
                .decode(String?.self) { if let id { all.insert(id) } }
            return all
        }
        let storedUUIDs = Set(stream.compactMap(\.notification?.uuid))
        try #require(!storedUUIDs.isEmpty && !originals.isEmpty)
        #expect(originals.isSubset(of: Set(stream.compactMap(\.originalTransactionId))))
        let lookups = try await SinkLookups.connect(try DatabaseURL(url), logger: testLogger)
        let asked = Array(storedUUIDs.prefix(3)) + ["not-a-stored-uuid", "0000"]
        #expect(try await lookups.storedNotificationUUIDs(among: asked) == Set(storedUUIDs.prefix(3)))
        #expect(try await lookups.storedNotificationUUIDs(among: []) == [])
        #expect(try await lookups.originalTransactionIds() == originals.sorted())
        await lookups.close()
    }

    @Test("a lookup that the database never answers ends with StatementTimedOut and closes the connection")
    func hungStatement() async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        let lookups = try await SinkLookups.connect(try DatabaseURL(url), statementTimeout: .seconds(1), logger: testLogger)
        // Another session holds the table: the lookup waits on the lock, as behind a stuck migration or a hung server.
        try await withConnection(url) { (holder: PostgresConnection) async throws in
            _ = try await holder.query("BEGIN", logger: testLogger)
            _ = try await holder.query("LOCK TABLE transactions IN ACCESS EXCLUSIVE MODE", logger: testLogger)
            let started = ContinuousClock.now
            await #expect(throws: GuardedConnection.StatementTimedOut.self) {
                _ = try await lookups.originalTransactionIds()
            }
            #expect(ContinuousClock.now - started < .seconds(10))
            #expect(lookups.guarded.connection.isClosed || lookups.guarded.isCloseRequested)
            _ = try await holder.query("ROLLBACK", logger: testLogger)
        }
        // The next call fails at once, named, instead of waiting on the closed connection.
        let again = ContinuousClock.now
        await #expect(throws: (any Error).self) { _ = try await lookups.storedNotificationUUIDs(among: ["x"]) }
        #expect(ContinuousClock.now - again < .seconds(10))
    }

    @Test("a statement abandoned at its time limit ends once the connection is closed: nothing is left waiting")
    func abandonedStatementEnds() async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        let guarded = try await GuardedConnection.connect(
            try DatabaseURL(url).connectionConfiguration(), id: 1, within: .seconds(10), logger: testLogger)
        let ended = Mutex<(any Error)?>(nil)
        try await withConnection(url) { (holder: PostgresConnection) async throws in
            _ = try await holder.query("BEGIN", logger: testLogger)
            _ = try await holder.query("LOCK TABLE notifications IN ACCESS EXCLUSIVE MODE", logger: testLogger)
            await #expect(throws: GuardedConnection.StatementTimedOut.self) {
                try await guarded.statement(within: .milliseconds(500), logger: testLogger) { c in
                    do {
                        return try await scalar(c, "SELECT count(*) FROM notifications", as: Int64.self)
                    } catch {
                        ended.withLock { $0 = error }
                        throw error
                    }
                }
            }
            // The abandoned body got PostgresNIO's own error when the time-out closed the connection.
            let deadline = ContinuousClock.now + .seconds(10)
            while ended.withLock({ $0 == nil }) && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(50)) }
            #expect(ended.withLock { $0 != nil }, "the abandoned statement is still waiting")
            _ = try await holder.query("ROLLBACK", logger: testLogger)
        }
    }
}
