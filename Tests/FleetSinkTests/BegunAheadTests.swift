import EntitlementDomain
import FleetTestSupport
import Foundation
import PostgresNIO
import Synchronization
import Testing

@testable import FleetSink

/// The next batch's transaction begun behind a batch's COMMIT (`EventApplier.apply`'s `openNext`).
@Suite("A batch begun behind the previous COMMIT")
struct BegunAheadTests {
    let applier = EventApplier()

    /// A constraint trigger checked at COMMIT that fails the transaction holding the event `eventId`, once (a
    /// sequence is not undone by the rollback), with a serialization failure: not a data error, so retried.
    private func commitFailsOnce(_ url: String, eventId: String) async throws {
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            try await c.query("CREATE SEQUENCE commit_fails_once", logger: testLogger)
            try await c.query(PostgresQuery(unsafeSQL: """
                CREATE FUNCTION commit_fails_once() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF NEW.event_id = '\(eventId)' AND nextval('commit_fails_once') = 1 THEN
                        RAISE EXCEPTION 'the COMMIT is refused once' USING ERRCODE = '40001';
                    END IF;
                    RETURN NULL;
                END $$
                """), logger: testLogger)
            try await c.query("""
                CREATE CONSTRAINT TRIGGER commit_fails_once AFTER INSERT ON entitlement_events
                    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION commit_fails_once()
                """, logger: testLogger)
        }
    }

    @Test("batches begun behind each other's COMMIT leave the same rows as batches written one after the other")
    func sameRows() async throws {
        let stream = mixedStream()
        let batches = chunks(stream, of: 7).map { applier.prepare($0) }
        let oneByOne = try await TestPostgres.shared.freshDatabase()
        let ahead = try await TestPostgres.shared.freshDatabase()
        var expected: [String: String] = [:]
        try await onDatabase(oneByOne) { (c: PostgresConnection) async throws in
            for batch in batches { _ = try await applier.apply(batch, connection: c, logger: testLogger) }
            expected = try await stateDump(c)
        }
        try await onDatabase(ahead) { (c: PostgresConnection) async throws in
            let guarded = GuardedConnection(c)
            var opened: OpenedBatch?
            var begunAhead = 0
            for (i, batch) in batches.enumerated() {
                let following = i + 1 < batches.count ? batches[i + 1] : nil
                if opened != nil { begunAhead += 1 }
                (_, opened) = try await applier.apply(
                    batch, connection: guarded, opened: opened, openNext: { following }, logger: testLogger)
            }
            #expect(opened == nil)
            // A batch whose first attempt met stored rows (the stream redelivers some events) is written again in a
            // transaction of its own, without the next one begun behind it.
            #expect(begunAhead >= batches.count / 2, "\(begunAhead) of \(batches.count) batches begun behind the one before")
            let dump = try await stateDump(c)
            #expect(dump["entitlement_events"]?.split(separator: "\n").count == stream.count)
            for table in dumpedTables where table != "schema_migrations" {
                #expect(dump[table] == expected[table], "\(table) differs")
            }
        }
    }

    @Test("the COMMIT fails with the next batch begun behind it: the next batch is abandoned with the connection, nothing of either is stored, and both are written once when applied again")
    func commitFailsWithNextBegun() async throws {
        let stream = mixedStream()
        let half = stream.count / 2
        let (first, second) = (applier.prepare(Array(stream[..<half])), applier.prepare(Array(stream[half...])))
        let url = try await TestPostgres.shared.freshDatabase()
        try await commitFailsOnce(url, eventId: stream[0].eventId)
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            let guarded = GuardedConnection(c)
            let handedOver = Mutex(false)
            do {
                _ = try await applier.apply(first, connection: guarded, opened: nil, openNext: {
                    handedOver.withLock { $0 = true }
                    return second
                }, logger: testLogger)
                Issue.record("the COMMIT was expected to fail")
            } catch let error as BatchTransactionError {
                #expect(error.commitError != nil, "\(error)")
                #expect(SinkService.sqlState(of: error) == "40001")
                #expect(SinkService.refusedData(error) == nil, "retried, not isolated")
            }
            #expect(handedOver.withLock { $0 }, "the next batch was begun behind the COMMIT")
            #expect(guarded.isCloseRequested && c.isClosed, "the connection (and the next batch's transaction) closed")
        }
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            #expect(try await scalar(c, "SELECT count(*) FROM entitlement_events", as: Int64.self) == 0)
            #expect(try await scalar(c, "SELECT count(*) FROM notifications", as: Int64.self) == 0)
            #expect(try await scalar(c, "SELECT count(*) FROM transaction_versions", as: Int64.self) == 0)
            let guarded = GuardedConnection(c)
            let (o1, next) = try await applier.apply(first, connection: guarded, opened: nil, openNext: { second }, logger: testLogger)
            #expect(next != nil)
            let (o2, none) = try await applier.apply(second, connection: guarded, opened: next, openNext: nil, logger: testLogger)
            #expect(none == nil)
            #expect(o1.rowsWritten["entitlement_events"] == half && o2.rowsWritten["entitlement_events"] == stream.count - half)
            #expect(try await scalar(c, "SELECT count(DISTINCT event_id) FROM entitlement_events", as: Int64.self) == Int64(stream.count))
        }
    }

    @Test("a batch begun on a connection that is no longer the batch's is abandoned, and the batch written on the new one")
    func openedOnAnotherConnection() async throws {
        let stream = mixedStream()
        let batch = applier.prepare(stream)
        let url = try await TestPostgres.shared.freshDatabase()
        try await onDatabase(url) { (old: PostgresConnection) async throws in
            let stale = applier.open(batch, on: GuardedConnection(old), logger: testLogger)
            try await onDatabase(url) { (c: PostgresConnection) async throws in
                let (outcome, _) = try await applier.apply(
                    batch, connection: GuardedConnection(c), opened: stale, openNext: nil, logger: testLogger)
                #expect(outcome.rowsWritten["entitlement_events"] == stream.count)
            }
            #expect(old.isClosed, "the stale transaction's connection was closed")
        }
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            #expect(try await scalar(c, "SELECT count(*) FROM entitlement_events", as: Int64.self) == Int64(stream.count))
        }
    }

    @Test("the sink service: a COMMIT that fails once with the next batch begun behind it; every record marked in order, every event written once")
    func serviceCommitFails() async throws {
        let stream = mixedStream(subjects: 20)
        let url = try await TestPostgres.shared.freshDatabase()
        try await commitFailsOnce(url, eventId: stream[0].eventId)
        let source = MemorySource(records(stream))
        let reports = Mutex<[SinkService.BatchReport]>([])
        let service = SinkService(
            configuration: .init(databaseURL: try DatabaseURL(url), maxBatchSize: 10, initialBackoff: .milliseconds(10)),
            source: source, rejected: MemoryRejects(), logger: testLogger,
            onBatch: { report in reports.withLock { $0.append(report) } })
        let task = Task { try await service.run() }
        try await waitUntil(timeout: .seconds(30)) { source.marked.count == stream.count }
        task.cancel()
        _ = try? await task.value
        #expect(source.marked == Array(0..<Int64(stream.count)))
        #expect(reports.withLock { $0.contains(where: \.begunAhead) }, "batches were begun behind the one before")
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            #expect(try await scalar(c, "SELECT last_value FROM commit_fails_once", as: Int64.self) >= 1, "a COMMIT failed")
            #expect(try await scalar(c, "SELECT count(*) FROM entitlement_events", as: Int64.self) == Int64(Set(stream.map(\.eventId)).count))
            #expect(try await scalar(c, "SELECT count(*) FROM consumable_ledger WHERE entry = 'credit'", as: Int64.self) == 20)
        }
    }
}
