import EntitlementDomain
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
            try await fillAsAnOlderSink(c, half)
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
            try await expectBytewiseText(c)
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
            try await expectBytewiseText(c)
        }
    }

    @Test("""
        a database created with a linguistic collation (ICU en-US) and an operator's view on the fleet's view, filled \
        under migrations 1-5: migration 6 makes every text column bytewise, keeps both views with their options, grants \
        and comment, and a replay leaves its tables equal to a fresh C database's
        """)
    func upgradeFromVersion5OnALinguisticDatabase() async throws {
        let stream = mixedStream()
        let half = Array(stream.prefix(stream.count / 2))
        let old = try await TestPostgres.shared.freshDatabase(migrate: false, locale: .icu("en-US"))
        let fresh = try await TestPostgres.shared.freshDatabase()
        let role = "fleet_reader_\(UInt32.random(in: 0...UInt32.max))"

        var upgraded: [String: String] = [:]
        try await onDatabase(old) { (c: PostgresConnection) async throws in
            #expect(try await scalar(c, "SELECT datlocprovider::text FROM pg_database WHERE datname = current_database()", as: String.self) == "i")
            try await SinkSchema.migrate(connection: c, migrations: SinkSchema.migrations.filter { $0.version <= 5 }, logger: testLogger)
            try await fillAsAnOlderSink(c, half)
            for sql in [
                "CREATE ROLE \(role) NOLOGIN",
                "CREATE VIEW operator_summary WITH (security_barrier = true) AS SELECT environment, count(*) AS subjects FROM entitlements_current GROUP BY environment",
                "COMMENT ON VIEW operator_summary IS 'subjects with an active entitlement'",
                "GRANT SELECT ON entitlements_current, operator_summary TO \(role)",
            ] { try await c.query(PostgresQuery(unsafeSQL: sql), logger: testLogger) }
            let summary = "SELECT count(*)::text || '/' || coalesce(sum(subjects), 0)::text FROM operator_summary"
            let before = try await scalar(c, summary, as: String.self)

            #expect(try await SinkSchema.migrate(connection: c, logger: testLogger) == SinkSchema.migrations.map(\.version).filter { $0 > 5 })
            try await expectBytewiseText(c)
            #expect(try await scalar(c, summary, as: String.self) == before)
            for view in ["entitlements_current", "operator_summary", "consumable_balances"] {
                #expect(try await scalar(c, "SELECT to_regclass('\(view)') IS NOT NULL", as: Bool.self), "\(view) is gone")
            }
            for view in ["entitlements_current", "operator_summary"] {
                #expect(try await scalar(c, "SELECT has_table_privilege('\(role)', '\(view)', 'SELECT')", as: Bool.self),
                        "the grant on \(view) is gone")
            }
            #expect(try await scalar(c, "SELECT obj_description('operator_summary'::regclass, 'pg_class')", as: String.self)
                    == "subjects with an active entitlement")
            #expect(try await scalar(c, "SELECT array_to_string(reloptions, ',') FROM pg_class WHERE relname = 'operator_summary'",
                                     as: String.self) == "security_barrier=true")

            var replayed = 0
            for batch in chunks(stream, of: 7) {
                replayed += try await applier.apply(batch, connection: c, logger: testLogger).duplicate
            }
            #expect(replayed >= half.count)
            upgraded = try await stateDump(c)
            for sql in ["DROP VIEW operator_summary", "REVOKE ALL ON entitlements_current FROM \(role)", "DROP ROLE \(role)"] {
                try await c.query(PostgresQuery(unsafeSQL: sql), logger: testLogger)
            }
        }
        try await onDatabase(fresh) { (c: PostgresConnection) async throws in
            for batch in chunks(half, of: 7) { _ = try await applier.apply(batch, connection: c, logger: testLogger) }
            for batch in chunks(stream, of: 7) { _ = try await applier.apply(batch, connection: c, logger: testLogger) }
            let reference = try await stateDump(c)
            for table in dumpedTables where table != "schema_migrations" {
                #expect(upgraded[table] == reference[table], "\(table) differs after the upgrade")
            }
        }
    }

    /// Writes `events` into a database at an older schema version as the sinks of that time did. They wrote
    /// `notifications.applied_at` themselves; today's sink leaves it to the column's default (migration 8), so the
    /// default stands in for them while they write and is dropped again: the upgrade must set it.
    private func fillAsAnOlderSink(_ c: PostgresConnection, _ events: [EntitlementEvent]) async throws {
        try await c.query("ALTER TABLE notifications ALTER COLUMN applied_at SET DEFAULT now()", logger: testLogger)
        for batch in chunks(events, of: 7) { _ = try await applier.apply(batch, connection: c, logger: testLogger) }
        try await c.query("ALTER TABLE notifications ALTER COLUMN applied_at DROP DEFAULT", logger: testLogger)
    }

    /// Migration 6: no text column of the fleet's tables compares linguistically.
    private func expectBytewiseText(_ c: PostgresConnection) async throws {
        let linguistic = try await scalar(c, """
            SELECT coalesce(string_agg(table_name || '.' || column_name || ' ' || coalesce(collation_name, 'default'), ', '), '')
            FROM information_schema.columns
            WHERE table_schema = current_schema() AND data_type = 'text' AND coalesce(collation_name, '') <> 'C'
              AND table_name IN ('notifications', 'transaction_versions', 'transactions', 'entitlement_events', 'entitlements',
                                 'consumable_ledger', 'consumption_answers', 'consumption_consent', 'consumption_usage')
            """, as: String.self)
        #expect(linguistic.isEmpty, "text columns that do not compare bytewise: \(linguistic)")
        let bytewise = try await scalar(c, """
            SELECT count(*)::integer FROM information_schema.columns
            WHERE table_schema = current_schema() AND data_type = 'text' AND collation_name = 'C'
            """, as: Int.self)
        #expect(bytewise > 40, "\(bytewise) bytewise text columns")
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
        // Migration 7: every key of the sink's write path leads with its identifier, not the environment.
        let keys: [String: String] = [
            "transaction_versions_pkey": "(transaction_id, environment, signed_date_ms)",
            "transactions_pkey": "(transaction_id, environment)",
            "entitlements_pkey": "(subject, environment, entitlement)",
            "consumable_ledger_pkey": "(transaction_id, environment, entry, revocation_key)",
            "consumption_usage_pkey": "(transaction_id, environment)",
            "notifications_parent": "(original_transaction_id, environment, signed_date_ms)",
            "entitlement_events_subject": "(subject, environment, entitlement, signed_date_ms)",
            "entitlement_events_transaction": "(transaction_id, environment) WHERE",
            "entitlements_subscription": "(original_transaction_id, environment)",
            "consumable_ledger_subject": "(subject, environment, product_id)",
        ]
        for (index, columns) in keys {
            let definition = try await scalar(c, """
                SELECT coalesce(max(indexdef), '') FROM pg_indexes WHERE schemaname = current_schema() AND indexname = '\(index)'
                """, as: String.self)
            #expect(definition.contains(columns), "\(index): \(definition)")
        }
        // Migration 8: notifications.applied_at is the inserting transaction's start unless given.
        #expect(try await scalar(c, """
            SELECT coalesce(pg_get_expr(d.adbin, d.adrelid), '') FROM pg_attrdef d
            JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
            WHERE d.adrelid = 'notifications'::regclass AND a.attname = 'applied_at'
            """, as: String.self) == "now()")
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
