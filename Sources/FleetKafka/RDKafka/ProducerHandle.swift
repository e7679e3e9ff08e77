import CRdKafka
import Foundation

/// A producer's librdkafka handle: produce, poll (serves delivery reports and errors), flush, purge. The owner
/// (`ProducerCore`) keeps the in-flight accounting; this type only makes the C calls. Thread-safe; `destroy()` last.
final class RDKafkaProducerHandle: @unchecked Sendable {
    private let rk: OpaquePointer
    /// `rd_kafka_topic_t*` by name, created on first use, destroyed with the handle.
    private let topics = ConditionLock<[String: OpaquePointer]>([:])

    init(properties: [(String, String)]) throws(KafkaError) {
        let conf = try makeConf(properties, callbacks: [.errors, .deliveryReports])
        rk = try makeHandle(RD_KAFKA_PRODUCER, conf: conf)
    }

    /// Routes this handle's callbacks to `owner` (before the first poll).
    func register(_ owner: any RDKafkaClientOwner) { RDKafkaRegistry.shared.register(rk, owner) }

    private func topicHandle(_ name: String) throws(KafkaError) -> OpaquePointer {
        let result: OpaquePointer? = topics.withLock { t in
            if let h = t[name] { return h }
            guard let h = rd_kafka_topic_new(rk, name, nil) else { return nil }
            t[name] = h
            return h
        }
        guard let result else { throw .invalidArgument("invalid topic name '\(name)'") }
        return result
    }

    /// Hands the message to librdkafka (copied); its delivery report reaches the owner with `opaque`. On failure
    /// (nothing enqueued, no report will come) returns the error, e.g. `KafkaError.queueFullCode`.
    func produce(_ message: OutgoingMessage, opaque: UnsafeMutableRawPointer) -> KafkaError? {
        let rkt: OpaquePointer
        do { rkt = try topicHandle(message.topic) } catch { return error }
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
                    vus[n].vtype = RD_KAFKA_VTYPE_OPAQUE; vus[n].u.ptr = opaque; n += 1
                    if let headers { vus[n].vtype = RD_KAFKA_VTYPE_HEADERS; vus[n].u.headers = headers; n += 1 }
                    return rd_kafka_produceva(rk, vus.baseAddress, n)
                }
            }
        }
        if let error {
            // Not enqueued: the headers are still ours.
            if let headers { rd_kafka_headers_destroy(headers) }
            return KafkaError(consuming: error)
        }
        return nil
    }

    /// Serves delivery reports and errors for up to `timeoutMilliseconds`.
    func poll(timeoutMilliseconds: Int32) { rd_kafka_poll(rk, timeoutMilliseconds) }

    /// Waits for every queued message's report up to `timeoutMilliseconds`; true when librdkafka's queue is empty.
    func flush(timeoutMilliseconds: Int32) -> Bool { rd_kafka_flush(rk, timeoutMilliseconds) == RD_KAFKA_RESP_ERR_NO_ERROR }

    /// Fails every queued and in-flight message (`_PURGE_QUEUE`, `_PURGE_INFLIGHT`) and serves those reports.
    func purgeAll() {
        rd_kafka_purge(rk, Int32(RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT))
        _ = rd_kafka_flush(rk, 1_000)
    }

    /// Frees the topic handles and the handle; the last call.
    func destroy() {
        let all = topics.withLock { t -> [OpaquePointer] in defer { t = [:] }; return Array(t.values) }
        all.forEach { rd_kafka_topic_destroy($0) }
        RDKafkaRegistry.shared.unregister(rk)
        rd_kafka_destroy(rk)
    }
}

private func withOptionalBytes<R>(_ bytes: [UInt8]?, _ body: (UnsafeRawBufferPointer?) -> R) -> R {
    guard let bytes else { return body(nil) }
    return bytes.withUnsafeBytes { body($0) }
}
