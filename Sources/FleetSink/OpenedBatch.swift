import EntitlementDomain
import EntitlementRules
import Foundation
import Logging
import PostgresNIO
import Synchronization

// A batch's own transaction, begun by `EventApplier.apply` (and, for the next batch, behind the last one's COMMIT).

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
        _ = await settle(locked)
        outcome.duplicate = plan.events.count - fresh.count
        guard let writes else {
            if let failure = failures.error { throw failure }
            return outcome
        }
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
