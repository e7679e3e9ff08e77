import CRdKafka
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

/// Producer state behind one lock.
private struct ProducerState {
    var inFlight = 0
    var asyncWaiters: [CheckedContinuation<Void, Never>] = []
    var closed = false
    var fatal: KafkaError?
    var topics: [String: OpaquePointer] = [:]
}

/// Owns the librdkafka producer handle and its poll thread.
final class ProducerCore: Sendable {
    let maxInFlight: Int
    fileprivate let state: ConditionLock<ProducerState>
    private let pollStopped = ConditionLock<Bool>(false)
    private let stopPolling = ConditionLock<Bool>(false)
    let logger = Logger(label: "fleet.kafka.producer")

    /// The `rd_kafka_t*`. librdkafka handles are thread-safe (internally locked); the pointer itself never changes.
    nonisolated(unsafe) private let handle: OpaquePointer

    init(configuration: KafkaConfiguration) throws(KafkaError) {
        maxInFlight = max(1, configuration.maxInFlightMessages)
        state = ConditionLock(ProducerState())
        let conf = try makeConf(configuration.producerProperties())
        rd_kafka_conf_set_dr_msg_cb(conf, producerDeliveryCallback)
        rd_kafka_conf_set_error_cb(conf, producerErrorCallback)
        handle = try makeHandle(RD_KAFKA_PRODUCER, conf: conf)
        // C callbacks receive only `rk`: they find this core through a registry keyed by the handle.
        ProducerRegistry.shared.register(handle, self)
        let core = self
        startThread(name: "fleet-kafka-producer-poll") { core.pollLoop() }
    }

    private func pollLoop() {
        while !stopPolling.withLock({ $0 }) {
            rd_kafka_poll(handle, 100)
        }
        pollStopped.withLock { $0 = true }
        pollStopped.broadcast()
    }

    // MARK: in-flight accounting

    /// Blocks the calling thread until a slot is free.
    fileprivate func acquireSlotBlocking() throws(KafkaError) {
        let result: KafkaError? = state.wait(
            until: { $0.closed || $0.fatal != nil || $0.inFlight < self.maxInFlight }, timeoutSeconds: nil
        ) { s, _ in
            if let f = s.fatal { return f }
            if s.closed { return .closed("producer") }
            s.inFlight += 1
            return nil
        }
        if let result { throw result }
    }

    /// Suspends (without blocking a thread) until a slot is free.
    fileprivate func acquireSlotAsync() async throws(KafkaError) {
        while true {
            enum Step { case acquired, fail(KafkaError), wait }
            let step: Step = state.withLock { s in
                if let f = s.fatal { return .fail(f) }
                if s.closed { return .fail(.closed("producer")) }
                if s.inFlight < maxInFlight { s.inFlight += 1; return .acquired }
                return .wait
            }
            switch step {
            case .acquired: return
            case .fail(let e): throw e
            case .wait:
                await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                    let resumeNow = state.withLock { s -> Bool in
                        if s.closed || s.fatal != nil || s.inFlight < maxInFlight { return true }
                        s.asyncWaiters.append(c)
                        return false
                    }
                    if resumeNow { c.resume() }
                }
            }
        }
    }

    fileprivate func releaseSlot() {
        let waiter: CheckedContinuation<Void, Never>? = state.withLock { s in
            s.inFlight -= 1
            state.broadcastLocked()
            return s.asyncWaiters.isEmpty ? nil : s.asyncWaiters.removeFirst()
        }
        waiter?.resume()
    }

    fileprivate func failAll(_ error: KafkaError) {
        let waiters = state.withLock { s -> [CheckedContinuation<Void, Never>] in
            if s.fatal == nil { s.fatal = error }
            state.broadcastLocked()
            defer { s.asyncWaiters = [] }
            return s.asyncWaiters
        }
        waiters.forEach { $0.resume() }
    }

    private func topicHandle(_ name: String) throws(KafkaError) -> OpaquePointer {
        let result: OpaquePointer? = state.withLock { s in
            if let t = s.topics[name] { return t }
            guard let t = rd_kafka_topic_new(handle, name, nil) else { return nil }
            s.topics[name] = t
            return t
        }
        guard let result else { throw .invalidArgument("invalid topic name '\(name)'") }
        return result
    }

    /// Hands the message to librdkafka. The slot must already be held; it is released on failure here or in the
    /// delivery callback otherwise. Returns `.queueFull` when librdkafka's own queue is full (slot kept).
    fileprivate func produce(_ message: OutgoingMessage, completion: @escaping DeliveryCompletion) -> KafkaError? {
        let rkt: OpaquePointer
        do { rkt = try topicHandle(message.topic) } catch { return error }
        let box = Unmanaged.passRetained(DeliveryBox(topic: message.topic, completion: completion))
        var headers: OpaquePointer? = nil
        if !message.headers.isEmpty {
            headers = rd_kafka_headers_new(message.headers.count)
            for h in message.headers {
                h.value.withUnsafeBytes { v in
                    _ = rd_kafka_header_add(headers, h.key, -1, v.baseAddress, v.count)
                }
            }
        }
        let error: OpaquePointer? = message.value.withUnsafeBytes { value in
            withOptionalBytes(message.key) { key in
                // Stack-allocated argument vector (no heap allocation per message).
                withUnsafeTemporaryAllocation(of: rd_kafka_vu_t.self, capacity: 7) { vus in
                    vus.initialize(repeating: rd_kafka_vu_t())
                    var n = 0
                    vus[n].vtype = RD_KAFKA_VTYPE_RKT; vus[n].u.rkt = rkt; n += 1
                    vus[n].vtype = RD_KAFKA_VTYPE_PARTITION; vus[n].u.i32 = message.partition ?? RD_KAFKA_PARTITION_UA; n += 1
                    vus[n].vtype = RD_KAFKA_VTYPE_MSGFLAGS; vus[n].u.i = RD_KAFKA_MSG_F_COPY; n += 1
                    vus[n].vtype = RD_KAFKA_VTYPE_VALUE
                    vus[n].u.mem.ptr = value.baseAddress.map { UnsafeMutableRawPointer(mutating: $0) }
                    vus[n].u.mem.size = value.count; n += 1
                    if let key {
                        vus[n].vtype = RD_KAFKA_VTYPE_KEY
                        vus[n].u.mem.ptr = key.baseAddress.map { UnsafeMutableRawPointer(mutating: $0) }
                        vus[n].u.mem.size = key.count; n += 1
                    }
                    vus[n].vtype = RD_KAFKA_VTYPE_OPAQUE; vus[n].u.ptr = box.toOpaque(); n += 1
                    if let headers { vus[n].vtype = RD_KAFKA_VTYPE_HEADERS; vus[n].u.headers = headers; n += 1 }
                    return rd_kafka_produceva(handle, vus.baseAddress, n)
                }
            }
        }
        if let error {
            // Not enqueued: we still own the box and the headers.
            box.release()
            if let headers { rd_kafka_headers_destroy(headers) }
            return KafkaError(consuming: error)
        }
        return nil
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
        let err = rd_kafka_flush(handle, ms)
        return err == RD_KAFKA_RESP_ERR_NO_ERROR && inFlight == 0
    }

    /// Flushes up to `timeout`, fails what is left with `_PURGE_QUEUE`/`_PURGE_INFLIGHT` errors, stops the poll thread
    /// and destroys the handle. Idempotent.
    func close(timeout: Duration) {
        let first = state.withLock { s -> Bool in
            if s.closed { return false }
            s.closed = true
            state.broadcastLocked()
            return true
        }
        guard first else { return }
        let waiters = state.withLock { s -> [CheckedContinuation<Void, Never>] in
            defer { s.asyncWaiters = [] }
            return s.asyncWaiters
        }
        waiters.forEach { $0.resume() }
        _ = flush(timeout: timeout)
        rd_kafka_purge(handle, Int32(RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT))
        // Serve the purge delivery reports so every caller gets its completion.
        _ = rd_kafka_flush(handle, 1_000)
        stopPolling.withLock { $0 = true }
        pollStopped.wait(until: { $0 }, timeoutSeconds: nil) { _, _ in }
        let topics = state.withLock { s -> [OpaquePointer] in
            defer { s.topics = [:] }
            return Array(s.topics.values)
        }
        topics.forEach { rd_kafka_topic_destroy($0) }
        ProducerRegistry.shared.unregister(handle)
        rd_kafka_destroy(handle)
    }

    fileprivate func deliver(_ rkmessage: UnsafePointer<rd_kafka_message_t>) {
        let m = rkmessage.pointee
        guard let opaque = m._private else { return }
        let box = Unmanaged<DeliveryBox>.fromOpaque(opaque).takeRetainedValue()
        releaseSlot()
        if m.err == RD_KAFKA_RESP_ERR_NO_ERROR {
            box.completion(.success(DeliveryReport(topic: box.topic, partition: m.partition, offset: m.offset)))
        } else {
            var isFatal = false
            var message = String(cString: rd_kafka_err2str(m.err))
            if m.err == RD_KAFKA_RESP_ERR__FATAL {
                var buf = [CChar](repeating: 0, count: 512)
                let code = rd_kafka_fatal_error(handle, &buf, buf.count)
                message = "fatal \(String(cString: rd_kafka_err2name(code))): \(errorString(buf))"
                isFatal = true
            }
            box.completion(.failure(KafkaError(m.err, message: message, isFatal: isFatal)))
        }
    }

    fileprivate func onError(code: Int32, reason: String) {
        if code == RD_KAFKA_RESP_ERR__FATAL.rawValue {
            var buf = [CChar](repeating: 0, count: 512)
            let orig = rd_kafka_fatal_error(handle, &buf, buf.count)
            let error = KafkaError(orig, message: "fatal: \(errorString(buf))", isFatal: true)
            logger.error("producer fatal error", metadata: ["error": "\(error)"])
            failAll(error)
        } else {
            logger.warning("producer error", metadata: ["code": "\(code)", "reason": "\(reason)"])
        }
    }
}

private func withOptionalBytes<R>(_ bytes: [UInt8]?, _ body: (UnsafeRawBufferPointer?) -> R) -> R {
    guard let bytes else { return body(nil) }
    return bytes.withUnsafeBytes { body($0) }
}

/// Maps producer handles to their cores for the C callbacks (which only receive `rk`).
final class ProducerRegistry: Sendable {
    static let shared = ProducerRegistry()
    private let map = ConditionLock<[UInt: ProducerCore]>([:])
    func register(_ rk: OpaquePointer, _ core: ProducerCore) { map.withLock { $0[UInt(bitPattern: rk)] = core } }
    func unregister(_ rk: OpaquePointer) { _ = map.withLock { $0.removeValue(forKey: UInt(bitPattern: rk)) } }
    func lookup(_ rk: OpaquePointer?) -> ProducerCore? {
        guard let rk else { return nil }
        return map.withLock { $0[UInt(bitPattern: rk)] }
    }
}

private let producerDeliveryCallback: @convention(c) (OpaquePointer?, UnsafePointer<rd_kafka_message_t>?, UnsafeMutableRawPointer?) -> Void = {
    rk, rkmessage, _ in
    guard let rkmessage, let core = ProducerRegistry.shared.lookup(rk) else { return }
    core.deliver(rkmessage)
}

private let producerErrorCallback: @convention(c) (OpaquePointer?, Int32, UnsafePointer<CChar>?, UnsafeMutableRawPointer?) -> Void = {
    rk, err, reason, _ in
    guard let core = ProducerRegistry.shared.lookup(rk) else { return }
    core.onError(code: err, reason: reason.map { String(cString: $0) } ?? "")
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
        let box = ResultBox()
        try await core.enqueueAsync(message) { result in box.set(result) }
        return try await box.value()
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

/// Bridges a delivery callback to an awaiting task.
private final class ResultBox: Sendable {
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
