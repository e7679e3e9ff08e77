import FleetOperations
import Logging
import NIOCore
import PostgresNIO
import Synchronization

/// The sink's PostgreSQL connection, with the one rule PostgresNIO 1.33 needs around a COPY: the connection must not
/// close while a COPY is in flight.
///
/// PostgresNIO traps (a `preconditionFailure`, so the whole process ends) when a connection leaves its query while a
/// COPY is in the copying-data state:
/// - a client-side `close()` during the COPY: "Invalid query state machine action in state: .closing, action: wait";
/// - a writer call (write, CopyDone, CopyFail) reaching a connection that the server has just closed, before NIO has
///   removed the handler (one event-loop turn after the close): "Copy mode is only supported for extended queries".
/// In its copying-data state an error is only stored, and a writer waiting for the channel to become writable is never
/// woken, so a COPY that meets backpressure when the server goes away waits forever.
///
/// So, here:
/// - `close()` during a COPY does not close: it asks the COPY to end, and the connection is closed the moment the COPY
///   returns or throws, before anything else runs on it. The COPY then fails with `ClosedDuringCopy`, so the batch's
///   transaction never commits after a timeout abandoned it. (The sink's batch timeout and its retry both close.)
/// - A COPY runs with the connection's event loop as its task executor, and sends its rows in one write: each writer
///   call is made on the loop in the same turn as the check that the connection is still open, and no write ever waits
///   for backpressure. On a connection found closed, it waits until NIO has removed the handler (then PostgresNIO's own
///   CopyFail answers "connection closed" instead of trapping) and throws `ClosedDuringCopy`.
///
/// A second rule, for every statement: PostgresNIO never answers a statement sent after the connection's channel has
/// closed and its handler is gone (the statement's write fails at the channel's head with no promise, and the
/// statement's own promise is never completed). A ROLLBACK or probe sent just after a PostgreSQL restart then waits
/// forever. `bounded` ends such a wait: the call fails with `ConnectionLost` once the channel has been closed for
/// `closedGrace` (a statement that was in flight when the channel closed gets PostgresNIO's own error first).
///
/// What stays outside anyone's reach but PostgresNIO's: over TLS, a connection that PostgresNIO itself starts closing
/// (a protocol error during the COPY) stays active while the close_notify is exchanged.
public final class GuardedConnection: Sendable {
    public let connection: PostgresConnection
    private let state = Mutex(State())
    private let executor: EventLoopTaskExecutor
    private let closedGrace: Duration
    /// Tests only: runs inside the COPY (PostgreSQL is in COPY mode, nothing written yet), just before the write.
    private let beforeWrite: (@Sendable (GuardedConnection) async -> Void)?

    private struct State {
        var copying = false
        var closeRequested = false
        /// `bounded` calls in progress, each with what ends it when the channel closes.
        var watchers: [UInt64: @Sendable () -> Void] = [:]
        var nextWatcher: UInt64 = 0
        /// One callback on `closeFuture` per connection, registered by the first `bounded` call.
        var watchingClose = false
        var channelClosed = false
    }

    public convenience init(_ connection: PostgresConnection) {
        self.init(connection, closedGrace: .seconds(1), beforeWrite: nil)
    }

    init(
        _ connection: PostgresConnection, closedGrace: Duration = .seconds(1),
        beforeWrite: (@Sendable (GuardedConnection) async -> Void)? = nil
    ) {
        self.connection = connection
        self.executor = EventLoopTaskExecutor(connection.eventLoop)
        self.closedGrace = closedGrace
        self.beforeWrite = beforeWrite
    }

    public struct ConnectTimedOut: Error, CustomStringConvertible {
        public var limit: Duration
        public var description: String { "connecting to the database did not finish within \(limit)" }
    }

    /// Connects within `limit`: a connect that never completes (a database restarting as it accepted the socket)
    /// must not hold the caller. A connection that completes after the deadline is closed.
    public static func connect(
        _ configuration: PostgresConnection.Configuration, id: Int, within limit: Duration, logger: Logger
    ) async throws -> GuardedConnection {
        try await Race<GuardedConnection>.run(
            within: limit, timedOut: ConnectTimedOut(limit: limit),
            body: { GuardedConnection(try await PostgresConnection.connect(configuration: configuration, id: id, logger: logger)) },
            onTimeout: { logger.error("database connect timed out", metadata: ["limit": "\(limit)"]) },
            lateSuccess: { late in await late.close() })
    }

    public struct ConnectionLost: Error, CustomStringConvertible {
        public var grace: Duration
        /// The channel was found closed before the call sent anything.
        public var beforeSending = false
        public var description: String {
            beforeSending
                ? "the database connection was already closed; the statement was not sent"
                : "the database connection closed and the statement in flight was not answered within \(grace)"
        }
    }

    /// Runs `body`, which uses this connection, until it finishes, `limit` passes (then `timedOut` is thrown and
    /// `onTimeout` runs), or the channel has been closed for `closedGrace` (then `ConnectionLost` is thrown). The body
    /// is not awaited after either: a statement PostgresNIO will never answer must not hold the caller.
    ///
    /// A channel already closed fails the call before `body` runs: its statement would never be answered, and the task
    /// left waiting for it (with everything the body holds, a batch's rows say) would never end.
    public func bounded<T: Sendable>(
        within limit: Duration, timedOut: any Error, onTimeout: @escaping @Sendable () async -> Void,
        _ body: @escaping @Sendable () async throws -> T
    ) async throws -> T {
        if connection.isClosed { throw ConnectionLost(grace: closedGrace, beforeSending: true) }
        let race = Race<T>()
        let grace = closedGrace
        let id = watch { race.finish(.failure(ConnectionLost(grace: grace))) }
        defer { unwatch(id) }
        return try await race.run(within: limit, timedOut: timedOut, body: body, onTimeout: onTimeout)
    }

    public struct StatementTimedOut: Error, CustomStringConvertible {
        public var limit: Duration
        public var description: String { "a statement did not complete within \(limit); the connection was closed" }
    }

    /// `bounded` for callers that give up on the connection when a statement hangs (the responder, the App Store API
    /// commands' lookups): past `limit` the error is logged, the connection closed and `StatementTimedOut` thrown.
    public func statement<T: Sendable>(
        within limit: Duration, logger: Logger, _ body: @escaping @Sendable (PostgresConnection) async throws -> T
    ) async throws -> T {
        let connection = self.connection
        return try await bounded(within: limit, timedOut: StatementTimedOut(limit: limit), onTimeout: { [self] in
            logger.error("database statement timed out; closing the connection", metadata: ["limit": "\(limit)"])
            await close()
        }) { try await body(connection) }
    }

    private func watch(_ onLost: @escaping @Sendable () -> Void) -> UInt64 {
        let (id, register, closed) = state.withLock { s -> (UInt64, Bool, Bool) in
            let id = s.nextWatcher
            s.nextWatcher += 1
            s.watchers[id] = onLost
            defer { s.watchingClose = true }
            return (id, !s.watchingClose, s.channelClosed)
        }
        if register {
            connection.closeFuture.whenComplete { [weak self] _ in self?.channelDidClose() }
        }
        if closed { endAfterGrace(id) }
        return id
    }

    private func unwatch(_ id: UInt64) {
        _ = state.withLock { $0.watchers.removeValue(forKey: id) }
    }

    private func channelDidClose() {
        let ids = state.withLock { s -> [UInt64] in
            s.channelClosed = true
            return Array(s.watchers.keys)
        }
        for id in ids { endAfterGrace(id) }
    }

    /// One timer per `bounded` call that meets a closed channel; it ends that call if it is still waiting.
    private func endAfterGrace(_ id: UInt64) {
        connection.eventLoop.scheduleTask(in: .nanoseconds(closedGrace.nanoseconds)) { [weak self] in
            let onLost = self?.state.withLock { $0.watchers.removeValue(forKey: id) }
            onLost?()
        }
    }

    public struct ClosedDuringCopy: Error, CustomStringConvertible {
        public var requested: Bool
        public var description: String {
            requested
                ? "the database connection was closed (the batch timed out or was abandoned) during a COPY"
                : "the database connection closed during a COPY"
        }
    }

    /// Closes the connection; during a COPY, as soon as the COPY ends (without waiting for it here: a COPY stuck on a
    /// dead socket must not hold the caller).
    public func close() async {
        let now = state.withLock { s -> Bool in
            s.closeRequested = true
            return !s.copying
        }
        if now { try? await connection.close() }
    }

    /// Whether `close()` was called.
    public var isCloseRequested: Bool { state.withLock { $0.closeRequested } }

    /// Sends `rows` with `COPY ... FROM STDIN (FORMAT binary)`.
    func copy(_ rows: CopyRows, logger: Logger) async throws {
        let refused = state.withLock { s -> Bool in
            if s.closeRequested { return true }
            s.copying = true
            return false
        }
        if refused { throw ClosedDuringCopy(requested: true) }
        let result: Result<Void, any Error>
        do {
            let buffer = rows.buffer()
            let target = rows.copyTarget
            try await withTaskExecutorPreference(executor) {
                try await self.copyOnLoop(buffer, into: target, logger: logger)
            }
            result = .success(())
        } catch {
            result = .failure(error)
        }
        let closeNow = state.withLock { s -> Bool in
            s.copying = false
            return s.closeRequested
        }
        if closeNow {
            try? await connection.close()
            throw ClosedDuringCopy(requested: true)
        }
        try result.get()
    }

    /// Runs on the connection's event loop (the task executor): every `ensureOpen` check is followed, in the same
    /// event-loop turn, by the writer call it guards (PostgresNIO's writer calls its state machine synchronously when
    /// it is already on the loop).
    private func copyOnLoop(_ buffer: ByteBuffer, into target: String, logger: Logger) async throws {
        try await ensureOpen()
        try await connection.copyFrom(table: target, logger: logger) { writer in
            if let beforeWrite { await beforeWrite(self) }
            try await self.ensureOpen()
            try await writer.write(buffer)
            // `copyFrom` sends CopyDone right after this returns, in this same turn.
            try await self.ensureOpen()
        }
    }

    /// Throws `ClosedDuringCopy` once the connection is closed and its handler gone; returns on the event loop.
    private func ensureOpen() async throws {
        let loop = connection.eventLoop
        guard loop.inEventLoop else { throw NotOnEventLoop() }
        if state.withLock({ $0.closeRequested }) {
            // Not closed yet: the close waits for this COPY. End it here (CopyFail), then `copy` closes.
            throw ClosedDuringCopy(requested: true)
        }
        guard connection.isClosed else { return }
        // NIO removes the channel's handlers, then completes `closeFuture`, one turn after the close; a writer call
        // before that would reach PostgresNIO's closed state machine. One more turn for good measure.
        try? await connection.closeFuture.get()
        try? await loop.submit {}.get()
        throw ClosedDuringCopy(requested: false)
    }

    struct NotOnEventLoop: Error, CustomStringConvertible {
        var description: String { "internal: the COPY is not running on its connection's event loop" }
    }
}
