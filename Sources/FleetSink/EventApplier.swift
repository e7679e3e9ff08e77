import AppStoreVerification
import EntitlementDomain
import EntitlementRules
import Foundation
import Logging
import PostgresNIO

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
            await next?.abandon()  // closes the connection, and the next batch's transaction with it
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
}
