import AppStoreVerification
import EntitlementDomain
import FleetTestSupport
import Foundation
import PostgresNIO
import Synchronization
import Testing

@testable import FleetSink

@Suite("The first attempt's COPY against a real PostgreSQL")
struct CopyTests {
    /// Events whose values would need escapes in COPY text (the binary format has none), NULLs, non-ASCII, the first
    /// and last dates it writes, integers beyond `integer`.
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

    @Test("a batch's COPY rows are sized before they are written: no memory reserved and left unwritten")
    func copyRowsSizedExactly() throws {
        var size = CopySize()
        var rows = CopyBinary(columns: 7)
        func write<W: CopyFields>(_ t: inout W) {
            for text in ["", "ünïcødé ✓", "\u{1F600}\t\\N"] as [String?] + [nil] {
                t.text(text); t.jsonb(text.map { "\"\($0)\"" }); t.int32(text == nil ? nil : 7)
                t.int64(text == nil ? nil : -1); t.boolean(text == nil ? nil : true); t.timestamp(text == nil ? nil : 0)
                t.null()
                t.endRow()
            }
        }
        write(&size)
        write(&rows)
        #expect(size.byteCount == rows.bytes.count && size.byteCount == rows.byteCount)
        let plan = BatchPlan(events: awkwardEvents())
        for copy in [plan.allNew.notificationsCopy, plan.allNew.versionsCopy, plan.allNew.eventsCopy] {
            let copy = try #require(copy)
            // What the allocator rounds up to, no more (the rows once reserved 1-4 KB each, used or not).
            #expect(copy.bytes.capacity - copy.bytes.count < 64, "\(copy.table): \(copy.bytes.count) bytes in \(copy.bytes.capacity)")
        }
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
                try await plan.execute(on: tx, copying: GuardedConnection(tx), checkStored: true, logger: testLogger)
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

    @Test("copied notifications get the batch transaction's start as applied_at, as the insert's now() does")
    func appliedAtIsTransactionStart() async throws {
        let events = awkwardEvents()
        let plan = BatchPlan(events: events)
        #expect(plan.allNew.notificationsCopy != nil)
        let url = try await TestPostgres.shared.freshDatabase()
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            let same = try await c.withTransaction(logger: testLogger) { tx in
                // A moment inside the transaction, so that a clock read by the sink instead would differ.
                try await tx.query("SELECT pg_sleep(0.05)", logger: testLogger)
                let o = try await plan.execute(on: tx, copying: GuardedConnection(tx), checkStored: false, logger: testLogger)
                #expect(o.rowsWritten["notifications"] == 2)
                return try await scalar(tx, "SELECT bool_and(applied_at = now()) FROM notifications", as: Bool.self)
            }
            #expect(same)
        }
    }

    @Test("COPY's timestamps are fleet_ms's to the millisecond")
    func timestampsMatchFleetMs() async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        var samples: [Int64] = [
            0, 1, 999, 1_000, 86_399_999, 86_400_000, 946_684_799_999, 946_684_800_000 /* PostgreSQL's epoch */,
            951_782_400_000 /* 2000-02-29 */, 951_868_799_999, 1_700_000_000_123, 4_102_444_799_999 /* 2099-12-31 23:59:59.999 */,
        ]
        var random = SystemRandomNumberGenerator()
        for _ in 0..<300 { samples.append(Int64.random(in: 0..<4_102_444_800_000, using: &random)) }
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            try await c.query("CREATE TABLE ts (i integer, ms bigint, t timestamptz)", logger: testLogger)
            var t = CopyBinary(columns: 3)
            for (i, ms) in samples.enumerated() {
                #expect(CopyBinary.isWritable(ms))
                t.int32(Int32(i)); t.int64(ms); t.timestamp(ms)
                t.endRow()
            }
            try await GuardedConnection(c).copy(CopyRows(table: "ts", columns: ["i", "ms", "t"], rows: t), logger: testLogger)
            // Equal to fleet_ms and to the exact instant, for every sample.
            let wrong = try await c.query("""
                SELECT count(*) FROM ts
                WHERE t IS DISTINCT FROM fleet_ms(ms) OR t <> 'epoch'::timestamptz + ms * interval '1 millisecond'
                """, logger: testLogger).collect()
            #expect(try wrong.first?.decode(Int64.self) == 0)
            #expect(try await scalar(c, "SELECT count(*) FROM ts", as: Int64.self) == Int64(samples.count))
        }
        #expect(!CopyBinary.isWritable(4_102_444_800_000) && !CopyBinary.isWritable(-1))
    }

    /// postgres-nio 1.33 traps when a connection leaves its query during a COPY (`GuardedConnection` says how). Found
    /// in the thirteenth session: once in `make test`'s database-outage test ("Copy mode is only supported for extended
    /// queries", a server-side close), and here in seconds with a client-side `close()` ("Invalid query state machine
    /// action in state: .closing, action: wait"), which is what the sink's batch timeout does. Each COPY here is
    /// bounded: a COPY that never returns (a writer left waiting for backpressure) fails the test instead of holding it.
    @Test("a connection that closes during a COPY (server or client side) ends it with an error, never a trap or a hang")
    func connectionClosedDuringCopy() async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            try await c.query("CREATE TABLE big (t text)", logger: testLogger)
        }
        // ~24 MB: the COPY lasts long enough for the close to land before, during and after its write.
        var t = CopyBinary(columns: 1)
        let text = String(repeating: "x", count: 4000)
        for _ in 0..<6000 { t.text(text); t.endRow() }
        let rows = CopyRows(table: "big", columns: ["t"], rows: t)
        struct Hung: Error {}
        var outcomes: [String: Int] = [:]
        let delays = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 5, 5, 8, 8, 12, 12, 20, 20, 40, 40, 80, 80, 160, 160, 400, 400, 1000, 1000]
        for (i, delay) in delays.enumerated() {
            let byServer = i % 2 == 0
            let config = try DatabaseURL(url).connectionConfiguration()
            let c = try await PostgresConnection.connect(configuration: config, id: 10 + i, logger: testLogger)
            let guarded = GuardedConnection(c)
            let pid = try await scalar(c, "SELECT pg_backend_pid()", as: Int32.self)
            let closer = Task {
                try await Task.sleep(for: .milliseconds(delay))
                if byServer {
                    _ = try await withConnection(url) { (other: PostgresConnection) async throws -> Bool in
                        try await scalar(other, "SELECT pg_terminate_backend(\(pid))", as: Bool.self)
                    }
                } else {
                    await guarded.close()
                }
            }
            let outcome: String
            do {
                try await Race<Void>.run(within: .seconds(30), timedOut: Hung(), body: {
                    try await guarded.copy(rows, logger: testLogger)
                }, onTimeout: {})
                outcome = "copied"
            } catch is Hung {
                Issue.record("the COPY did not end within 30 s (\(byServer ? "server" : "client") close after \(delay) ms)")
                outcome = "hung"
            } catch let closed as GuardedConnection.ClosedDuringCopy {
                outcome = closed.requested ? "closed by request" : "closed"
            } catch {
                outcome = "error"
            }
            outcomes[outcome, default: 0] += 1
            _ = try? await closer.value
            if !byServer {
                // Closed once the COPY ended, whichever way it did.
                #expect(guarded.isCloseRequested)
                for _ in 0..<100 where !c.isClosed { try await Task.sleep(for: .milliseconds(10)) }
                #expect(c.isClosed, "a close requested during a COPY closes the connection when the COPY ends")
            }
            await guarded.close()
        }
        // Still here: every close ended its COPY with an error or after it, and the early ones with an error.
        #expect(outcomes["hung"] == nil)
        #expect(outcomes.filter { $0.key != "copied" }.values.reduce(0, +) >= 4, "\(outcomes)")
        // A healthy connection still copies.
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            try await c.query("TRUNCATE big", logger: testLogger)
            try await GuardedConnection(c).copy(rows, logger: testLogger)
            #expect(try await scalar(c, "SELECT count(*) FROM big", as: Int64.self) == 6000)
        }
    }

    /// A fresh database with an empty table `small (t text)`, one row to copy into it, and a connection of its own.
    private func oneRowTable() async throws -> (String, CopyRows, PostgresConnection) {
        let url = try await TestPostgres.shared.freshDatabase()
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            try await c.query("CREATE TABLE small (t text)", logger: testLogger)
        }
        var t = CopyBinary(columns: 1)
        t.text("a"); t.endRow()
        let config = try DatabaseURL(url).connectionConfiguration()
        let c = try await PostgresConnection.connect(configuration: config, id: 98, logger: testLogger)
        return (url, CopyRows(table: "small", columns: ["t"], rows: t), c)
    }

    @Test("a close requested while PostgreSQL is in COPY mode waits for the COPY to end, which then fails")
    func closeInCopyMode() async throws {
        let (url, rows, c) = try await oneRowTable()
        // PostgresNIO 1.33 traps on a close at this point (its query machine answers `.wait` in `.closing`).
        let guarded = GuardedConnection(c, beforeWrite: { g in await g.close() })
        await #expect(throws: GuardedConnection.ClosedDuringCopy.self) { try await guarded.copy(rows, logger: testLogger) }
        #expect(c.isClosed, "closed as the COPY ended")
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            #expect(try await scalar(c, "SELECT count(*) FROM small", as: Int64.self) == 0, "nothing was copied")
        }
    }

    @Test("a close requested before a COPY refuses it; one requested after closes at once")
    func closeOutsideCopy() async throws {
        let (_, rows, c) = try await oneRowTable()
        let guarded = GuardedConnection(c)
        try await guarded.copy(rows, logger: testLogger)
        #expect(!c.isClosed)
        await guarded.close()
        #expect(c.isClosed)
        await #expect(throws: GuardedConnection.ClosedDuringCopy.self) { try await guarded.copy(rows, logger: testLogger) }
    }

    private struct Hung: Error {}

    @Test("a statement sent after the channel closed: PostgresNIO never answers it; bounded, it is not sent and fails at once")
    func statementAfterClose() async throws {
        let (_, _, c) = try await oneRowTable()
        try await c.close()
        // The premise: unbounded, only a deadline ends it (the statement's write fails at the channel's head with no
        // promise). Should PostgresNIO start failing it, this expectation fails and the close watch can go.
        await #expect(throws: Hung.self) {
            try await Race<Void>.run(within: .seconds(2), timedOut: Hung(), body: {
                _ = try await c.query("SELECT 1", logger: testLogger)
            }, onTimeout: {})
        }
        // A closed channel is noticed whether it closed before the call (here: nothing is sent, so no task is left
        // waiting forever) or during it (the next test).
        let guarded = GuardedConnection(c, closedGrace: .milliseconds(200))
        let started = ContinuousClock.now
        let ran = Mutex(false)
        do {
            try await guarded.bounded(within: .seconds(30), timedOut: Hung(), onTimeout: {}) {
                ran.withLock { $0 = true }
                _ = try await c.query("SELECT 1", logger: testLogger)
            }
            Issue.record("a statement on a closed connection succeeded")
        } catch let lost as GuardedConnection.ConnectionLost {
            #expect(lost.beforeSending)
        }
        #expect(!ran.withLock { $0 }, "the statement was not sent")
        #expect(ContinuousClock.now - started < .seconds(10), "not ended by the 30 s deadline")
    }

    @Test("a statement in flight when the channel closes: PostgresNIO's own error, or the grace; never the deadline")
    func statementWhenChannelCloses() async throws {
        let (url, _, c) = try await oneRowTable()
        let guarded = GuardedConnection(c, closedGrace: .seconds(3))
        // A healthy statement is not disturbed, and leaves no watch behind.
        #expect(try await guarded.bounded(within: .seconds(30), timedOut: Hung(), onTimeout: {}) {
            try await scalar(c, "SELECT 41 + 1", as: Int32.self)
        } == 42)
        let pid = try await scalar(c, "SELECT pg_backend_pid()", as: Int32.self)
        let killer = Task {
            try await Task.sleep(for: .milliseconds(300))
            _ = try await withConnection(url) { (other: PostgresConnection) async throws -> Bool in
                try await scalar(other, "SELECT pg_terminate_backend(\(pid))", as: Bool.self)
            }
        }
        let started = ContinuousClock.now
        do {
            _ = try await guarded.bounded(within: .seconds(30), timedOut: Hung(), onTimeout: {}) {
                try await c.query("SELECT pg_sleep(20)", logger: testLogger).collect()
            }
            Issue.record("the statement outlived its backend")
        } catch is Hung {
            Issue.record("only the deadline ended the statement")
        } catch {
            // PostgresNIO fails a statement in flight when the channel goes inactive, before the grace ends.
            #expect(!(error is GuardedConnection.ConnectionLost), "\(error)")
        }
        #expect(ContinuousClock.now - started < .seconds(10))
        try await killer.value
        // The server's FATAL error can reach the statement a moment before the channel itself closes.
        for _ in 0..<200 where !c.isClosed { try await Task.sleep(for: .milliseconds(10)) }
        #expect(c.isClosed)
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

    @Test("the binary rows: a field count per row, a length per field, -1 for NULL, big-endian values")
    func binaryLayout() {
        var t = CopyBinary(columns: 7)
        t.text("a\tü"); t.text(nil); t.int32(-5); t.int64(1); t.boolean(true); t.jsonb("{}"); t.timestamp(946_684_800_001)
        t.endRow()
        var expected: [UInt8] = [0, 7]                                  // 7 fields
        expected += [0, 0, 0, 4]; expected += Array("a\tü".utf8)         // text: length, bytes as they are
        expected += [0xFF, 0xFF, 0xFF, 0xFF]                              // NULL
        expected += [0, 0, 0, 4, 0xFF, 0xFF, 0xFF, 0xFB]                  // integer -5
        expected += [0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 1]                  // bigint 1
        expected += [0, 0, 0, 1, 1]                                       // true
        expected += [0, 0, 0, 3, 1]; expected += Array("{}".utf8)         // jsonb: version 1, then the text
        expected += [0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0x03, 0xE8]            // 2000-01-01 00:00:00.001 UTC: 1000 us
        #expect(t.bytes == expected)
    }

    @Test("the binary COPY statement passes only the sink's identifiers")
    func copyTarget() {
        #expect(CopyRows.binaryCopyTarget(table: "notifications", columns: ["a_b", "c"])
                == #"notifications" ("a_b", "c") FROM STDIN WITH (FORMAT binary) --"#)
    }
}
