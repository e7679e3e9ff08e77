import AppStoreVerification
import EntitlementDomain
import FleetTestSupport
import Foundation
import PostgresNIO
import Testing

@testable import FleetSink

@Suite("The first attempt's COPY against a real PostgreSQL")
struct CopyTests {
    /// Events whose values exercise COPY text: escapes, NULLs, non-ASCII, the first and last dates it writes,
    /// integers beyond `integer`.
    private func awkwardEvents() -> [EntitlementEvent] {
        let t = baseTime
        var a = makeEvent("copy-a\tid", kind: "SUBSCRIPTION_STARTED", effect: .grant, signed: t, subject: "s\\1\nline",
                          transactionId: "tx-a", originalTransactionId: "otx-a", validFrom: t,
                          validUntil: 4_102_444_799_999, notificationType: "SUBSCRIBED", subtype: "INITIAL_BUY",
                          uuid: "uuid\\a")
        a.reason = "tab\there, cr\rthere, backslash \\N, quote \" and ünïcødé ✓"
        a.renewalInfo = .object([
            "note": .string("line1\nline2\ttab \\ back \"q\" \u{1F600}"), "autoRenewStatus": .integer(1),
            "list": .array([.null, .bool(false), .number(1.5), .string("")]),
        ])
        a.details = .object(["empty": .object([:]), "slash": .string("a/b\\c")])
        a.quantity = Int(Int32.max) + 1
        var b = makeEvent("copy-b", kind: "REFUNDED", effect: .revoke, signed: 1_234, subject: "",
                          transactionId: "tx-b", originalTransactionId: nil, revocationDate: 0,
                          revocationPercentage: 50, quantity: nil, notificationType: "REFUND", uuid: "uuid-b")
        b.appAccountToken = "5C3E5B3E-4F3A-4C3B-9C3E-5B3E4F3A4C3B"
        b.source.topic = "raw\\topic"
        let c = makeEvent("copy-c", kind: "CONSUMABLE_PURCHASED", effect: .grant, signed: t + 1, subject: nil,
                          productType: ProductType.consumable.rawValue, entitlement: nil, transactionId: nil,
                          units: 3)
        return [a, b, c]
    }

    /// Every row of every sink table, with `notifications.applied_at` (the transaction's start) left out.
    private func rows(_ c: PostgresConnection) async throws -> [String: String] {
        var d = try await dump(c)
        d["notifications"] = try await scalar(c, """
            SELECT coalesce(string_agg((to_jsonb(t) - 'applied_at')::text, E'\\n' ORDER BY t::text), '') FROM notifications t
            """)
        return d
    }

    @Test("COPY writes exactly the rows the inserts write, escapes and edge dates included")
    func copyMatchesInsert() async throws {
        let events = awkwardEvents()
        let plan = BatchPlan(events: events)
        #expect(plan.allNew.notificationsCopy != nil && plan.allNew.versionsCopy != nil && plan.allNew.eventsCopy != nil)
        #expect(plan.allNew.notifications == nil && plan.allNew.events == nil)
        let copied = try await TestPostgres.shared.freshDatabase()
        let inserted = try await TestPostgres.shared.freshDatabase()
        let viaCopy = try await withConnection(copied) { (c: PostgresConnection) async throws in
            let o = try await EventApplier().apply(events, connection: c, logger: testLogger)
            #expect(o.rowsWritten["entitlement_events"] == 3 && o.rowsWritten["notifications"] == 2)
            #expect(o.rowsWritten["transaction_versions"] == 2 && o.rowsWritten["transactions"] == 2)
            return try await rows(c)
        }
        let viaInsert = try await withConnection(inserted) { (c: PostgresConnection) async throws in
            // The second attempt's path: every write an INSERT (ON CONFLICT DO NOTHING).
            _ = try await c.withTransaction(logger: testLogger) { tx in
                try await plan.execute(on: tx, checkStored: true, logger: testLogger)
            }
            return try await rows(c)
        }
        for table in dumpedTables where table != "schema_migrations" {
            #expect(viaCopy[table] == viaInsert[table], "\(table)")
            #expect(viaCopy[table]?.isEmpty == false || table == "consumable_ledger", "\(table) was written")
        }
        try await onDatabase(copied) { (c: PostgresConnection) async throws in
            #expect(try await scalar(c, "SELECT reason FROM entitlement_events WHERE event_id = 'copy-a\tid'", as: String.self)
                    == events[0].reason)
            #expect(try await scalar(c, "SELECT renewal_info->>'note' FROM entitlement_events WHERE event_id = 'copy-a\tid'", as: String.self)
                    == "line1\nline2\ttab \\ back \"q\" \u{1F600}")
            #expect(try await scalar(c, "SELECT quantity IS NULL FROM entitlement_events WHERE event_id = 'copy-a\tid'", as: Bool.self))
            #expect(try await scalar(c, "SELECT applied_at = now() FROM notifications LIMIT 1", as: Bool.self) == false,
                    "applied_at is the batch transaction's start, not this one's")
        }
    }

    @Test("COPY's timestamps are fleet_ms's to the millisecond")
    func timestampsMatchFleetMs() async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        var samples: [Int64] = [
            0, 1, 999, 1_000, 86_399_999, 86_400_000, 951_782_400_000 /* 2000-02-29 */, 951_868_799_999,
            1_700_000_000_123, 4_102_444_799_999 /* 2099-12-31 23:59:59.999 */,
        ]
        var random = SystemRandomNumberGenerator()
        for _ in 0..<200 { samples.append(Int64.random(in: 0..<4_102_444_800_000, using: &random)) }
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            for ms in samples {
                #expect(CopyText.isWritable(ms))
                var t = CopyText()
                t.timestamp(ms)
                let text = String(decoding: t.bytes, as: UTF8.self)
                // Equal to fleet_ms and to the exact instant.
                let same = try await c.query("""
                    SELECT fleet_ms(\(ms)) = \(text)::timestamptz
                       AND 'epoch'::timestamptz + \(ms) * interval '1 millisecond' = \(text)::timestamptz
                    """, logger: testLogger).collect()
                #expect(try same.first?.decode(Bool.self) == true, "\(ms) -> \(text)")
            }
        }
        #expect(!CopyText.isWritable(4_102_444_800_000) && !CopyText.isWritable(-1))
    }

    @Test("a date outside 1970-2099 sends the batch's rows through the inserts, which store it as fleet_ms does")
    func unwritableDateFallsBackToInsert() async throws {
        let t = baseTime
        let far = makeEvent("far", kind: "SUBSCRIPTION_STARTED", effect: .grant, signed: t, transactionId: "tx-far",
                            validFrom: t, validUntil: 253_402_300_800_000 /* year 10000 */, notificationType: "SUBSCRIBED")
        let plan = BatchPlan(events: [far])
        #expect(plan.allNew.eventsCopy == nil && plan.allNew.events != nil)
        #expect(plan.allNew.versionsCopy == nil, "expiresDate is in the version too")
        #expect(plan.allNew.notificationsCopy != nil, "the notification's own dates are ordinary")
        let url = try await TestPostgres.shared.freshDatabase()
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            let o = try await EventApplier().apply([far], connection: c, logger: testLogger)
            #expect(o.applied == 1 && o.rowsWritten["transaction_versions"] == 1)
            #expect(try await scalar(c, "SELECT extract(year FROM valid_until)::int FROM entitlement_events", as: Int32.self) == 10000)
        }
    }

    @Test("COPY text escapes backslash, tab, newline and carriage return, and nothing else")
    func escaping() {
        var t = CopyText()
        t.text("a\\b\tc\nd\re \"f\" ü"); t.text(nil); t.integer(Int32(-5)); t.boolean(true); t.text("")
        t.endRow()
        t.text("x")
        t.endRow()
        #expect(String(decoding: t.bytes, as: UTF8.self) == "a\\\\b\\tc\\nd\\re \"f\" ü\t\\N\t-5\tt\t\nx\n")
    }
}
