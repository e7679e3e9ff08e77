import FleetDevStack
import FleetTestSupport
import Foundation
import PostgresNIO
import Testing

@testable import FleetSink

/// A database created and filled by an older schema is upgraded in place by `fleet migrate` and then written on:
/// its tables must end exactly as those of a database that had the current schema from the start.
@Suite("schema upgrade in place")
struct SchemaUpgradeTests {
    let applier = EventApplier()

    @Test("a database filled under migrations 1-4 upgrades in place, then a replay and new events leave it equal to a fresh one")
    func upgradeFromVersion4() async throws {
        let stream = mixedStream()
        let half = Array(stream.prefix(stream.count / 2))
        let old = try await TestPostgres.shared.freshDatabase(migrate: false)
        let fresh = try await TestPostgres.shared.freshDatabase()

        var upgraded: [String: String] = [:]
        try await onDatabase(old) { (c: PostgresConnection) async throws in
            try await SinkSchema.migrate(connection: c, migrations: SinkSchema.migrations.filter { $0.version <= 4 }, logger: testLogger)
            #expect(try await SinkSchema.currentVersion(connection: c, logger: testLogger) == 4)
            for batch in chunks(half, of: 7) { _ = try await applier.apply(batch, connection: c, logger: testLogger) }
            // Today's schema in place, then the whole stream again: its first half is a replay.
            let applied = try await SinkSchema.migrate(connection: c, logger: testLogger)
            #expect(applied == SinkSchema.migrations.map(\.version).filter { $0 > 4 })
            var replayed = 0
            for batch in chunks(stream, of: 7) {
                replayed += try await applier.apply(batch, connection: c, logger: testLogger).duplicate
            }
            #expect(replayed >= half.count)
            upgraded = try await stateDump(c)
            try await expectIndexes(c)
        }
        try await onDatabase(fresh) { (c: PostgresConnection) async throws in
            for batch in chunks(half, of: 7) { _ = try await applier.apply(batch, connection: c, logger: testLogger) }
            for batch in chunks(stream, of: 7) { _ = try await applier.apply(batch, connection: c, logger: testLogger) }
            let reference = try await stateDump(c)
            #expect(reference["entitlement_events"]?.split(separator: "\n").count == stream.count)
            for table in dumpedTables where table != "schema_migrations" {
                #expect(upgraded[table] == reference[table], "\(table) differs after the upgrade")
            }
            try await expectIndexes(c)
        }
    }

    /// Migration 5's indexes: the unused ones gone, the partial transaction index used by its two readers.
    private func expectIndexes(_ c: PostgresConnection) async throws {
        let names = try await scalar(c, """
            SELECT string_agg(indexname, ',' ORDER BY indexname) FROM pg_indexes WHERE schemaname = current_schema()
              AND tablename IN ('notifications', 'transactions', 'entitlement_events')
            """, as: String.self).split(separator: ",").map(String.init)
        for dropped in ["notifications_type", "transactions_original", "entitlement_events_original"] {
            #expect(!names.contains(dropped), "\(dropped) still exists")
        }
        #expect(names.contains("entitlement_events_transaction") && names.contains("notifications_parent"))
        try await c.query("SET enable_seqscan = off", logger: testLogger)
        for effect in ["GRANT", "RESTORE"] {
            var plan = ""
            for try await line in try await c.query(PostgresQuery(unsafeSQL: """
                EXPLAIN SELECT 1 FROM entitlement_events WHERE environment = 'Sandbox' AND transaction_id = 'tx-1'
                  AND effect = '\(effect)'
                """), logger: testLogger).decode(String.self) { plan += line + "\n" }
            #expect(plan.contains("entitlement_events_transaction"), "the \(effect) lookup does not use the index:\n\(plan)")
        }
        try await c.query("RESET enable_seqscan", logger: testLogger)
    }
}
