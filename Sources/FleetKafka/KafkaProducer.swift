import Foundation
import Logging

/// Completion of one produced message.
typealias DeliveryCompletion = @Sendable (Result<DeliveryReport, KafkaError>) -> Void

/// Per-message context travelling through librdkafka as `msg_opaque`.
private final class DeliveryBox {
    let topic: String
    let completion: DeliveryCompletion
    init(topic: String, completion: @escaping DeliveryCompletion) {
        self.topic = topic
        self.completion = completion
    }
}

/// The producer's in-flight accounting, and every decision about it: whether a message may be enqueued now, who is
/// woken when a report frees a slot, what a fatal error or a close does. Plain Swift (no librdkafka).
struct ProducerState {
    let maxInFlight: Int
    var inFlight = 0
    var asyncWaiters: [CheckedContinuation<Void, Never>] = []
    var closed = false
    var fatal: KafkaError?

    init(maxInFlight: Int) { self.maxInFlight = max(1, maxInFlight) }

    enum Admission: Equatable { case acquired, fail(KafkaError), wait }

    /// A slot for one more message: taken, refused (closed, fatal) or not yet (all `maxInFlight` outstanding).
    mutating func acquire() -> Admission {
        if let f = fatal { return .fail(f) }
        if closed { return .fail(.closed("producer")) }
        if inFlight < maxInFlight { inFlight += 1; return .acquired }
        return .wait
    }

    /// Whether a waiting sender may try again now.
    var mayProceed: Bool { closed || fatal != nil || inFlight < maxInFlight }

    /// A report (or a failed enqueue) frees a slot: the longest-waiting async sender, if any, is to be resumed.
    mutating func release() -> CheckedContinuation<Void, Never>? {
        inFlight -= 1
        return asyncWaiters.isEmpty ? nil : asyncWaiters.removeFirst()
    }

    /// A fatal client error: every later send fails with it; every waiter is to be resumed (to see it).
    mutating func fail(_ error: KafkaError) -> [CheckedContinuation<Void, Never>] {
        if fatal == nil { fatal = error }
        defer { asyncWaiters = [] }
        return asyncWaiters
    }

    /// Closing: only the first call closes; every waiter is to be resumed (to see it closed).
    mutating func close() -> (first: Bool, waiters: [CheckedContinuation<Void, Never>]) {
        guard !closed else { return (false, []) }
        closed = true
        defer { asyncWaiters = [] }
        return (true, asyncWaiters)
    }
}

/// Owns the librdkafka producer handle and its poll thread. State changes are `ProducerState`'s methods.
final class ProducerCore: RDKafkaClientOwner {
    fileprivate let state: ConditionLock<ProducerState>
    private let pollStopped = ConditionLock<Bool>(false)
    private let stopPolling = ConditionLock<Bool>(false)
    let logger = Logger(label: "fleet.kafka.producer")
    /// Thread-safe; destroyed by `close` after the poll thread stopped.
    private let handle: RDKafkaProducerHandle

    init(configuration: KafkaConfiguration) throws(KafkaError) {
        state = ConditionLock(ProducerState(maxInFlight: configuration.maxInFlightMessages))
        let handle = try RDKafkaProducerHandle(properties: configuration.producerProperties())
        self.handle = handle
        // C callbacks receive only `rk`: they find this core through the registry.
        handle.register(self)
        let core = self
        startThread(name: "fleet-kafka-producer-poll") { core.pollLoop(handle) }
    }

    var maxInFlight: Int { state.withLock { $0.maxInFlight } }

    private func pollLoop(_ handle: RDKafkaProducerHandle) {
        while !stopPolling.withLock({ $0 }) {
            handle.poll(timeoutMilliseconds: 100)
        }
        pollStopped.withLock { $0 = true }
        pollStopped.broadcast()
    }

    // MARK: in-flight accounting

    /// Blocks the calling thread until a slot is free.
    fileprivate func acquireSlotBlocking() throws(KafkaError) {
        let result: ProducerState.Admission = state.wait(until: { $0.mayProceed }, timeoutSeconds: nil) { s, _ in s.acquire() }
        if case .fail(let error) = result { throw error }
    }

    /// Suspends (without blocking a thread) until a slot is free.
    fileprivate func acquireSlotAsync() async throws(KafkaError) {
        while true {
            switch state.withLock({ $0.acquire() }) {
            case .acquired: return
            case .fail(let e): throw e
            case .wait:
                await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                    let resumeNow = state.withLock { s -> Bool in
                        if s.mayProceed { return true }
                        s.asyncWaiters.append(c)
                        return false
                    }
                    if resumeNow { c.resume() }
                }
            }
        }
    }

    fileprivate func releaseSlot() {
        let waiter = state.withLock { s in
            state.broadcastLocked()
            return s.release()
        }
        waiter?.resume()
    }

    fileprivate func failAll(_ error: KafkaError) {
        let waiters = state.withLock { s in
            state.broadcastLocked()
            return s.fail(error)
        }
        waiters.forEach { $0.resume() }
    }

    /// Hands the message to librdkafka. The slot must already be held; it is released on failure here or by the
    /// delivery report otherwise. Returns `.queueFull` when librdkafka's own queue is full (slot kept).
    fileprivate func produce(_ message: OutgoingMessage, completion: @escaping DeliveryCompletion) -> KafkaError? {
        let box = Unmanaged.passRetained(DeliveryBox(topic: message.topic, completion: completion))
        guard let error = handle.produce(message, opaque: box.toOpaque()) else { return nil }
        box.release()  // not enqueued: no report will come
        return error
    }

    func enqueueBlocking(_ message: OutgoingMessage, completion: @escaping DeliveryCompletion) throws(KafkaError) {
        try acquireSlotBlocking()
        while true {
            guard let error = produce(message, completion: completion) else { return }
            if error.code == KafkaError.queueFullCode {
                // librdkafka's own buffer is full (bytes bound): the poll thread drains it; wait a little.
                usleep(1_000)
                continue
            }
            releaseSlot()
            throw error
        }
    }

    func enqueueAsync(_ message: OutgoingMessage, completion: @escaping DeliveryCompletion) async throws(KafkaError) {
        try await acquireSlotAsync()
        while true {
            guard let error = produce(message, completion: completion) else { return }
            if error.code == KafkaError.queueFullCode {
                try? await Task.sleep(for: .milliseconds(1))
                continue
            }
            releaseSlot()
            throw error
        }
    }

    var inFlight: Int { state.withLock { $0.inFlight } }

    func flush(timeout: Duration) -> Bool {
        let ms = Int32(clamping: timeout.components.seconds * 1000 + timeout.components.attoseconds / 1_000_000_000_000_000)
        return handle.flush(timeoutMilliseconds: ms) && inFlight == 0
    }

    /// Flushes up to `timeout`, fails what is left with `_PURGE_QUEUE`/`_PURGE_INFLIGHT` errors, stops the poll thread
    /// and destroys the handle. Idempotent.
    func close(timeout: Duration) {
        let (first, waiters) = state.withLock { s in
            state.broadcastLocked()
            return s.close()
        }
        guard first else { return }
        waiters.forEach { $0.resume() }
        _ = flush(timeout: timeout)
        // Serves the purge delivery reports so every caller gets its completion.
        handle.purgeAll()
        stopPolling.withLock { $0 = true }
        pollStopped.wait(until: { $0 }, timeoutSeconds: nil) { _, _ in }
        handle.destroy()
    }

    // MARK: librdkafka callbacks (RDKafkaClientOwner)

    func delivered(_ opaque: UnsafeMutableRawPointer, _ result: Result<(partition: Int32, offset: Int64), KafkaError>) {
        let box = Unmanaged<DeliveryBox>.fromOpaque(opaque).takeRetainedValue()
        releaseSlot()
        box.completion(result.map { DeliveryReport(topic: box.topic, partition: $0.partition, offset: $0.offset) })
    }

    func clientError(_ error: KafkaError) {
        if error.isFatal {
            logger.error("producer fatal error", metadata: ["error": "\(error)"])
            failAll(error)
        } else {
            logger.warning("producer error", metadata: ["code": "\(error.code)", "reason": "\(error.message)"])
        }
    }
}

/// An idempotent (by default) Kafka producer.
///
/// - `send(_:)` suspends until the message's delivery report arrives. When `maxInFlightMessages` are already
///   outstanding it first *suspends* (no thread blocked) until a slot frees.
/// - `enqueue(_:completion:)` is the high-throughput form: it returns as soon as librdkafka has the message and
///   calls `completion` (on the producer's poll thread: keep it short) with the delivery report. When
///   `maxInFlightMessages` are outstanding it BLOCKS the calling thread until a delivery report frees a slot, so
///   call it from a dedicated thread or accept short blocking (never while holding a lock the completion needs).
/// - Delivery reports, errors and statistics are served by a dedicated poll thread, never the cooperative pool.
public final class KafkaProducer: Sendable {
    let core: ProducerCore

    public init(configuration: KafkaConfiguration) throws(KafkaError) {
        core = try ProducerCore(configuration: configuration)
    }

    deinit { core.close(timeout: .seconds(5)) }

    /// Produces one message and returns when it is acknowledged (or failed: a typed `KafkaError`).
    public func send(_ message: OutgoingMessage) async throws(KafkaError) -> DeliveryReport {
        try await start(message).report()
    }

    /// Enqueues one message and returns at once with a handle on its delivery report: for a caller with other work
    /// to do meanwhile (`fleet ingest` verifies a transaction while its raw input is delivered) without a child task.
    /// Throws only when the message could not be enqueued at all.
    public func start(_ message: OutgoingMessage) async throws(KafkaError) -> PendingDelivery {
        let box = ResultBox()
        try await core.enqueueAsync(message) { result in box.set(result) }
        return PendingDelivery(box: box)
    }

    /// Enqueues one message; `completion` runs on the poll thread with the delivery report. Blocks the caller while
    /// `maxInFlightMessages` messages are outstanding (backpressure). Throws only when the message could not be
    /// enqueued at all (closed, fatal, invalid); delivery failures go to `completion`.
    public func enqueue(_ message: OutgoingMessage,
                        completion: @escaping @Sendable (Result<DeliveryReport, KafkaError>) -> Void) throws(KafkaError) {
        try core.enqueueBlocking(message, completion: completion)
    }

    /// Messages enqueued and not yet reported.
    public var inFlight: Int { core.inFlight }

    /// Waits (on the calling thread) for every outstanding delivery report, up to `timeout`.
    /// Returns true when nothing is outstanding anymore.
    @discardableResult
    public func flush(timeout: Duration) -> Bool { core.flush(timeout: timeout) }

    /// Like `flush(timeout:)` but runs on a dedicated thread and suspends the caller.
    @discardableResult
    public func flush(deadline timeout: Duration) async -> Bool {
        let core = self.core
        return await runBlocking(name: "fleet-kafka-flush") { core.flush(timeout: timeout) }
    }

    /// Flushes for up to `timeout` (default 10 s), fails whatever is still outstanding and releases the client.
    /// Blocks the calling thread; from async code prefer `close(deadline:)`.
    public func close(timeout: Duration = .seconds(10)) {
        core.close(timeout: timeout)
    }

    /// `close(timeout:)` on a dedicated thread; suspends the caller until done.
    public func close(deadline: Duration) async {
        let core = self.core
        await runBlocking(name: "fleet-kafka-producer-close") { core.close(timeout: deadline) }
    }
}

/// A message enqueued by `KafkaProducer.start`, awaiting its delivery report.
public struct PendingDelivery: Sendable {
    fileprivate let box: ResultBox

    /// The delivery report (acknowledged) or the typed failure.
    public func report() async throws(KafkaError) -> DeliveryReport { try await box.value() }
}

/// Bridges a delivery callback to an awaiting task.
fileprivate final class ResultBox: Sendable {
    private let state = ConditionLock<(Result<DeliveryReport, KafkaError>?, CheckedContinuation<Result<DeliveryReport, KafkaError>, Never>?)>((nil, nil))

    func set(_ result: Result<DeliveryReport, KafkaError>) {
        let c = state.withLock { s -> CheckedContinuation<Result<DeliveryReport, KafkaError>, Never>? in
            if let c = s.1 { s.1 = nil; return c }
            s.0 = result
            return nil
        }
        c?.resume(returning: result)
    }

    func value() async throws(KafkaError) -> DeliveryReport {
        let result = await withCheckedContinuation { (c: CheckedContinuation<Result<DeliveryReport, KafkaError>, Never>) in
            let ready = state.withLock { s -> Result<DeliveryReport, KafkaError>? in
                if let r = s.0 { return r }
                s.1 = c
                return nil
            }
            if let ready { c.resume(returning: ready) }
        }
        return try result.get()
    }
}
