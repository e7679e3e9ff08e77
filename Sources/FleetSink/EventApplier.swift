import AppStoreVerification
import EntitlementDomain
import EntitlementRules
import Foundation
import Logging
import PostgresNIO
import Synchronization

/// What one batch did.
public struct ApplyOutcome: Sendable, Equatable {
    public var applied = 0
    public var stale = 0
    /// Events whose `eventId` was already stored (redelivery), plus new events for a fact already recorded
    /// (a consumable credited once, a refund already debited).
    public var duplicate = 0
    /// Rows inserted or updated, per table.
    public var rowsWritten: [String: Int] = [:]

    public init() {}

    /// The status written for each new event, by eventId (redelivered events are absent).
    public var statuses: [String: EventStatus] = [:]
}

/// Writes batches of verified entitlement events to PostgreSQL: one database transaction per batch, the append-only
/// rows of a batch assumed new sent by `COPY ... FROM STDIN` (`CopyRows`), every other write a multi-row statement
/// (`INSERT ... SELECT ... FROM (SELECT unnest($1::text[]) AS a, ...)`, whole columns bound as arrays: see
/// `ColumnBinds.rows`); idempotent by eventId, notificationUUID and (environment, transactionId[, signedDate]).
///
/// Ordering (docs/entitlement-mapping.md, "Ordering and idempotency"): within a batch events are applied in signedDate
/// order; an event signed before what an entitlement last applied is recorded as `stale` and changes nothing.
/// The state machine runs in Swift over the current rows read under per-key advisory locks (so two sinks working on
/// the same subject serialize), then the resulting rows are written set-based.
///
/// Nothing written depends on the wall clock except `notifications.applied_at`, which is written once (a
/// redelivery never updates a row), so replaying a stream leaves every table byte-for-byte unchanged.
public struct EventApplier: Sendable {
    public init() {}

    public func apply(
        _ events: [EntitlementEvent], connection: PostgresConnection, logger: Logger
    ) async throws -> ApplyOutcome {
        try await apply(prepare(events), connection: connection, logger: logger)
    }

    /// The database-independent part of a batch (ordering, the JSON text of every payload): the sink prepares the
    /// next batch while the current one is written.
    /// `documents[i]`, when given, is the text of the documents `events[i]` embeds as its record carried them
    /// (stored as it came instead of being written again).
    public func prepare(_ events: [EntitlementEvent], documents: [EventDocumentTexts]? = nil) -> PreparedBatch {
        PreparedBatch(plan: BatchPlan(events: events, documents: documents))
    }

    public func apply(_ batch: PreparedBatch, connection: PostgresConnection, logger: Logger) async throws -> ApplyOutcome {
        try await apply(batch, connection: GuardedConnection(connection), logger: logger)
    }

    /// As `apply(_:connection:logger:)`, on a connection that something else may close meanwhile (the sink's batch
    /// timeout): its COPYs keep that close from reaching PostgresNIO mid-COPY (`GuardedConnection`).
    public func apply(_ batch: PreparedBatch, connection guarded: GuardedConnection, logger: Logger) async throws -> ApplyOutcome {
        try await apply(batch, connection: guarded, opened: nil, openNext: nil, logger: logger).outcome
    }

    /// Writes `batch` in one transaction. `opened`: the batch's transaction already begun on `guarded` by the call
    /// before (`open(_:on:logger:)`); it is used, or closed and abandoned when it is not on `guarded`.
    ///
    /// `openNext`, once the batch's writes are all done and its COMMIT is queued, may hand over the next batch: its
    /// transaction is then begun right behind the COMMIT (BEGIN, locks, reads and the COPYs that need nothing read,
    /// `BatchPlan.open`), and returned. PostgreSQL goes from this batch's COMMIT to the next batch's work without
    /// waiting for the sink to see the COMMIT's answer, mark the offsets and come back (~8 ms of a ~55 ms batch at
    /// `bench sink`'s rate, during which the backend sat idle). The next batch's statements run after the COMMIT on
    /// the same connection, so its reads see this batch's rows; if the COMMIT fails, the connection is closed (the
    /// next batch's transaction with it) and the error thrown.
    ///
    /// Redelivered events are rare (a restart, a rebalance, a worker retrying), and so are notifications and
    /// transaction versions stored under another event (the second event of an upgrade in a later batch; one signed
    /// transaction delivered by the app and by Apple): the batch is first written as if every row were new, with plain
    /// inserts (no ON CONFLICT: no speculative insertion, no extra index probe per row). A row already stored fails
    /// its insert (unique violation), and the batch is then rolled back and written again with the stored events
    /// looked up and left out and ON CONFLICT DO NOTHING on those inserts.
    func apply(
        _ batch: PreparedBatch, connection guarded: GuardedConnection, opened: OpenedBatch?,
        openNext: (@Sendable () async -> PreparedBatch?)?, logger: Logger
    ) async throws -> (outcome: ApplyOutcome, next: OpenedBatch?) {
        var opened = opened
        if let stale = opened, stale.guarded !== guarded || batch.plan.events.isEmpty {
            await stale.abandon()
            opened = nil
        }
        if batch.plan.events.isEmpty { return (ApplyOutcome(), nil) }
        let connection = guarded.connection
        let outcome: ApplyOutcome
        do {
            outcome = try await (opened ?? open(batch, on: guarded, logger: logger)).finish(logger: logger)
        } catch {
            var failure = BatchTransactionError(closureError: error)
            do { try await connection.query("ROLLBACK", logger: logger) } catch { failure.rollbackError = error }
            guard failure.rollbackError == nil, BatchPlan.metStoredRows(error) else { throw failure }
            let outcome = try await connection.withTransaction(logger: logger) { tx in
                try await batch.plan.execute(on: tx, copying: guarded, checkStored: true, logger: logger)
            }
            return (outcome, nil)
        }
        let committed: EventLoopFuture<PostgresQueryResult> = connection.query("COMMIT", logger: logger)
        var next: OpenedBatch?
        if let openNext, let upcoming = await openNext(), !upcoming.plan.events.isEmpty {
            next = open(upcoming, on: guarded, logger: logger)
        }
        do {
            _ = try await committed.get()
        } catch {
            if let next {
                await guarded.close()
                await next.abandon()
            }
            throw BatchTransactionError(commitError: error)
        }
        return (outcome, next)
    }

    /// Begins `batch`'s transaction on `guarded` (first attempt: every row assumed new) and queues its first
    /// statements, without waiting for any answer (`OpenedBatch`).
    func open(_ batch: PreparedBatch, on guarded: GuardedConnection, logger: Logger) -> OpenedBatch {
        let begun = guarded.connection.query("BEGIN", logger: logger)
        return batch.plan.open(on: guarded, begun: begun, logger: logger)
    }
}

/// How a batch's own transaction failed (the sink's transactions are begun and ended by `EventApplier.apply`, so
/// that a COMMIT can be queued with the next batch's first statements behind it): like PostgresNIO's
/// `PostgresTransactionError`, the statement's error and whether the rollback after it failed too.
public struct BatchTransactionError: Error, CustomStringConvertible {
    /// The error of a statement of the batch (the transaction was then rolled back).
    public var closureError: (any Error)?
    /// The error of the ROLLBACK sent after `closureError`: the connection broke.
    public var rollbackError: (any Error)?
    /// The error of the COMMIT.
    public var commitError: (any Error)?

    init(closureError: (any Error)? = nil, rollbackError: (any Error)? = nil, commitError: (any Error)? = nil) {
        self.closureError = closureError
        self.rollbackError = rollbackError
        self.commitError = commitError
    }

    public var description: String {
        if let commitError { return "the batch's COMMIT failed: \(String(reflecting: commitError))" }
        return "the batch failed: \(closureError.map { String(reflecting: $0) } ?? "?")"
            + (rollbackError.map { "; its ROLLBACK failed too: \(String(reflecting: $0))" } ?? "")
    }
}

/// The first error of a batch's statements, as PostgreSQL met them, kept across the batch's two tasks (its own and
/// the one sending the COPYs that need nothing read): a statement queued behind a failed one only fails with 25P02
/// (the transaction is aborted), so any other error replaces such a one.
final class FirstFailure: Sendable {
    private let first = Mutex<(any Error)?>(nil)

    func keep(_ error: any Error) {
        first.withLock { kept in
            if kept == nil || (BatchPlan.isAbortedTransaction(kept!) && !BatchPlan.isAbortedTransaction(error)) { kept = error }
        }
    }

    var error: (any Error)? { first.withLock { $0 } }
}

/// A batch whose first statements are queued on a connection (`BatchPlan.open`): the BEGIN (when it opened the
/// transaction), the locks, the reads and the writes that need nothing read, none of them awaited yet. `finish`
/// awaits them, folds, and queues and awaits the rest; `abandon` gives it up.
final class OpenedBatch: Sendable {
    typealias Answer = EventLoopFuture<PostgresQueryResult>
    typealias Appended = (copied: [String: Int], currentFacts: Answer?)

    let guarded: GuardedConnection
    let plan: BatchPlan
    /// The events written (the batch's, less those already stored and second copies).
    let fresh: [EntitlementEvent]
    /// nil: nothing to write (every event of the batch was already stored).
    let writes: BatchPlan.Statements?
    let failures: FirstFailure
    let begun: Answer?
    let locked: Answer?
    let entitlementsRead: Answer?
    let ledgerEntriesRead: Answer?
    let ledgerRestoresRead: Answer?
    let notifications: Answer?
    let transactionsInserted: Answer?
    let appended: Task<Appended, Never>?

    init(
        guarded: GuardedConnection, plan: BatchPlan, fresh: [EntitlementEvent], writes: BatchPlan.Statements?,
        failures: FirstFailure, begun: Answer?, locked: Answer?, entitlementsRead: Answer? = nil,
        ledgerEntriesRead: Answer? = nil, ledgerRestoresRead: Answer? = nil, notifications: Answer? = nil,
        transactionsInserted: Answer? = nil, appended: Task<Appended, Never>? = nil
    ) {
        self.guarded = guarded
        self.plan = plan
        self.fresh = fresh
        self.writes = writes
        self.failures = failures
        self.begun = begun
        self.locked = locked
        self.entitlementsRead = entitlementsRead
        self.ledgerEntriesRead = ledgerEntriesRead
        self.ledgerRestoresRead = ledgerRestoresRead
        self.notifications = notifications
        self.transactionsInserted = transactionsInserted
        self.appended = appended
    }

    struct Abandoned: Error, CustomStringConvertible {
        var description: String { "the batch was abandoned before it was written" }
    }

    /// Gives the batch up: nothing more is sent for it, its connection is closed (which rolls its transaction
    /// back), and its COPYs' task is awaited. Its records were never marked: they are written again later.
    func abandon() async {
        failures.keep(Abandoned())
        await guarded.close()
        _ = await appended?.value
    }

    /// Awaits the reads, folds (EntitlementRules), queues the writes that depend on the fold and awaits every
    /// statement of the batch. Throws the error PostgreSQL met first (the transaction is then aborted).
    func finish(logger: Logger) async throws -> ApplyOutcome {
        let tx = guarded.connection
        var outcome = ApplyOutcome()
        let trace = BatchPlan.tracePhases
        var mark = ContinuousClock.now
        var phases: [String] = []
        func phase(_ name: String) {
            guard trace else { return }
            let now = ContinuousClock.now
            phases.append("\(name)=\(Int((now - mark) / .microseconds(1)) / 1000)ms")
            mark = now
        }
        defer { if trace { FileHandle.standardError.write((phases.joined(separator: " ") + "\n").data(using: .utf8)!) } }

        // Every statement goes to the connection's queue as soon as nothing it needs is missing, without waiting for
        // the answer of the one before: PostgresNIO sends a queued statement the moment the previous one completes, so
        // PostgreSQL goes from the locks to the reads to the writes without waiting for this task, which meanwhile
        // decodes the rows read and folds (`bench sink`, alternated with the one-by-one build: 12,721-14,058 vs
        // 10,704-13,916 events/s). A statement queued behind a failed one only fails with 25P02 (`FirstFailure`).
        func queue(_ query: PostgresQuery?) -> Answer? {
            query.map { tx.query($0, logger: logger) }
        }
        func settle<T: Sendable>(_ future: EventLoopFuture<T>?) async -> T? {
            do { return try await future?.get() } catch { failures.keep(error); return nil }
        }
        /// The rows a statement wrote, from its one `count(*)` row.
        func rowCount(_ future: Answer?) async -> Int? {
            guard let result = await settle(future) else { return nil }
            do { return try result.rows.reduce(0) { $0 + Int(try $1.decode(Int64.self)) } } catch { failures.keep(error); return nil }
        }

        _ = await settle(begun)
        outcome.duplicate = plan.events.count - fresh.count
        guard let writes else {
            _ = await settle(locked)
            if let failure = failures.error { throw failure }
            return outcome
        }
        _ = await settle(locked)
        let entitlementRows = await settle(entitlementsRead)
        let ledgerEntries = await settle(ledgerEntriesRead)
        let ledgerRestores = await settle(ledgerRestoresRead)
        phase("reads")
        var decision: EntitlementRules.Decision?
        if failures.error == nil {
            do {
                let entitlements = try plan.decodeEntitlements(entitlementRows?.rows ?? [])
                let ledgers = try plan.decodeLedgers((ledgerEntries?.rows ?? [], ledgerRestores?.rows ?? []))
                phase("load")
                // 4. The entitlement rules (pure Swift, EntitlementRules).
                decision = EntitlementRules.fold(fresh, entitlements: entitlements, ledgers: ledgers)
                phase("fold")
            } catch { failures.keep(error) }
        }
        guard let decision else {
            // The reads failed: nothing may be written. The COPYs' task sees the failure and sends nothing more.
            _ = await appended?.value
            throw failures.error!
        }
        let statuses = decision.statuses
        for (event, status) in zip(fresh, statuses) {
            outcome.statuses[event.eventId] = status
            switch status {
            case .applied: outcome.applied += 1
            case .stale: outcome.stale += 1
            case .duplicate: outcome.duplicate += 1
            }
        }

        // 5. The writes that depend on the fold, queued together behind the others; the COPY of the events once the
        // COPYs before it are done (one COPY at a time on a connection).
        let eventsWritten = queue(writes.events?.query(statuses: statuses))
        let entitlementsWritten = queue(BatchPlan.entitlementsWrite(decision.changedRows))
        let ledgerWritten = queue(BatchPlan.ledgerWrite(decision.newLedgerEntries))
        var (copied, transactions) = await appended?.value ?? ([:], nil)
        phase("notifications+versions")
        if let copy = writes.eventsCopy?.completed(last: statuses.map(\.rawValue)), failures.error == nil {
            do {
                try await guarded.copy(copy, logger: logger)
                copied[copy.table] = copy.rowCount
            } catch { failures.keep(error) }
        }
        transactions = transactions ?? transactionsInserted
        // Every queued statement is awaited. The error thrown is the one PostgreSQL met first: a statement queued
        // behind a failed one only reports that the transaction is aborted (25P02), and a first attempt's unique
        // violation must surface as itself for `metStoredRows`.
        outcome.rowsWritten["notifications"] = await rowCount(notifications) ?? copied["notifications"]
        if let row = await settle(transactions)?.rows.first {
            do {
                let (versions, current) = try row.decode((Int64, Int64).self)
                outcome.rowsWritten["transaction_versions"] = Int(versions) + (copied["transaction_versions"] ?? 0)
                outcome.rowsWritten["transactions"] = Int(current)
            } catch { failures.keep(error) }
        }
        outcome.rowsWritten["entitlement_events"] = await rowCount(eventsWritten) ?? copied["entitlement_events"]
        outcome.rowsWritten["entitlements"] = await rowCount(entitlementsWritten) ?? 0
        outcome.rowsWritten["consumable_ledger"] = await rowCount(ledgerWritten) ?? 0
        if let failure = failures.error { throw failure }
        phase("events+entitlements+ledger+facts")
        return outcome
    }
}

/// A batch ready to be written (see `EventApplier.prepare`).
public struct PreparedBatch: Sendable {
    let plan: BatchPlan
    public var count: Int { plan.events.count }
}

/// The JSON text of an event's payload columns, computed once per event before the database transaction, and the
/// columns read from its transaction document.
struct EventTexts: Sendable {
    var notification: String? = nil
    var transaction: String?
    var renewalInfo: String?
    var appTransaction: String?
    var details: String?
    var transactionColumns: TransactionColumns? = nil
}

/// Everything a batch needs, prepared before the transaction starts.
struct BatchPlan: Sendable {
    let events: [EntitlementEvent]
    /// By eventId (the first event of an id wins, as in the writes).
    let texts: [String: EventTexts]

    init(events: [EntitlementEvent], documents: [EventDocumentTexts]? = nil) {
        // Stable order by signedDate: within a key, events apply in signing order; ties keep delivery order.
        let order = events.indices.sorted { (events[$0].signedDate, $0) < (events[$1].signedDate, $1) }
        self.events = order.map { events[$0] }
        var texts: [String: EventTexts] = [:]
        texts.reserveCapacity(events.count)
        for i in order where texts[events[i].eventId] == nil {
            let e = events[i]
            let d = documents.flatMap { i < $0.count ? $0[i] : nil }
            // The sink's decoder keeps the documents' texts (`parsingDocuments: false`): a document is read (and so
            // parsed) only without a text or for the rare escaped NUL; events built otherwise (tests, tools) carry
            // the documents themselves.
            var t = EventTexts(
                transaction: Self.jsonText(d?.transaction, e.transaction),
                renewalInfo: Self.jsonText(d?.renewalInfo, e.renewalInfo),
                appTransaction: Self.jsonText(d?.appTransaction, e.appTransaction),
                details: Self.jsonText(d?.details, e.details))
            if let text = d?.transaction {
                t.transactionColumns = TransactionColumns(json: text)
            } else if let document = e.transaction {
                t.transactionColumns = TransactionColumns(document.objectValue ?? [:])
            }
            // The notification's payload embeds the same documents: their text is reused, not written again.
            t.notification = e.notification.map { Self.notificationPayload(e, $0, parts: t) }
            texts[e.eventId] = t
        }
        self.texts = texts
        // The statements that do not depend on what the database holds, built here (while the previous batch is
        // written) for the common case where every event of the batch is new.
        var lockNames = Set<String>()
        for event in self.events {
            if let k = event.entitlementKey { lockNames.insert("E\u{1}\(k.environment)\u{1}\(k.subject)\u{1}\(k.entitlement)") }
            if let k = event.ledgerKey { lockNames.insert("L\u{1}\(k.environment)\u{1}\(k.transactionId)") }
            if let k = event.subscriptionKey { lockNames.insert("S\u{1}\(k.environment)\u{1}\(k.originalTransactionId)") }
        }
        self.lockQuery = Self.lockQuery(Array(lockNames))
        self.allNew = Statements(events: self.events, texts: texts, stored: .fail)
        self.repeatsEventId = texts.count < self.events.count
    }

    /// The statement that takes the advisory locks of every entitlement / consumable / subscription key of the batch
    /// (nil: none), bound here rather than once the transaction has begun, when PostgreSQL waits for it.
    let lockQuery: PostgresQuery?

    static func lockQuery(_ names: [String]) -> PostgresQuery? {
        guard !names.isEmpty else { return nil }
        var b = ColumnBinds()
        let bound = b.add(names)
        return b.query("""
            SELECT count(pg_advisory_xact_lock(h)) FROM (
                SELECT DISTINCT hashtextextended(k, 0) AS h FROM unnest(\(bound)::text[]) AS k ORDER BY 1
            ) AS keys
            """)
    }

    /// The writes of the batch when no event of it is already stored.
    let allNew: Statements
    /// Whether an eventId occurs more than once in the batch (its later copies are duplicates).
    let repeatsEventId: Bool

    /// The insert statements of notifications, transactions and events for a list of new events (the events'
    /// statuses, which need the database, are bound last by `EventsStatement.query(statuses:)`).
    struct Statements: Sendable {
        var notifications: PostgresQuery?
        var transactions: PostgresQuery?
        var events: EventsStatement?
        /// The first attempt (every row assumed new) copies the append-only rows instead of inserting them, when
        /// a binary COPY writes every value as the inserts would (`CopyBinary.isWritable`): notifications, transaction versions (the current
        /// facts are still upserted by `transactions`) and events.
        var notificationsCopy: CopyRows?
        var versionsCopy: CopyRows?
        var eventsCopy: CopyRows?
        /// The reads the fold needs: current entitlement rows, ledger entries and restores of the keys touched.
        var entitlementsRead: PostgresQuery?
        var ledgerReads: (entries: PostgresQuery, restores: PostgresQuery)?

        init(events: [EntitlementEvent], texts: [String: EventTexts], stored: StoredRows) {
            entitlementsRead = BatchPlan.entitlementsRead(events)
            ledgerReads = BatchPlan.ledgerReads(events)
            let copy = stored == .fail
            notificationsCopy = copy ? BatchPlan.notificationsCopy(events, texts: texts) : nil
            if notificationsCopy == nil { notifications = BatchPlan.notificationsQuery(events, texts: texts, stored: stored) }
            if let versions = BatchPlan.TransactionVersions(events, texts: texts) {
                versionsCopy = copy ? BatchPlan.transactionVersionsCopy(versions) : nil
                transactions = versionsCopy == nil
                    ? BatchPlan.transactionsQuery(versions, stored: stored) : BatchPlan.currentFactsFromCopiedVersions(versions)
            }
            eventsCopy = copy ? BatchPlan.eventsCopy(events, texts: texts) : nil
            if eventsCopy == nil { self.events = BatchPlan.eventsStatement(events, texts: texts, stored: stored) }
        }
    }

    /// What the inserts of events, notifications and transaction versions do with a row already stored: fail the
    /// statement (when every row is assumed new) or skip it (ON CONFLICT DO NOTHING: the stored events were left out,
    /// but a notification or version may be stored under another event, or written by a concurrent writer).
    enum StoredRows: Sendable { case fail, skip }

    /// The entitlement_events insert with every column bound but the status.
    struct EventsStatement: Sendable {
        var binds: ColumnBinds
        var sql: String
        var statusPlaceholder: String

        func query(statuses: [EventStatus]) -> PostgresQuery {
            var b = binds
            let placeholder = b.add(statuses.map(\.rawValue))
            precondition(placeholder == statusPlaceholder, "the status column must be bound last")
            return b.query(sql)
        }
    }

    /// Whether a statement failed only because an earlier one of its transaction had (SQLSTATE 25P02).
    static func isAbortedTransaction(_ error: any Error) -> Bool {
        (error as? PSQLError)?.serverInfo?[.sqlState] == "25P02"
    }

    /// Whether a rolled-back batch failed because some of its rows were already stored: an insert written for new
    /// rows only (no ON CONFLICT) met an event, a notification or a transaction version with the same key.
    static func metStoredRows(_ error: any Error) -> Bool {
        guard let server = (SinkService.unwrap(error) as? PSQLError)?.serverInfo, server[.sqlState] == "23505" else { return false }
        return server[.constraintName].map(storedRowKeys.contains) ?? false
    }

    /// `FLEET_SINK_PHASES` set: each batch's phases are printed to stderr. Read once: reading the environment parses
    /// all of it, which is not for a per-batch path.
    static let tracePhases = ProcessInfo.processInfo.environment["FLEET_SINK_PHASES"] != nil

    /// The primary keys an insert of the first attempt may meet (`metStoredRows`).
    static let storedRowKeys: Set<String> = ["entitlement_events_pkey", "notifications_pkey", "transaction_versions_pkey"]

    /// With `checkStored`, events already in entitlement_events are looked up first and left out, and the inserts of
    /// events, notifications and transaction versions skip stored rows; without it, every row is assumed new, and an
    /// insert that meets a stored one fails the batch (`metStoredRows`). Runs inside a transaction begun on `tx`.
    /// `copying` is `tx` guarded: the COPYs go through it.
    func execute(on tx: PostgresConnection, copying guarded: GuardedConnection, checkStored: Bool, logger: Logger) async throws -> ApplyOutcome {
        precondition(guarded.connection === tx, "the COPYs go on the transaction's connection")
        guard checkStored else { return try await open(on: guarded, begun: nil, logger: logger).finish(logger: logger) }
        // Redelivered events, looked up once the locks are held.
        let locked = lockQuery.map { tx.query($0, logger: logger) }
        _ = try await locked?.get()
        var known = Set<String>()
        var b = ColumnBinds()
        let ids = b.add(events.map(\.eventId))
        let rows = try await tx.query(b.query(
            "SELECT event_id FROM entitlement_events WHERE event_id = ANY(\(ids)::text[])"), logger: logger)
        for try await id in rows.decode(String.self) { known.insert(id) }
        return try await open(on: guarded, begun: nil, checkStored: true, known: known, locked: locked, logger: logger)
            .finish(logger: logger)
    }

    /// Queues the batch's first statements on `guarded` without waiting for any answer: the locks (unless `locked`
    /// already took them), the reads the fold needs, and the writes that need nothing read (the notifications and
    /// transaction versions, whose COPYs a task sends behind the reads). `begun`: the BEGIN queued just before, if
    /// any. `known`: the events already stored (`checkStored`).
    func open(
        on guarded: GuardedConnection, begun: EventLoopFuture<PostgresQueryResult>?, checkStored: Bool = false,
        known: Set<String> = [], locked: EventLoopFuture<PostgresQueryResult>? = nil, logger: Logger
    ) -> OpenedBatch {
        let tx = guarded.connection
        func queue(_ query: PostgresQuery?) -> EventLoopFuture<PostgresQueryResult>? {
            query.map { tx.query($0, logger: logger) }
        }
        // 1. Serialize with other sinks on every entitlement / consumable key of the batch.
        let locked = locked ?? queue(lockQuery)
        // 2. Redelivered events (`known`) and second copies of an event inside the batch are duplicates.
        var known = known
        var fresh = events
        if checkStored || repeatsEventId {
            fresh = []
            for event in events where !known.contains(event.eventId) {
                known.insert(event.eventId)  // a second copy inside the same batch is a duplicate too
                fresh.append(event)
            }
        }
        let failures = FirstFailure()
        guard !fresh.isEmpty else {
            return OpenedBatch(
                guarded: guarded, plan: self, fresh: fresh, writes: nil, failures: failures, begun: begun, locked: locked)
        }
        // Built before the transaction (with the reads) unless some events of the batch were already stored.
        let writes = !checkStored && fresh.count == events.count
            ? allNew : Statements(events: fresh, texts: texts, stored: checkStored ? .skip : .fail)
        // 3. Current entitlement rows and ledger entries for the keys touched (queued behind the locks), then the
        // notifications and transaction facts, which depend on nothing read. In the first attempt a row of theirs
        // already stored fails its insert, and the whole transaction is rolled back and written again.
        let opened = OpenedBatch(
            guarded: guarded, plan: self, fresh: fresh, writes: writes, failures: failures, begun: begun, locked: locked,
            entitlementsRead: queue(writes.entitlementsRead), ledgerEntriesRead: queue(writes.ledgerReads?.entries),
            ledgerRestoresRead: queue(writes.ledgerReads?.restores), notifications: queue(writes.notifications),
            transactionsInserted: writes.versionsCopy == nil ? queue(writes.transactions) : nil,
            // The COPYs of notifications and transaction versions need nothing read either: a task sends them behind
            // the reads, so PostgreSQL works through them while the batch's task decodes the rows read and folds
            // (before, it sat idle for the fold and the decoding, ~5-8 ms of a ~64 ms batch, `FLEET_SINK_PHASES`).
            appended: Task { await Self.copyAppends(writes, on: guarded, failures: failures, logger: logger) })
        return opened
    }

    /// The COPYs of a first attempt that need nothing read (notifications, then transaction versions), each sent once
    /// the statements queued before it are done; then the current facts, read back from the copied versions, queued.
    /// Returns the rows copied by table, and the current facts' statement (nil: not queued). Sends nothing once
    /// `failures` holds an error.
    private static func copyAppends(
        _ writes: Statements, on guarded: GuardedConnection, failures: FirstFailure, logger: Logger
    ) async -> (copied: [String: Int], currentFacts: EventLoopFuture<PostgresQueryResult>?) {
        var copied: [String: Int] = [:]
        for copy in [writes.notificationsCopy, writes.versionsCopy] {
            guard let copy, failures.error == nil else { continue }
            do {
                try await guarded.copy(copy, logger: logger)
                copied[copy.table] = copy.rowCount
            } catch { failures.keep(error) }
        }
        guard writes.versionsCopy != nil, let facts = writes.transactions, failures.error == nil else { return (copied, nil) }
        return (copied, guarded.connection.query(facts, logger: logger))
    }

    // MARK: reads

    /// The rows of the keys touched, plus every row of the subscriptions touched (for `supersedeOtherTiers`).
    static func entitlementsRead(_ fresh: [EntitlementEvent]) -> PostgresQuery? {
        let list = Array(Set(fresh.compactMap(\.entitlementKey)))
        guard !list.isEmpty else { return nil }
        let subs = Array(Set(fresh.compactMap(\.subscriptionKey)))
        var b = ColumnBinds()
        let env = b.add(list.map(\.environment))
        let subject = b.add(list.map(\.subject))
        let name = b.add(list.map(\.entitlement))
        let subEnv = b.add(subs.map(\.environment))
        let subOriginal = b.add(subs.map(\.originalTransactionId))
        let columns = """
            e.environment, e.subject, e.entitlement, e.active, e.product_id, e.original_transaction_id,
            e.transaction_id, \(Self.ms("e.valid_from")), \(Self.ms("e.valid_until")), \(Self.ms("e.revoked_at")),
            e.revocation_reason, e.last_signed_date_ms, e.last_event_id, e.last_kind, e.last_effect,
            \(Self.ms("e.updated_at"))
            """
        // One index probe per key (LATERAL ... OFFSET 0 keeps the planner from hashing the whole table, which it
        // prefers for a few thousand keys and which made every batch slower as the table grew).
        return b.query("""
            SELECT \(columns)
            FROM unnest(\(env)::text[], \(subject)::text[], \(name)::text[]) AS k(environment, subject, entitlement)
            CROSS JOIN LATERAL (
                SELECT * FROM entitlements x
                WHERE x.environment = k.environment AND x.subject = k.subject AND x.entitlement = k.entitlement OFFSET 0
            ) AS e
            UNION ALL
            SELECT \(columns)
            FROM unnest(\(subEnv)::text[], \(subOriginal)::text[]) AS s(environment, original_transaction_id)
            CROSS JOIN LATERAL (
                SELECT * FROM entitlements x
                WHERE x.environment = s.environment AND x.original_transaction_id = s.original_transaction_id OFFSET 0
            ) AS e
            """)
    }

    fileprivate func decodeEntitlements(_ rows: [PostgresRow]) throws -> [EntitlementKey: EntitlementRow] {
        var result: [EntitlementKey: EntitlementRow] = [:]
        result.reserveCapacity(rows.count)
        for row in rows {
            let (environment, subject, entitlement, active, productId, original, transaction) =
                try row.decode((String, String, String, Bool, String?, String?, String?).self)
            let r = row.makeRandomAccess()
            result[EntitlementKey(environment: environment, subject: subject, entitlement: entitlement)] = EntitlementRow(
                active: active, productId: productId, originalTransactionId: original, transactionId: transaction,
                validFrom: try r[7].decode(Int64?.self), validUntil: try r[8].decode(Int64?.self),
                revokedAt: try r[9].decode(Int64?.self), revocationReason: try r[10].decode(String?.self),
                lastSignedDate: try r[11].decode(Int64.self), lastEventId: try r[12].decode(String.self),
                lastKind: try r[13].decode(String.self), lastEffect: try r[14].decode(String.self),
                updatedAt: try r[15].decode(Int64.self))
        }
        return result
    }

    /// The ledger entries of the keys touched, and the newest consumable RESTORE event of each.
    static func ledgerReads(_ fresh: [EntitlementEvent]) -> (entries: PostgresQuery, restores: PostgresQuery)? {
        let list = Array(Set(fresh.compactMap(\.ledgerKey)))
        guard !list.isEmpty else { return nil }
        var b = ColumnBinds()
        let env = b.add(list.map(\.environment))
        let txn = b.add(list.map(\.transactionId))
        let entries = b.query("""
            SELECT l.environment, l.transaction_id, l.entry, l.revocation_key, (l.amount * 100000)::bigint,
                   l.signed_date_ms, l.subject, l.product_id, l.original_transaction_id, l.event_id
            FROM unnest(\(env)::text[], \(txn)::text[]) AS k(environment, transaction_id)
            CROSS JOIN LATERAL (
                SELECT * FROM consumable_ledger x
                WHERE x.environment = k.environment AND x.transaction_id = k.transaction_id OFFSET 0
            ) AS l
            ORDER BY l.signed_date_ms, l.entry, l.revocation_key
            """)
        let restores = b.query("""
            SELECT ev.environment, ev.transaction_id, max(ev.signed_date_ms)
            FROM unnest(\(env)::text[], \(txn)::text[]) AS k(environment, transaction_id)
            CROSS JOIN LATERAL (
                SELECT x.environment, x.transaction_id, x.signed_date_ms FROM entitlement_events x
                WHERE x.environment = k.environment AND x.transaction_id = k.transaction_id
                  AND x.effect = 'RESTORE' AND x.product_type = 'Consumable' OFFSET 0
            ) AS ev
            GROUP BY ev.environment, ev.transaction_id
            """)
        return (entries, restores)
    }

    fileprivate func decodeLedgers(_ rows: (entries: [PostgresRow], restores: [PostgresRow])) throws -> [LedgerKey: LedgerState] {
        var result: [LedgerKey: LedgerState] = [:]
        for row in rows.entries {
            let (environment, transactionId, entry, key, amount, signed, subject, product, original, eventId) =
                try row.decode((String, String, String, String, Int64, Int64, String, String?, String?, String).self)
            result[LedgerKey(environment: environment, transactionId: transactionId), default: LedgerState()]
                .entries.append(LedgerEntry(
                    entry: entry, revocationKey: key, scaledAmount: amount, signedDate: signed, subject: subject,
                    productId: product, originalTransactionId: original, eventId: eventId))
        }
        for row in rows.restores {
            let (environment, transactionId, signed) = try row.decode((String, String, Int64).self)
            result[LedgerKey(environment: environment, transactionId: transactionId), default: LedgerState()]
                .latestRestore = signed
        }
        return result
    }

    private static func ms(_ column: String) -> String { "(extract(epoch FROM \(column)) * 1000)::bigint" }

    // MARK: writes

    /// The upsert of the entitlement rows the fold changed (nothing changed: nil).
    static func entitlementsWrite(_ rows: [(EntitlementKey, EntitlementRow)]) -> PostgresQuery? {
        guard !rows.isEmpty else { return nil }
        var b = ColumnBinds()
        b.column(rows.map(\.0.environment), "text", as: "env")
        b.column(rows.map(\.0.subject), "text", as: "su")
        b.column(rows.map(\.0.entitlement), "text", as: "en")
        b.column(rows.map(\.1.active), "boolean", as: "ac")
        b.column(rows.map(\.1.productId), "text", as: "pr")
        b.column(rows.map(\.1.originalTransactionId), "text", as: "ot")
        b.column(rows.map(\.1.transactionId), "text", as: "tr")
        b.column(rows.map(\.1.validFrom), "bigint", as: "vf")
        b.column(rows.map(\.1.validUntil), "bigint", as: "vu")
        b.column(rows.map(\.1.revokedAt), "bigint", as: "rv")
        b.column(rows.map(\.1.revocationReason), "text", as: "rr")
        b.column(rows.map(\.1.lastSignedDate), "bigint", as: "sd")
        b.column(rows.map(\.1.lastEventId), "text", as: "ev")
        b.column(rows.map(\.1.lastKind), "text", as: "k")
        b.column(rows.map(\.1.lastEffect), "text", as: "ef")
        b.column(rows.map(\.1.updatedAt), "bigint", as: "ua")
        return b.query("""
            WITH up AS (
                INSERT INTO entitlements (environment, subject, entitlement, active, product_id,
                    original_transaction_id, transaction_id, valid_from, valid_until, revoked_at, revocation_reason,
                    last_signed_date, last_signed_date_ms, last_event_id, last_kind, last_effect, updated_at)
                SELECT env, su, en, ac, pr, ot, tr, fleet_ms(vf), fleet_ms(vu), fleet_ms(rv), rr, fleet_ms(sd), sd,
                       ev, k, ef, fleet_ms(ua)
                FROM \(b.rows())
                ON CONFLICT (environment, subject, entitlement) DO UPDATE SET
                    active = EXCLUDED.active, product_id = EXCLUDED.product_id,
                    original_transaction_id = EXCLUDED.original_transaction_id,
                    transaction_id = EXCLUDED.transaction_id, valid_from = EXCLUDED.valid_from,
                    valid_until = EXCLUDED.valid_until, revoked_at = EXCLUDED.revoked_at,
                    revocation_reason = EXCLUDED.revocation_reason, last_signed_date = EXCLUDED.last_signed_date,
                    last_signed_date_ms = EXCLUDED.last_signed_date_ms, last_event_id = EXCLUDED.last_event_id,
                    last_kind = EXCLUDED.last_kind, last_effect = EXCLUDED.last_effect,
                    updated_at = EXCLUDED.updated_at
                RETURNING 1
            ) SELECT count(*) FROM up
            """)
    }

    /// The insert of the ledger entries the fold added (none: nil).
    static func ledgerWrite(_ entries: [(LedgerKey, LedgerEntry)]) -> PostgresQuery? {
        guard !entries.isEmpty else { return nil }
        var b = ColumnBinds()
        b.column(entries.map(\.0.environment), "text", as: "env")
        b.column(entries.map(\.0.transactionId), "text", as: "tr")
        b.column(entries.map(\.1.entry), "text", as: "en")
        b.column(entries.map(\.1.revocationKey), "text", as: "rk")
        b.column(entries.map(\.1.subject), "text", as: "su")
        b.column(entries.map(\.1.productId), "text", as: "pr")
        b.column(entries.map(\.1.originalTransactionId), "text", as: "ot")
        b.column(entries.map(\.1.scaledAmount), "bigint", as: "am")
        b.column(entries.map(\.1.eventId), "text", as: "ev")
        b.column(entries.map(\.1.signedDate), "bigint", as: "sd")
        return b.query("""
            WITH ins AS (
                INSERT INTO consumable_ledger (environment, transaction_id, entry, revocation_key, subject, product_id,
                    original_transaction_id, amount, event_id, signed_date, signed_date_ms)
                SELECT env, tr, en, rk, su, pr, ot, trim_scale(am::numeric / 100000), ev, fleet_ms(sd), sd
                FROM \(b.rows())
                ON CONFLICT (environment, transaction_id, entry, revocation_key) DO NOTHING
                RETURNING 1
            ) SELECT count(*) FROM ins
            """)
    }
}
