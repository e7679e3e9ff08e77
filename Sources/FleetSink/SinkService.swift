import EntitlementDomain
import FleetOperations
import Foundation
import Logging
import Metrics
import PostgresNIO
import ServiceLifecycle
import Synchronization

/// One record read from the result topic.
public struct SinkRecord: Sendable {
    public var topic: String
    public var partition: Int32
    public var offset: Int64
    public var key: [UInt8]?
    public var value: [UInt8]
    public var headers: [(key: String, value: [UInt8])]

    public init(
        topic: String, partition: Int32, offset: Int64, key: [UInt8]?, value: [UInt8],
        headers: [(key: String, value: [UInt8])] = []
    ) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.headers = headers
    }
}

/// Where the sink reads batches from (the Kafka result topic in production; see `KafkaEventBatchSource`).
public protocol EventBatchSource: Sendable {
    /// The next batch (possibly empty after a poll timeout).
    func nextBatch(maxRecords: Int) async throws -> [SinkRecord]
    /// What is already buffered, without waiting (possibly nothing): how the sink adds the records that arrive while
    /// a batch is written to the next batch. nil (the default): not supported, the next `nextBatch` takes them.
    func moreRecords(maxRecords: Int) async throws -> [SinkRecord]?
    /// Called once every record of the batch is durably written (or rejected): their offsets may be committed.
    func markProcessed(_ records: [SinkRecord]) async throws
    /// Whether the source is connected and assigned (part of readiness).
    var isReady: Bool { get }
}

extension EventBatchSource {
    public func moreRecords(maxRecords: Int) async throws -> [SinkRecord]? { nil }
}

/// Where records the sink cannot use go (the sink-rejected topic): value = the original bytes, headers
/// `reason`, `detail`, `source-topic`, `source-partition`, `source-offset`. Must not return before the record is
/// durably accepted.
public protocol RejectedRecordSink: Sendable {
    func reject(_ record: SinkRecord, reason: String, detail: String) async throws
}

/// The sink: consumes result-topic batches, writes each batch in one database transaction, then marks the batch's
/// offsets processed. Database unavailable -> retries with backoff, offsets stay uncommitted, `isReady` is false,
/// and it resumes without loss. Undecodable events go to the sink-rejected topic, never dropped.
///
/// Runs until cancelled or until a graceful shutdown (ServiceLifecycle): the batch in flight is finished first.
public final class SinkService: Service, Sendable {
    private let configuration: SinkConfiguration
    private let source: any EventBatchSource
    private let rejected: any RejectedRecordSink
    private let logger: Logger
    private let applier = EventApplier()
    private let metrics = SinkMetrics()
    private let databaseReady = Mutex(false)
    private let batchesDone = Mutex(0)
    private let sizing: Mutex<BatchSizing>
    private let onBatch: (@Sendable (BatchReport) -> Void)?

    /// What one processed batch did (for benchmarks and tests; metrics carry the same figures).
    public struct BatchReport: Sendable {
        public var records: Int
        public var rejected: Int
        public var outcome: ApplyOutcome
        public var duration: Duration
        /// Whether the batch's transaction was begun behind the previous batch's COMMIT (`EventApplier.apply`).
        public var begunAhead: Bool = false
        /// The most records the next batch takes, after this one (`BatchSizing`).
        public var nextLimit: Int = 0
    }

    public init(
        configuration: SinkConfiguration, source: any EventBatchSource, rejected: any RejectedRecordSink,
        logger: Logger, onBatch: (@Sendable (BatchReport) -> Void)? = nil
    ) {
        self.configuration = configuration
        self.source = source
        self.rejected = rejected
        self.logger = logger
        self.onBatch = onBatch
        self.sizing = Mutex(BatchSizing(configuration))
        metrics.batchLimit.record(sizing.withLock { $0.current })
    }

    /// The most records the next batch takes (`SinkConfiguration.batchTarget`).
    public var batchLimit: Int { sizing.withLock { $0.current } }

    /// Connected to a migrated database and to the source: what `/readyz` reports.
    public var isReady: Bool { databaseReady.withLock { $0 } && source.isReady }

    /// Batches fully processed since start.
    public var processedBatches: Int { batchesDone.withLock { $0 } }

    private func setDatabaseReady(_ ready: Bool) {
        databaseReady.withLock { $0 = ready }
    }

    struct ShutdownWhileRetrying: Error {}

    public func run() async throws {
        var connection: GuardedConnection?
        var lastProbe = ContinuousClock.now
        var lastConnectWarning = ContinuousClock.now - .seconds(60)
        var prefetched: Task<([SinkRecord], DecodedBatch), any Error>?
        /// The next batch's transaction, begun behind the last batch's COMMIT (`EventApplier.apply`'s `openNext`).
        var opened: OpenedBatch?
        let background = BackgroundWork()
        defer {
            prefetched?.cancel()
            setDatabaseReady(false)
        }
        do {
            while !Task.isCancelled && !Task.isShuttingDownGracefully {
                if connection == nil {
                    // Connect eagerly so that readiness reflects the database even when the topic is idle.
                    do {
                        connection = try await connect()
                    } catch {
                        if ContinuousClock.now - lastConnectWarning > .seconds(10) {
                            lastConnectWarning = .now
                            logger.warning("database connect failed", metadata: ["error": "\(Self.brief(error))"])
                        }
                        connection = nil
                    }
                    setDatabaseReady(connection != nil)
                }
                let records: [SinkRecord]
                let decoded: DecodedBatch
                if let next = prefetched {
                    prefetched = nil
                    (records, decoded) = try await next.value
                } else {
                    records = try await source.nextBatch(maxRecords: batchLimit)
                    decoded = try await background.run { [records, applier] in Self.decodeBatch(records, applier: applier) }
                }
                if records.isEmpty {
                    // Idle: probe the database now and then so that readiness notices an outage without traffic.
                    if let live = connection, ContinuousClock.now - lastProbe > .seconds(1) {
                        lastProbe = ContinuousClock.now
                        do {
                            // Bounded like a batch: a probe sent just as PostgreSQL shut down once never completed and
                            // held the sink (ready, idle, lag growing) until the stall watch had it restarted.
                            let logger = self.logger
                            _ = try await guarded(live) { try await live.connection.query("SELECT 1", logger: logger) }
                        } catch {
                            logger.warning("database probe failed", metadata: ["error": "\(Self.brief(error))"])
                            await live.close()
                            connection = nil
                            setDatabaseReady(false)
                        }
                    }
                    continue
                }
                // Fetch and decode the next batch while this one is written. Its offsets are marked only after its
                // own transaction, so a crash in between redelivers it, as for any unwritten batch.
                let writing = WriteInProgress()
                let upcoming = Task { [source, applier, limit = batchLimit] in
                    let next = try await Self.gather(from: source, limit: limit, applier: applier, on: background, while: writing)
                    writing.gathered()
                    return next
                }
                prefetched = upcoming
                defer { writing.finish() }
                // Once this batch's writes are done and its COMMIT is queued, the next batch is begun behind it when
                // it is already gathered and prepared (never waited for: with records still arriving it keeps
                // gathering until this write is done), unless this batch has records to reject first (its
                // producer's retries must not hold the next transaction open) or a shutdown was requested.
                var openNext: (@Sendable () async -> PreparedBatch?)?
                if decoded.refused.isEmpty {
                    openNext = { @Sendable () async -> PreparedBatch? in
                        guard writing.isGathered, !Task.isShuttingDownGracefully,
                              let next = try? await upcoming.value, next.1.refused.isEmpty else { return nil }
                        return next.1.prepared
                    }
                }
                let begun = opened
                opened = nil
                opened = try await process(records, decoded: decoded, connection: &connection, opened: begun, openNext: openNext)
                batchesDone.withLock { $0 += 1 }
                background.discard((consume records, consume decoded))
            }
        } catch is ShutdownWhileRetrying {
            logger.warning("shutdown requested while the database was unavailable: the batch in flight stays uncommitted")
        } catch is CancellationError {
            logger.info("sink cancelled")
        }
        if let begun = opened {
            // The next batch's transaction was begun behind the last COMMIT: rolled back (its connection closed).
            await begun.abandon()
            opened = nil
            connection = nil
        }
        if let next = prefetched {
            // Its records were never written: not marked, so they are redelivered to whoever owns the partition next.
            next.cancel()
            _ = try? await next.value
            prefetched = nil
        }
        if let connection { await connection.close() }
        await background.shutdown()
    }

    /// Writes and marks one batch (decoded and prepared). `opened`: its transaction, begun behind the last batch's
    /// COMMIT. Returns the next batch's transaction when `openNext` handed that batch over (`EventApplier.apply`).
    func process(
        _ records: [SinkRecord], decoded batch: DecodedBatch, connection: inout GuardedConnection?,
        opened: OpenedBatch? = nil, openNext: (@Sendable () async -> PreparedBatch?)? = nil
    ) async throws -> OpenedBatch? {
        let started = ContinuousClock.now
        let accepted = batch.accepted
        var refused = batch.refused
        var outcome = ApplyOutcome()
        var next: OpenedBatch?
        if !accepted.isEmpty {
            let isolated: [(SinkRecord, SinkRejection, String)]
            (outcome, isolated, next) = try await applyWithRetry(
                accepted, prepared: batch.prepared, connection: &connection, opened: opened, openNext: openNext)
            refused += isolated
            metrics.record(outcome)
        } else if let opened {
            await opened.abandon()
        }
        do {
            try await finish(records, refused: refused)
        } catch {
            // Shutdown while the offsets could not be marked: the batch begun behind this one is given up too.
            await next?.abandon()
            throw error
        }
        let duration = ContinuousClock.now - started
        if BatchPlan.tracePhases {
            FileHandle.standardError.write(
                "batch \(records.count): begun ahead \(opened != nil), next begun \(next != nil), total \(duration)\n".data(using: .utf8)!)
        }
        metrics.batch.recordNanoseconds(duration.nanoseconds)
        let limit = sizing.withLock { sizing in
            sizing.record(records: records.count, duration: duration)
            return sizing.current
        }
        metrics.batchLimit.record(limit)
        onBatch?(BatchReport(records: records.count, rejected: refused.count, outcome: outcome, duration: duration,
                             begunAhead: opened != nil, nextLimit: limit))
        return next
    }

    /// Produces the refused records to the sink-rejected topic, then marks the batch's offsets processed.
    private func finish(_ records: [SinkRecord], refused: [(SinkRecord, SinkRejection, String)]) async throws {
        for (record, reason, detail) in refused {
            try await withRetry("produce to the sink-rejected topic") {
                try await rejected.reject(record, reason: reason.rawValue, detail: detail)
            }
            metrics.rejected(reason.rawValue)
            logger.warning("event rejected", metadata: [
                "reason": "\(reason.rawValue)", "detail": "\(detail)", "topic": "\(record.topic)",
                "partition": "\(record.partition)", "offset": "\(record.offset)",
            ])
        }
        try await withRetry("mark offsets processed") { try await source.markProcessed(records) }
    }

    /// Applies the batch in one transaction, retrying with backoff while the database is unavailable (reconnecting
    /// each time). When PostgreSQL refuses the data itself (SQLSTATE class 22/23), the events are applied one by one
    /// and those it refuses are returned for the sink-rejected topic, so one bad event cannot stall a partition.
    private func applyWithRetry(
        _ batch: [(SinkRecord, EntitlementEvent)], prepared: PreparedBatch, connection: inout GuardedConnection?,
        opened: OpenedBatch?, openNext: (@Sendable () async -> PreparedBatch?)?
    ) async throws -> (ApplyOutcome, [(SinkRecord, SinkRejection, String)], OpenedBatch?) {
        var attempt = 0
        // The batch's transaction begun behind the last COMMIT is for its first attempt only.
        var opened = opened
        while true {
            do {
                if connection == nil { connection = try await connect() }
                guard let live = connection else { continue }
                setDatabaseReady(true)
                let begun = opened
                opened = nil
                let (outcome, next) = try await guarded(live) {
                    try await self.applier.apply(prepared, connection: live, opened: begun, openNext: openNext, logger: self.logger)
                }
                return (outcome, [], next)
            } catch {
                if let state = Self.refusedData(error), let live = connection, !live.connection.isClosed {
                    logger.error("database refused the batch; isolating events", metadata: ["sqlstate": "\(state)"])
                    do {
                        let (outcome, refused) = try await isolate(batch, connection: live)
                        return (outcome, refused, nil)
                    } catch {
                        // The database went away during the isolation (a restart, a failover, a timeout): like any
                        // batch, retried once it is back. Nothing was produced or marked for this batch yet.
                        try await backOff(after: error, attempt: &attempt, connection: &connection)
                        continue
                    }
                }
                try await backOff(after: error, attempt: &attempt, connection: &connection)
            }
        }
    }

    struct BatchTimedOut: Error, CustomStringConvertible {
        var limit: Duration
        var description: String { "the batch did not complete within \(limit); the connection was closed" }
    }

    /// Runs `body`; if it has not finished within `configuration.batchTimeout`, `BatchTimedOut` is thrown and the
    /// connection is closed in the background (which fails whatever is pending on it), so a half-dead connection
    /// can never wedge the sink. The body is not awaited after the timeout: a query stuck on a dead socket must not
    /// hold the sink (it ends when the connection's channel is torn down).
    private func guarded<T: Sendable>(
        _ connection: GuardedConnection, _ body: @escaping @Sendable () async throws -> T
    ) async throws -> T {
        let limit = configuration.batchTimeout
        let logger = self.logger
        return try await connection.bounded(within: limit, timedOut: BatchTimedOut(limit: limit), onTimeout: {
            logger.error("batch timed out; closing the database connection", metadata: ["limit": "\(limit)"])
            await connection.close()
        }, body)
    }

    private func isolate(
        _ batch: [(SinkRecord, EntitlementEvent)], connection: GuardedConnection
    ) async throws -> (ApplyOutcome, [(SinkRecord, SinkRejection, String)]) {
        var total = ApplyOutcome()
        var refused: [(SinkRecord, SinkRejection, String)] = []
        for (record, event) in batch {
            do {
                let outcome = try await guarded(connection) {
                    try await self.applier.apply(self.applier.prepare([event]), connection: connection, logger: self.logger)
                }
                total.applied += outcome.applied
                total.stale += outcome.stale
                total.duplicate += outcome.duplicate
                total.rowsWritten.merge(outcome.rowsWritten, uniquingKeysWith: +)
            } catch {
                guard let state = Self.refusedData(error) else { throw error }
                refused.append((record, .databaseRejected, "SQLSTATE \(state): \(Self.serverMessage(of: error))"))
            }
        }
        return (total, refused)
    }

    private func backOff(after error: any Error, attempt: inout Int, connection: inout GuardedConnection?) async throws {
        attempt += 1
        metrics.retries.increment()
        setDatabaseReady(false)
        if let live = connection { await live.close() }
        connection = nil
        let delay = backoffDelay(attempt)
        logger.warning("database unavailable; retrying", metadata: [
            "attempt": "\(attempt)", "delay": "\(delay)", "error": "\(Self.brief(error))",
        ])
        try await sleepUnlessShuttingDown(delay)
    }

    private func backoffDelay(_ attempt: Int) -> Duration {
        Backoff(initial: configuration.initialBackoff, maximum: configuration.maxBackoff).delay(afterAttempt: attempt)
    }

    private func sleepUnlessShuttingDown(_ delay: Duration) async throws {
        if Task.isShuttingDownGracefully { throw ShutdownWhileRetrying() }
        try await Task.sleep(for: delay)
        if Task.isShuttingDownGracefully { throw ShutdownWhileRetrying() }
    }

    private func withRetry(_ what: String, _ body: () async throws -> Void) async throws {
        var attempt = 0
        while true {
            do {
                try await body()
                return
            } catch {
                attempt += 1
                metrics.retries.increment()
                let delay = backoffDelay(attempt)
                logger.warning("\(what) failed; retrying", metadata: ["attempt": "\(attempt)", "error": "\(error)"])
                try await sleepUnlessShuttingDown(delay)
            }
        }
    }

    struct SchemaCheckTimedOut: Error, CustomStringConvertible {
        var limit: Duration
        var description: String { "reading the database's schema version did not finish within \(limit)" }
    }

    /// Connects and checks the schema, each within `configuration.batchTimeout`: like a batch, a connection attempt
    /// must never wedge the sink. (A sink restarted just before a PostgreSQL restart in the chaos soak stayed ready
    /// with no socket, no batch and no retry; a connect that never completed is the one await that could hold it.)
    /// The check is bounded like every statement, so a database that restarts just after accepting the connection is
    /// noticed within a second.
    private func connect() async throws -> GuardedConnection {
        let limit = configuration.batchTimeout
        let logger = self.logger
        let guarded = try await GuardedConnection.connect(
            try configuration.databaseURL.connectionConfiguration(), id: 1, within: limit, logger: logger)
        do {
            let version = try await guarded.bounded(within: limit, timedOut: SchemaCheckTimedOut(limit: limit), onTimeout: {}) {
                try await SinkSchema.currentVersion(connection: guarded.connection, logger: logger) ?? 0
            }
            let needed = SinkSchema.migrations.map(\.version).max() ?? 0
            guard version >= needed else {
                throw SchemaBehind(found: version, needed: needed)
            }
        } catch {
            await guarded.close()
            throw error
        }
        return guarded
    }

    struct SchemaBehind: Error, CustomStringConvertible {
        var found: Int
        var needed: Int
        var description: String {
            "database schema is at version \(found), the sink needs \(needed): run `fleet migrate --database-url URL`"
        }
    }

    // MARK: error classification

    static func unwrap(_ error: any Error) -> any Error {
        if let tx = error as? PostgresTransactionError {
            return tx.closureError ?? tx.commitError ?? tx.beginError ?? tx.rollbackError ?? error
        }
        if let tx = error as? BatchTransactionError {
            return tx.closureError ?? tx.commitError ?? tx.rollbackError ?? error
        }
        return error
    }

    static func sqlState(of error: any Error) -> String? {
        (unwrap(error) as? PSQLError)?.serverInfo?[.sqlState]
    }

    static func serverMessage(of error: any Error) -> String {
        (unwrap(error) as? PSQLError)?.serverInfo?[.message] ?? "\(unwrap(error))"
    }

    /// Data exceptions (22) and integrity violations (23): the same data would fail again.
    static func isDataError(_ state: String) -> Bool { state.hasPrefix("22") || state.hasPrefix("23") }

    /// The SQLSTATE of a batch PostgreSQL refused for its data (class 22/23), or nil when the batch failed otherwise.
    /// A transaction whose rollback failed too is not a refusal: its connection broke after the error (PostgreSQL
    /// stopped just after a first attempt met a stored row, in the chaos soak), so the batch is retried, not isolated.
    public static func refusedData(_ error: any Error) -> String? {
        if let tx = error as? PostgresTransactionError, tx.rollbackError != nil { return nil }
        if let tx = error as? BatchTransactionError, tx.rollbackError != nil { return nil }
        guard let state = sqlState(of: error), isDataError(state) else { return nil }
        return state
    }

    /// A one-line description of a database error: its code and the server's message (PSQLError's own description is generic).
    public static func brief(_ error: any Error) -> String {
        let inner = unwrap(error)
        if let psql = inner as? PSQLError {
            if let message = psql.serverInfo?[.message] { return "\(psql.code): \(message)" }
            return "\(psql.code)\(psql.underlying.map { " (\($0))" } ?? "")"
        }
        return "\(inner)"
    }
}

/// Resumes a continuation with whichever result comes first.
final class Race<T: Sendable>: Sendable {
    /// Runs `body` against a deadline: the first of the two to finish decides. On timeout `timedOut` is thrown and
    /// `onTimeout` runs; the body is not awaited further (a call stuck on a dead socket must not hold the caller), and
    /// a result it delivers late goes to `lateSuccess` (e.g. to close a connection nobody will use).
    static func run(
        within limit: Duration, timedOut: any Error, body: @escaping @Sendable () async throws -> T,
        onTimeout: @escaping @Sendable () async -> Void, lateSuccess: @escaping @Sendable (T) async -> Void = { _ in }
    ) async throws -> T {
        try await Race<T>().run(within: limit, timedOut: timedOut, body: body, onTimeout: onTimeout, lateSuccess: lateSuccess)
    }

    /// As the static `run`; `finish` may also end it from outside (a connection found closed).
    func run(
        within limit: Duration, timedOut: any Error, body: @escaping @Sendable () async throws -> T,
        onTimeout: @escaping @Sendable () async -> Void, lateSuccess: @escaping @Sendable (T) async -> Void = { _ in }
    ) async throws -> T {
        let race = self
        return try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            race.start(continuation)
            let timer = Task {
                do { try await Task.sleep(for: limit) } catch { return }  // cancelled: the body finished
                if race.finish(.failure(timedOut)) { await onTimeout() }
            }
            Task {
                let result: Result<T, any Error>
                do { result = .success(try await body()) } catch { result = .failure(error) }
                if !race.finish(result), case .success(let late) = result { await lateSuccess(late) }
                timer.cancel()
            }
        }
    }

    private struct State {
        var continuation: CheckedContinuation<T, any Error>?
        var finished = false
        /// A result that came before `start` (a `finish` from outside may).
        var early: Result<T, any Error>?
    }

    private let state = Mutex(State())

    func start(_ continuation: CheckedContinuation<T, any Error>) {
        let early = state.withLock { s -> Result<T, any Error>? in
            guard s.finished else {
                s.continuation = continuation
                return nil
            }
            defer { s.early = nil }
            return s.early
        }
        if let early { continuation.resume(with: early) }
    }

    /// Decides the race with `result` unless it is decided already; returns whether it decided it.
    @discardableResult
    func finish(_ result: Result<T, any Error>) -> Bool {
        let (decided, continuation) = state.withLock { s -> (Bool, CheckedContinuation<T, any Error>?) in
            if s.finished { return (false, nil) }
            s.finished = true
            guard let c = s.continuation else {
                s.early = result
                return (true, nil)
            }
            s.continuation = nil
            return (true, c)
        }
        continuation?.resume(with: result)
        return decided
    }
}
