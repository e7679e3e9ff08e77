import AppStoreVerification
import EntitlementDomain
import FleetTestSupport
import Foundation
import PostgresNIO
import Testing

@testable import FleetSink

@Suite("Migrations and the batch applier against a real PostgreSQL")
struct ApplierTests {
    let applier = EventApplier()

    @Test("fleet migrate is idempotent, versioned, and safe with two migrators at once")
    func migrationsIdempotent() async throws {
        let url = try await TestPostgres.shared.freshDatabase(migrate: false)
        async let first = withConnection(url) { try await SinkSchema.migrate(connection: $0, logger: testLogger) }
        async let second = withConnection(url) { try await SinkSchema.migrate(connection: $0, logger: testLogger) }
        let (a, b) = try await (first, second)
        #expect((a + b).sorted() == SinkSchema.migrations.map(\.version).sorted())
        let again = try await withConnection(url) { try await SinkSchema.migrate(connection: $0, logger: testLogger) }
        #expect(again.isEmpty)
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            #expect(try await scalar(c, "SELECT count(*) FROM schema_migrations", as: Int64.self) == Int64(SinkSchema.migrations.count))
            #expect(try await SinkSchema.currentVersion(connection: c, logger: testLogger) == SinkSchema.migrations.last?.version)
            for table in ["notifications", "transactions", "transaction_versions", "entitlement_events", "entitlements",
                          "consumable_ledger", "consumable_balances", "entitlements_current"] {
                #expect(try await scalar(c, "SELECT to_regclass('\(table)') IS NOT NULL", as: Bool.self), "\(table)")
            }
        }
        // An edited, already-applied migration is refused.
        var edited = SinkSchema.migrations
        edited[0].statements.append("SELECT 1")
        await #expect(throws: SinkSchema.Failure.self) {
            try await withConnection(url) { try await SinkSchema.migrate(connection: $0, migrations: edited, logger: testLogger) }
        }
    }

    @Test("replaying the same result stream leaves every table byte-for-byte identical")
    func replayIsIdempotent() async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        let stream = mixedStream()
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            var first = ApplyOutcome()
            for batch in chunks(stream, of: 7) {
                let o = try await applier.apply(batch, connection: c, logger: testLogger)
                first.applied += o.applied; first.stale += o.stale; first.duplicate += o.duplicate
            }
            #expect(first.applied + first.stale + first.duplicate == stream.count)
            let before = try await dump(c)
            #expect(before["entitlement_events"]?.split(separator: "\n").count == stream.count)
            #expect(before["notifications"]?.isEmpty == false)
            // Replay with different batch boundaries, then once more as a single batch.
            for size in [13, stream.count] {
                var replay = ApplyOutcome()
                for batch in chunks(stream, of: size) {
                    let o = try await applier.apply(batch, connection: c, logger: testLogger)
                    replay.applied += o.applied; replay.stale += o.stale; replay.duplicate += o.duplicate
                    #expect(o.rowsWritten.values.allSatisfy { $0 == 0 }, "a replay wrote rows: \(o.rowsWritten)")
                }
                #expect(replay.duplicate == stream.count)
                #expect(replay.applied == 0 && replay.stale == 0)
                let after = try await dump(c)
                for table in dumpedTables { #expect(after[table] == before[table], "\(table) changed on replay") }
            }
        }
    }

    @Test("a batch mixing stored and new events writes only the new ones, as if they had come alone")
    func partlyRedeliveredBatch() async throws {
        // The applier writes a batch as if every event were new and, when the event insert meets stored ones, rolls
        // back and writes it again without them. Reference: the new events of each mixed batch applied alone.
        let stream = mixedStream()
        let stored = 10
        let isStored = Set(stream.prefix(stored).map(\.eventId))
        let mixed = try await TestPostgres.shared.freshDatabase()
        let reference = try await TestPostgres.shared.freshDatabase()
        func add(_ a: inout ApplyOutcome, _ o: ApplyOutcome) { a.applied += o.applied; a.stale += o.stale; a.duplicate += o.duplicate }
        var expected = ApplyOutcome()
        var expectedDump: [String: String] = [:]
        try await onDatabase(reference) { (c: PostgresConnection) async throws in
            for batch in chunks(Array(stream.prefix(stored)), of: 7) {
                _ = try await applier.apply(batch, connection: c, logger: testLogger)
            }
            // The boundaries of the second pass below, stored events left out.
            for batch in chunks(stream, of: 7) {
                let new = batch.filter { !isStored.contains($0.eventId) }
                if !new.isEmpty { add(&expected, try await applier.apply(new, connection: c, logger: testLogger)) }
            }
            expectedDump = try await stateDump(c)
            #expect(expectedDump["entitlement_events"]?.split(separator: "\n").count == stream.count)
        }
        try await onDatabase(mixed) { (c: PostgresConnection) async throws in
            for batch in chunks(Array(stream.prefix(stored)), of: 7) {
                _ = try await applier.apply(batch, connection: c, logger: testLogger)
            }
            var total = ApplyOutcome()
            for batch in chunks(stream, of: 7) { add(&total, try await applier.apply(batch, connection: c, logger: testLogger)) }
            #expect(total.duplicate == expected.duplicate + stored)
            #expect(total.applied == expected.applied && total.stale == expected.stale)
            let dump = try await stateDump(c)
            for table in dumpedTables where table != "schema_migrations" {
                #expect(dump[table] == expectedDump[table], "\(table) differs")
            }
        }
    }

    @Test("documents stored as their records carried them give the same rows as documents written again")
    func documentTextsFromRecords() async throws {
        // The sink stores the text of each embedded document as the worker wrote it (`EventDocumentTexts`) instead
        // of serializing the parsed document again; a text holding an escaped NUL is still written again without it.
        var stream = mixedStream()
        var awkward = makeEvent("awkward-nul", kind: "SUBSCRIPTION_RENEWED", effect: .extend, signed: baseTime + 3 * day,
                                validUntil: baseTime + 40 * day, notificationType: "DID_RENEW", uuid: "uuid-awkward")
        awkward.renewalInfo = .object(["autoRenewStatus": .integer(1), "note": .string("back\u{0}slash \"q\" 1.0")])
        awkward.details = .object(["ratio": .number(1.5), "whole": .number(2.0), "list": .array([.null, .bool(true)])])
        stream.append(awkward)
        let records = stream.map { e in
            SinkRecord(topic: "t", partition: 0, offset: 0, key: nil, value: e.jsonBytes(), headers: [])
        }
        let decoded = try records.map { try SinkService.decode($0).get() }
        #expect(decoded.map(\.event) == stream)
        #expect(decoded.last?.documents.renewalInfo?.contains("\\u0000") == true, "the NUL case is exercised")
        let written = try await TestPostgres.shared.freshDatabase()
        let kept = try await TestPostgres.shared.freshDatabase()
        var expected: [String: String] = [:]
        try await onDatabase(written) { (c: PostgresConnection) async throws in
            for batch in chunks(stream, of: 7) { _ = try await applier.apply(batch, connection: c, logger: testLogger) }
            expected = try await stateDump(c)
        }
        try await onDatabase(kept) { (c: PostgresConnection) async throws in
            for batch in chunks(decoded, of: 7) {
                let prepared = applier.prepare(batch.map(\.event), documents: batch.map(\.documents))
                _ = try await applier.apply(prepared, connection: c, logger: testLogger)
            }
            let dump = try await stateDump(c)
            #expect(dump["entitlement_events"]?.split(separator: "\n").count == stream.count)
            for table in dumpedTables where table != "schema_migrations" {
                #expect(dump[table] == expected[table], "\(table) differs")
            }
            #expect(try await scalar(c, "SELECT renewal_info->>'note' FROM entitlement_events WHERE event_id = 'awkward-nul'", as: String.self) == "backslash \"q\" 1.0")
        }
    }

    @Test("a DID_RENEW signed before a REFUND but delivered after it does not re-activate; REFUND_REVERSED restores")
    func outOfOrder() async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        let t = baseTime
        let buy = makeEvent("buy", kind: "SUBSCRIPTION_STARTED", effect: .grant, signed: t, validFrom: t,
                            validUntil: t + 30 * day, notificationType: "SUBSCRIBED", subtype: "INITIAL_BUY")
        let renew = makeEvent("renew", kind: "SUBSCRIPTION_RENEWED", effect: .extend, signed: t + 30 * day,
                              transactionId: "tx-2", validFrom: t + 30 * day, validUntil: t + 60 * day,
                              notificationType: "DID_RENEW")
        let refund = makeEvent("refund", kind: "REFUNDED", effect: .revoke, signed: t + 31 * day, transactionId: "tx-2",
                               validUntil: t + 60 * day, revocationDate: t + 31 * day, notificationType: "REFUND")
        let reversed = makeEvent("reversed", kind: "REFUND_REVERSED", effect: .restore, signed: t + 32 * day,
                                 transactionId: "tx-2", validUntil: t + 60 * day, notificationType: "REFUND_REVERSED")
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            _ = try await applier.apply([buy], connection: c, logger: testLogger)
            let r1 = try await applier.apply([refund], connection: c, logger: testLogger)
            #expect(r1.statuses["refund"] == .applied)
            let r2 = try await applier.apply([renew], connection: c, logger: testLogger)  // late delivery
            #expect(r2.statuses["renew"] == .stale)
            #expect(try await scalar(c, "SELECT active FROM entitlements WHERE subject = 'otx-1'", as: Bool.self) == false)
            #expect(try await scalar(c, "SELECT last_event_id FROM entitlements", as: String.self) == "refund")
            #expect(try await scalar(c, "SELECT status FROM entitlement_events WHERE event_id = 'renew'", as: String.self) == "stale")
            #expect(try await scalar(c, "SELECT entitled_now FROM entitlements_current", as: Bool.self) == false)
            // The refund replaced the earlier version of tx-2 (same transactionId, newer signedDate).
            #expect(try await scalar(c, "SELECT revocation_date IS NOT NULL FROM transactions WHERE transaction_id = 'tx-2'", as: Bool.self))
            #expect(try await scalar(c, "SELECT count(*) FROM transaction_versions WHERE transaction_id = 'tx-2'", as: Int64.self) == 2)
            let r3 = try await applier.apply([reversed], connection: c, logger: testLogger)
            #expect(r3.statuses["reversed"] == .applied)
            #expect(try await scalar(c, "SELECT active FROM entitlements", as: Bool.self))
            #expect(try await scalar(c, "SELECT revoked_at IS NULL FROM entitlements", as: Bool.self))
            #expect(try await scalar(c, "SELECT (extract(epoch FROM valid_until) * 1000)::bigint FROM entitlements", as: Int64.self) == t + 60 * day)
            // A stale replay of the old (pre-refund) transaction never overrides the current fact.
            let oldCopy = makeEvent("renew-client", kind: "SUBSCRIPTION_OBSERVED", effect: .extend, signed: t + 30 * day,
                                    transactionId: "tx-2", validUntil: t + 60 * day)
            let r4 = try await applier.apply([oldCopy], connection: c, logger: testLogger)
            #expect(r4.statuses["renew-client"] == .stale)
            #expect(try await scalar(c, "SELECT signed_date_ms FROM transactions WHERE transaction_id = 'tx-2'", as: Int64.self) == t + 32 * day)
            #expect(try await scalar(c, "SELECT count(*) FROM transaction_versions WHERE transaction_id = 'tx-2'", as: Int64.self) == 3)
            #expect(try await scalar(c, "SELECT active FROM entitlements", as: Bool.self))
        }
    }

    @Test("an upgrade grants the new tier and ends the old one of the same subscription; older events of the old tier are stale")
    func upgradeSupersedesOldTier() async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        let t = baseTime
        let buy = makeEvent("buy", kind: "SUBSCRIPTION_STARTED", effect: .grant, signed: t, validFrom: t,
                            validUntil: t + 30 * day, notificationType: "SUBSCRIBED", subtype: "INITIAL_BUY")
        let upgrade = makeEvent("upgrade", kind: "PLAN_UPGRADED", effect: .grant, signed: t + 10 * day,
                                product: "com.example.pro.monthly", entitlement: "pro", transactionId: "tx-2",
                                validFrom: t + 10 * day, validUntil: t + 40 * day,
                                notificationType: "DID_CHANGE_RENEWAL_PREF", subtype: "UPGRADE")
        let lateOldTier = makeEvent("old-renewal-status", kind: "SUBSCRIPTION_RENEWED", effect: .extend, signed: t + 5 * day,
                                    validUntil: t + 30 * day, notificationType: "DID_RENEW")
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            _ = try await applier.apply([buy], connection: c, logger: testLogger)
            let o = try await applier.apply([upgrade], connection: c, logger: testLogger)
            #expect(o.statuses["upgrade"] == .applied)
            #expect(try await scalar(c, "SELECT active FROM entitlements WHERE entitlement = 'pro'", as: Bool.self))
            #expect(try await scalar(c, "SELECT active FROM entitlements WHERE entitlement = 'premium'", as: Bool.self) == false)
            #expect(try await scalar(c, "SELECT revocation_reason FROM entitlements WHERE entitlement = 'premium'", as: String.self)
                    == "superseded_by:com.example.pro.monthly")
            #expect(try await scalar(c, "SELECT (extract(epoch FROM revoked_at) * 1000)::bigint FROM entitlements WHERE entitlement = 'premium'", as: Int64.self)
                    == t + 10 * day)
            let late = try await applier.apply([lateOldTier], connection: c, logger: testLogger)
            #expect(late.statuses["old-renewal-status"] == .stale)
            #expect(try await scalar(c, "SELECT count(*) FROM entitlements WHERE active", as: Int64.self) == 1)
        }
    }

    @Test("a refund of an earlier billing period changes no access; a refund of the granting period revokes")
    func refundOfEarlierPeriod() async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        let t = baseTime
        let buy = makeEvent("buy", kind: "SUBSCRIPTION_STARTED", effect: .grant, signed: t, validFrom: t,
                            validUntil: t + 30 * day, notificationType: "SUBSCRIBED", subtype: "INITIAL_BUY")
        let renew = makeEvent("renew", kind: "SUBSCRIPTION_RENEWED", effect: .extend, signed: t + 30 * day,
                              transactionId: "tx-2", validFrom: t + 30 * day, validUntil: t + 60 * day, notificationType: "DID_RENEW")
        // Apple refunds the first period (tx-1, which expired at t + 30 days) while tx-2 grants access.
        let oldRefund = makeEvent("refund-1", kind: "REFUNDED", effect: .revoke, signed: t + 35 * day, transactionId: "tx-1",
                                  validFrom: t, validUntil: t + 30 * day, revocationDate: t + 35 * day, notificationType: "REFUND")
        let currentRefund = makeEvent("refund-2", kind: "REFUNDED", effect: .revoke, signed: t + 36 * day, transactionId: "tx-2",
                                      validFrom: t + 30 * day, validUntil: t + 60 * day, revocationDate: t + 36 * day,
                                      notificationType: "REFUND")
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            _ = try await applier.apply([buy, renew], connection: c, logger: testLogger)
            let o = try await applier.apply([oldRefund], connection: c, logger: testLogger)
            #expect(o.statuses["refund-1"] == .applied)
            #expect(try await scalar(c, "SELECT active FROM entitlements", as: Bool.self))
            #expect(try await scalar(c, "SELECT last_event_id FROM entitlements", as: String.self) == "renew")
            #expect(try await scalar(c, "SELECT revocation_date IS NOT NULL FROM transactions WHERE transaction_id = 'tx-1'", as: Bool.self))
            let o2 = try await applier.apply([currentRefund], connection: c, logger: testLogger)
            #expect(o2.statuses["refund-2"] == .applied)
            #expect(try await scalar(c, "SELECT active FROM entitlements", as: Bool.self) == false)
            #expect(try await scalar(c, "SELECT last_event_id FROM entitlements", as: String.self) == "refund-2")
        }
    }

    @Test("payload text with quotes, control characters and NUL is stored as jsonb (NUL dropped: jsonb refuses it)")
    func awkwardPayloadText() async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        var e = makeEvent("awkward", kind: "SUBSCRIPTION_STARTED", effect: .grant, signed: baseTime, validFrom: baseTime,
                          validUntil: baseTime + day, notificationType: "SUBSCRIBED", subtype: "INITIAL_BUY")
        guard case .object(var t)? = e.transaction else { Issue.record("no transaction"); return }
        t["note"] = .string("a \"quoted\" \\ back\u{0}slash\n\u{1}é")
        e.transaction = .object(t)
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            let o = try await applier.apply([e], connection: c, logger: testLogger)
            #expect(o.statuses["awkward"] == .applied)
            #expect(try await scalar(c, "SELECT payload->>'note' FROM transactions", as: String.self) == "a \"quoted\" \\ backslash\n\u{1}é")
            #expect(try await scalar(c, "SELECT payload->'transaction'->>'note' FROM notifications", as: String.self) == "a \"quoted\" \\ backslash\n\u{1}é")
        }
    }

    @Test("within one batch events apply in signedDate order, whatever the delivery order")
    func batchOrder() async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        let t = baseTime
        let events = [
            makeEvent("expired", kind: "SUBSCRIPTION_EXPIRED", effect: .revoke, signed: t + 60 * day, validUntil: t + 60 * day),
            makeEvent("renew", kind: "SUBSCRIPTION_RENEWED", effect: .extend, signed: t + 30 * day, validUntil: t + 60 * day),
            makeEvent("buy", kind: "SUBSCRIPTION_STARTED", effect: .grant, signed: t, validFrom: t, validUntil: t + 30 * day),
        ]
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            let o = try await applier.apply(events, connection: c, logger: testLogger)
            #expect(o.applied == 3 && o.stale == 0)
            #expect(try await scalar(c, "SELECT active FROM entitlements", as: Bool.self) == false)
            #expect(try await scalar(c, "SELECT last_event_id FROM entitlements", as: String.self) == "expired")
            #expect(try await scalar(c, "SELECT (extract(epoch FROM revoked_at) * 1000)::bigint FROM entitlements", as: Int64.self) == t + 60 * day)
        }
    }

    @Test("consumables: the same transaction 5 times credits once; a refund debits; its reversal re-credits")
    func consumables() async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        let t = baseTime
        func gems(_ id: String, _ effect: EntitlementEffect, _ signed: Int64, revocation: Int64? = nil, pct: Int? = nil) -> EntitlementEvent {
            makeEvent(id, kind: effect == .grant ? "ONE_TIME_PURCHASED" : effect == .revoke ? "REFUNDED" : "REFUND_REVERSED",
                      effect: effect, signed: signed, subject: "user-1", product: "com.example.gems",
                      productType: "Consumable", entitlement: nil, transactionId: "ctx-1", originalTransactionId: "ctx-1",
                      revocationDate: revocation, revocationPercentage: pct, units: 120, quantity: 2)
        }
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            // Same eventId redelivered, and the same transaction arriving under other eventIds (client JWS, retries).
            let purchase = gems("buy", .grant, t)
            for _ in 0..<3 { _ = try await applier.apply([purchase], connection: c, logger: testLogger) }
            let other = try await applier.apply([gems("buy-client", .grant, t + 5), gems("buy-retry", .grant, t + 9)],
                                                connection: c, logger: testLogger)
            #expect(other.duplicate == 2 && other.applied == 0)
            #expect(try await scalar(c, "SELECT balance::text FROM consumable_balances", as: String.self) == "120")
            #expect(try await scalar(c, "SELECT count(*) FROM consumable_ledger", as: Int64.self) == 1)
            #expect(try await scalar(c, "SELECT count(*) FROM entitlements", as: Int64.self) == 0)
            // Partial refund: 25% of 120 units.
            let refund = gems("refund", .revoke, t + day, revocation: t + day, pct: 25_000)
            _ = try await applier.apply([refund, refund], connection: c, logger: testLogger)
            _ = try await applier.apply([gems("refund-copy", .revoke, t + day + 7, revocation: t + day, pct: 25_000)],
                                        connection: c, logger: testLogger)
            #expect(try await scalar(c, "SELECT balance::text FROM consumable_balances", as: String.self) == "90")
            #expect(try await scalar(c, "SELECT debited::text FROM consumable_balances", as: String.self) == "30")
            _ = try await applier.apply([gems("reversed", .restore, t + 2 * day)], connection: c, logger: testLogger)
            _ = try await applier.apply([gems("reversed-copy", .restore, t + 2 * day + 3)], connection: c, logger: testLogger)
            #expect(try await scalar(c, "SELECT balance::text FROM consumable_balances", as: String.self) == "120")
            #expect(try await scalar(c, "SELECT recredited::text FROM consumable_balances", as: String.self) == "30")
            #expect(try await scalar(c, "SELECT count(*) FROM consumable_ledger", as: Int64.self) == 3)
            // A full refund (no percentage) debits all units.
            _ = try await applier.apply([gems("refund-2", .revoke, t + 3 * day, revocation: t + 3 * day)], connection: c, logger: testLogger)
            #expect(try await scalar(c, "SELECT balance::text FROM consumable_balances", as: String.self) == "0")
        }
    }

    @Test("consumables: a reversal delivered before its refund leaves the balance credited")
    func consumableReversalFirst() async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        let t = baseTime
        func gems(_ id: String, _ effect: EntitlementEffect, _ signed: Int64, revocation: Int64? = nil) -> EntitlementEvent {
            makeEvent(id, kind: "K", effect: effect, signed: signed, subject: "user-2", product: "com.example.gems",
                      productType: "Consumable", entitlement: nil, transactionId: "ctx-2", originalTransactionId: "ctx-2",
                      revocationDate: revocation, units: 10)
        }
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            _ = try await applier.apply([gems("buy", .grant, t)], connection: c, logger: testLogger)
            let r = try await applier.apply([gems("rev", .restore, t + 2 * day)], connection: c, logger: testLogger)
            #expect(r.statuses["rev"] == .stale)
            let f = try await applier.apply([gems("ref", .revoke, t + day, revocation: t + day)], connection: c, logger: testLogger)
            #expect(f.statuses["ref"] == .stale)
            #expect(try await scalar(c, "SELECT balance::text FROM consumable_balances", as: String.self) == "10")
        }
    }

    /// An upgrade: one notification (`uuid-up`), two events: REVOKE of the old tier, GRANT of the new one.
    private func upgradeEvents() -> (revokeOld: EntitlementEvent, grantNew: EntitlementEvent) {
        let t = baseTime
        return (
            makeEvent("up-revoke", kind: "PLAN_UPGRADED", effect: .revoke, signed: t, product: "basic",
                      entitlement: "basic", transactionId: "tx-old", notificationType: "DID_CHANGE_RENEWAL_PREF",
                      subtype: "UPGRADE", uuid: "uuid-up"),
            makeEvent("up-grant", kind: "PLAN_UPGRADED", effect: .grant, signed: t, product: "pro",
                      entitlement: "pro", transactionId: "tx-new", validFrom: t, validUntil: t + 30 * day,
                      notificationType: "DID_CHANGE_RENEWAL_PREF", subtype: "UPGRADE", uuid: "uuid-up"))
    }

    @Test("notifications: one row per UUID, the parent originalTransactionId recorded, payload decoded")
    func notifications() async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        // An upgrade: one notification, two events (REVOKE old tier, GRANT new tier).
        let (revokeOld, grantNew) = upgradeEvents()
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            let o = try await applier.apply([revokeOld, grantNew], connection: c, logger: testLogger)
            #expect(o.rowsWritten["notifications"] == 1)
            #expect(o.rowsWritten["entitlement_events"] == 2)
            #expect(try await scalar(c, "SELECT count(*) FROM notifications", as: Int64.self) == 1)
            #expect(try await scalar(c, "SELECT original_transaction_id FROM notifications", as: String.self) == "otx-1")
            #expect(try await scalar(c, "SELECT payload->>'subtype' FROM notifications", as: String.self) == "UPGRADE")
            #expect(try await scalar(c, "SELECT payload->'transaction'->>'transactionId' FROM notifications", as: String.self) == "tx-old")
            #expect(try await scalar(c, "SELECT count(*) FROM entitlements WHERE active", as: Int64.self) == 1)
            // The event log is append-only.
            await #expect(throws: (any Error).self) {
                try await c.query("UPDATE entitlement_events SET status = 'stale'", logger: testLogger)
            }
        }
    }

    @Test("a notification or transaction version already stored under another event is kept once; the new event is written")
    func rowsStoredUnderAnotherEvent() async throws {
        // The first attempt inserts notifications and versions without ON CONFLICT; meeting a stored one must roll
        // the batch back and write it again, not fail it or lose the new event.
        let url = try await TestPostgres.shared.freshDatabase()
        let t = baseTime
        // An upgrade's two events (one notification) in two batches.
        let (revokeOld, grantNew) = upgradeEvents()
        // One signed transaction (same id, same signedDate) from the app and inside Apple's notification.
        let fromApp = makeEvent("buy-app", kind: "SUBSCRIPTION_STARTED", effect: .grant, signed: t + 5, subject: "otx-9",
                                transactionId: "tx-9", originalTransactionId: "otx-9", validFrom: t, validUntil: t + 30 * day)
        let fromApple = makeEvent("buy-apple", kind: "SUBSCRIPTION_STARTED", effect: .grant, signed: t + 5, subject: "otx-9",
                                  transactionId: "tx-9", originalTransactionId: "otx-9", validFrom: t, validUntil: t + 30 * day,
                                  notificationType: "SUBSCRIBED", uuid: "uuid-buy")
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            let first = try await applier.apply([revokeOld, fromApp], connection: c, logger: testLogger)
            #expect(first.rowsWritten["notifications"] == 1 && first.rowsWritten["transaction_versions"] == 2)
            let second = try await applier.apply([grantNew, fromApple], connection: c, logger: testLogger)
            #expect(second.rowsWritten["entitlement_events"] == 2)
            #expect(second.rowsWritten["notifications"] == 1)  // uuid-buy; uuid-up was stored
            #expect(second.rowsWritten["transaction_versions"] == 1)  // tx-new; tx-9's version was stored
            #expect(second.applied + second.stale + second.duplicate == 2)
            #expect(try await scalar(c, "SELECT count(*) FROM notifications", as: Int64.self) == 2)
            #expect(try await scalar(c, "SELECT count(*) FROM transaction_versions", as: Int64.self) == 3)
            #expect(try await scalar(c, "SELECT count(*) FROM entitlement_events", as: Int64.self) == 4)
            #expect(try await scalar(c, "SELECT count(*) FROM entitlements WHERE active AND entitlement = 'pro'", as: Int64.self) == 1)
            // The stored notification keeps its first payload (the revoke's transaction).
            #expect(try await scalar(c, "SELECT payload->'transaction'->>'transactionId' FROM notifications WHERE notification_uuid = 'uuid-up'", as: String.self) == "tx-old")
        }
    }

    @Test("environment is part of every key: Sandbox and Production never collide")
    func environments() async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        let t = baseTime
        let sandbox = makeEvent("sb", kind: "SUBSCRIPTION_STARTED", effect: .grant, signed: t, environment: "Sandbox",
                                validUntil: t + day, notificationType: "SUBSCRIBED", uuid: "same-uuid")
        let production = makeEvent("pr", kind: "REFUNDED", effect: .revoke, signed: t + 5, environment: "Production",
                                   validUntil: t + day, revocationDate: t + 5)
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            _ = try await applier.apply([sandbox, production], connection: c, logger: testLogger)
            #expect(try await scalar(c, "SELECT count(*) FROM transactions", as: Int64.self) == 2)
            #expect(try await scalar(c, "SELECT active FROM entitlements WHERE environment = 'Sandbox'", as: Bool.self))
            #expect(try await scalar(c, "SELECT active FROM entitlements WHERE environment = 'Production'", as: Bool.self) == false)
        }
    }
}

@Suite("Batch preparation (no database)")
struct BatchPreparationTests {
    @Test("a document's text from its record is stored as it came, unless it holds an escaped NUL")
    func documentTextsUsedAsTheyCame() throws {
        var e = makeEvent("texts", kind: "SUBSCRIPTION_RENEWED", effect: .extend, signed: baseTime, validFrom: baseTime,
                          validUntil: baseTime + day, notificationType: "DID_RENEW", uuid: "uuid-texts")
        e.renewalInfo = .object(["note": .string("back\u{0}slash")])
        // A record whose transaction text has a space the sink's own writer would not write: the text kept is the
        // record's.
        let wire = String(decoding: e.jsonBytes(), as: UTF8.self)
        #expect(wire.contains(#""transaction":{""#))
        let spaced = wire.replacingOccurrences(of: #""transaction":{""#, with: #""transaction":{ ""#)
        let record = SinkRecord(topic: "t", partition: 0, offset: 0, key: nil, value: Array(spaced.utf8), headers: [])
        let (event, documents) = try SinkService.decode(record).get()
        #expect(event == e)
        let transactionText = try #require(documents.transaction)
        #expect(transactionText.hasPrefix("{ \"") && spaced.contains(transactionText))
        let plan = BatchPlan(events: [event], documents: [documents])
        let texts = try #require(plan.texts["texts"])
        #expect(texts.transaction == transactionText)
        #expect(texts.renewalInfo == BatchPlan.jsonText(event.renewalInfo), "written again, without the NUL")
        #expect(texts.renewalInfo?.contains("\\u0000") == false)
        #expect(texts.appTransaction == nil && texts.details == nil)
        let a = try JSONValue.parse(bytes: Array(try #require(texts.notification).utf8))
        #expect(a["transaction"] == event.transaction && a["renewalInfo"]?["note"]?.stringValue == "backslash")
        // The transaction's columns are read from its text, as they would be from the document.
        let columns = try #require(texts.transactionColumns)
        #expect(columns.transactionId == e.transaction?["transactionId"]?.stringValue && columns.transactionId != nil)
        #expect(columns.expiresDate == e.transaction?["expiresDate"]?.int64Value && columns.expiresDate != nil)
    }

    @Test("the notification payload spliced from pre-written parts is the same document as one written whole")
    func splicedNotificationPayload() throws {
        var e = makeEvent("splice", kind: "SUBSCRIPTION_RENEWED", effect: .extend, signed: baseTime, validFrom: baseTime,
                          validUntil: baseTime + day, notificationType: "DID_RENEW", uuid: "uuid-splice")
        e.renewalInfo = .object(["autoRenewStatus": .integer(1), "note": .string("back\u{0}slash \"q\"")])
        e.details = .object(["status": .integer(1), "list": .array([.string("a"), .null, .bool(true)])])
        let n = try #require(e.notification)
        let plan = BatchPlan(events: [e])
        let spliced = try #require(plan.texts["splice"]?.notification)
        // The reference: the same document built whole and written in one go.
        var o: [String: JSONValue] = [
            "notificationUUID": .string(n.uuid), "notificationType": .string(n.type), "signedDate": .integer(n.signedDate),
            "environment": .string(e.environment),
        ]
        if let v = n.subtype { o["subtype"] = .string(v) }
        if let v = n.version { o["version"] = .string(v) }
        if let v = e.bundleId { o["bundleId"] = .string(v) }
        if let v = e.appAppleId { o["appAppleId"] = .integer(v) }
        if let v = e.transaction { o["transaction"] = v }
        if let v = e.renewalInfo { o["renewalInfo"] = v }
        if let v = e.appTransaction { o["appTransaction"] = v }
        if let v = e.details { o["details"] = v }
        let whole = try #require(BatchPlan.jsonText(.object(o)))
        let a = try JSONValue.parse(bytes: Array(spliced.utf8))
        let b = try JSONValue.parse(bytes: Array(whole.utf8))
        #expect(a == b, "spliced: \(spliced)\nwhole: \(whole)")
        #expect(a["renewalInfo"]?["note"]?.stringValue == "backslash \"q\"", "NUL dropped inside spliced parts too")
        #expect(a["transaction"] != nil && a["notificationUUID"]?.stringValue == "uuid-splice")
    }
}
