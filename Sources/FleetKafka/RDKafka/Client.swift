import CRdKafka
import Logging

// The C side of every librdkafka client: configuration objects, handle creation, and the one registry through which
// librdkafka's C callbacks (which receive only the `rd_kafka_t*`) reach the Swift object that owns the handle.

/// What a client handle's owner hears from librdkafka's callbacks. Called on librdkafka's threads (the poll thread of
/// the owner for delivery reports and rebalances, any thread for logs): keep it short.
protocol RDKafkaClientOwner: AnyObject, Sendable {
    /// A client error (`error_cb`); `error.isFatal` when the client instance is unusable.
    func clientError(_ error: KafkaError)
    /// A consumer position reset after an error, parsed from librdkafka's `OFFSET` log line.
    func offsetResetLogged(_ reset: OffsetReset)
    /// A consumer group rebalance (`rebalance_cb`): the owner updates its state and says what librdkafka must do.
    func rebalance(_ event: RebalanceEvent) -> RebalanceAction
    /// A rebalance action librdkafka refused.
    func rebalanceActionFailed(_ error: KafkaError)
    /// A producer delivery report (`dr_msg_cb`) for the message produced with `opaque`.
    func delivered(_ opaque: UnsafeMutableRawPointer, _ result: Result<(partition: Int32, offset: Int64), KafkaError>)
}

extension RDKafkaClientOwner {
    func offsetResetLogged(_ reset: OffsetReset) {}
    func rebalance(_ event: RebalanceEvent) -> RebalanceAction { .unassignAll }
    func rebalanceActionFailed(_ error: KafkaError) {}
    func delivered(_ opaque: UnsafeMutableRawPointer, _ result: Result<(partition: Int32, offset: Int64), KafkaError>) {}
}

/// A consumer group rebalance as librdkafka announced it.
struct RebalanceEvent: Sendable, Hashable {
    enum Kind: Sendable, Hashable {
        case assign
        case revoke(lost: Bool)
        /// Any other rebalance error (librdkafka's name of it).
        case failed(String)
    }
    var kind: Kind
    var partitions: Set<TopicPartition>
}

/// What librdkafka must do in answer to a rebalance (incrementally under the cooperative protocol).
enum RebalanceAction: Sendable, Hashable {
    /// Take the announced partitions.
    case assign
    /// Give the announced partitions up.
    case unassign
    /// Drop the whole assignment (after a rebalance error).
    case unassignAll
}

/// The one registry: client handles to their owners.
final class RDKafkaRegistry: Sendable {
    static let shared = RDKafkaRegistry()
    private let map = ConditionLock<[UInt: any RDKafkaClientOwner]>([:])
    func register(_ rk: OpaquePointer, _ owner: any RDKafkaClientOwner) { map.withLock { $0[UInt(bitPattern: rk)] = owner } }
    func unregister(_ rk: OpaquePointer) { _ = map.withLock { $0.removeValue(forKey: UInt(bitPattern: rk)) } }
    func lookup(_ rk: OpaquePointer?) -> (any RDKafkaClientOwner)? {
        guard let rk else { return nil }
        return map.withLock { $0[UInt(bitPattern: rk)] }
    }
}

let librdkafkaLogger = Logger(label: "librdkafka")

private let logCallback: @convention(c) (OpaquePointer?, Int32, UnsafePointer<CChar>?, UnsafePointer<CChar>?) -> Void = {
    rk, level, facility, buf in
    let text = buf.map { String(cString: $0) } ?? ""
    let fac = facility.map { String(cString: $0) } ?? ""
    // A position reset after an error (out of range): made loud by the consumer (OffsetReset.swift).
    if fac == "OFFSET", level <= 4, let reset = OffsetReset.parseLibrdkafkaLog(text), let owner = RDKafkaRegistry.shared.lookup(rk) {
        owner.offsetResetLogged(reset)
    }
    let swiftLevel: Logger.Level
    switch level {
    case ...3: swiftLevel = .error
    case 4: swiftLevel = .warning
    case 5...6: swiftLevel = .info
    default: swiftLevel = .debug
    }
    librdkafkaLogger.log(level: swiftLevel, "\(fac): \(text)")
}

/// The fatal error behind `RD_KAFKA_RESP_ERR__FATAL` (librdkafka keeps the original).
func fatalError(of rk: OpaquePointer) -> KafkaError {
    var buf = [CChar](repeating: 0, count: 512)
    let code = rd_kafka_fatal_error(rk, &buf, buf.count)
    return KafkaError(code, message: "fatal \(String(cString: rd_kafka_err2name(code))): \(errorString(buf))", isFatal: true)
}

private let errorCallback: @convention(c) (OpaquePointer?, Int32, UnsafePointer<CChar>?, UnsafeMutableRawPointer?) -> Void = {
    rk, err, reason, _ in
    guard let rk, let owner = RDKafkaRegistry.shared.lookup(rk) else { return }
    if err == RD_KAFKA_RESP_ERR__FATAL.rawValue {
        owner.clientError(fatalError(of: rk))
    } else {
        owner.clientError(KafkaError(code: err, message: reason.map { String(cString: $0) } ?? ""))
    }
}

private let rebalanceCallback: @convention(c) (OpaquePointer?, rd_kafka_resp_err_t, UnsafeMutablePointer<rd_kafka_topic_partition_list_t>?, UnsafeMutableRawPointer?) -> Void = {
    rk, err, list, _ in
    guard let rk else { return }
    guard let owner = RDKafkaRegistry.shared.lookup(rk) else {
        _ = rd_kafka_assign(rk, nil)
        return
    }
    let partitions = topicPartitions(list)
    let kind: RebalanceEvent.Kind
    switch err {
    case RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS: kind = .assign
    case RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS: kind = .revoke(lost: rd_kafka_assignment_lost(rk) != 0)
    default: kind = .failed(String(cString: rd_kafka_err2name(err)))
    }
    let action = owner.rebalance(RebalanceEvent(kind: kind, partitions: partitions))
    let cooperative = String(cString: rd_kafka_rebalance_protocol(rk)) == "COOPERATIVE"
    var failure: KafkaError?
    switch (action, cooperative) {
    case (.assign, true): if let e = rd_kafka_incremental_assign(rk, list) { failure = KafkaError(consuming: e) }
    case (.unassign, true): if let e = rd_kafka_incremental_unassign(rk, list) { failure = KafkaError(consuming: e) }
    case (.assign, false):
        let e = rd_kafka_assign(rk, list)
        if e != RD_KAFKA_RESP_ERR_NO_ERROR { failure = KafkaError(e) }
    case (.unassign, false), (.unassignAll, _):
        let e = rd_kafka_assign(rk, nil)
        if e != RD_KAFKA_RESP_ERR_NO_ERROR, action == .unassign { failure = KafkaError(e) }
    }
    if let failure { owner.rebalanceActionFailed(failure) }
}

private let deliveryCallback: @convention(c) (OpaquePointer?, UnsafePointer<rd_kafka_message_t>?, UnsafeMutableRawPointer?) -> Void = {
    rk, rkmessage, _ in
    guard let rk, let rkmessage, let owner = RDKafkaRegistry.shared.lookup(rk) else { return }
    let m = rkmessage.pointee
    guard let opaque = m._private else { return }
    if m.err == RD_KAFKA_RESP_ERR_NO_ERROR {
        owner.delivered(opaque, .success((m.partition, m.offset)))
    } else if m.err == RD_KAFKA_RESP_ERR__FATAL {
        owner.delivered(opaque, .failure(fatalError(of: rk)))
    } else {
        owner.delivered(opaque, .failure(KafkaError(m.err, message: String(cString: rd_kafka_err2str(m.err)))))
    }
}

/// The partitions of a C partition list.
func topicPartitions(_ list: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>?) -> Set<TopicPartition> {
    var partitions: Set<TopicPartition> = []
    if let list {
        for i in 0..<Int(list.pointee.cnt) {
            let e = list.pointee.elems[i]
            partitions.insert(TopicPartition(topic: String(cString: e.topic), partition: e.partition))
        }
    }
    return partitions
}

/// A new C partition list holding `partitions` (with `offset` per partition when given). The caller destroys it.
func makePartitionList(_ partitions: some Collection<TopicPartition>, offsets: [TopicPartition: Int64] = [:]) -> UnsafeMutablePointer<rd_kafka_topic_partition_list_t>? {
    let list = rd_kafka_topic_partition_list_new(Int32(partitions.count))
    for tp in partitions {
        let e = rd_kafka_topic_partition_list_add(list, tp.topic, tp.partition)
        if let offset = offsets[tp] { e?.pointee.offset = offset }
    }
    return list
}

/// The callbacks a client registers: logs always; errors, rebalances and delivery reports as its kind needs.
struct RDKafkaCallbacks: OptionSet {
    let rawValue: Int
    static let errors = RDKafkaCallbacks(rawValue: 1)
    static let rebalance = RDKafkaCallbacks(rawValue: 2)
    static let deliveryReports = RDKafkaCallbacks(rawValue: 4)
}

/// Builds an `rd_kafka_conf_t`. The caller owns the result until it hands it to `rd_kafka_new`.
func makeConf(_ properties: [(String, String)], callbacks: RDKafkaCallbacks = []) throws(KafkaError) -> OpaquePointer {
    guard let conf = rd_kafka_conf_new() else { throw .invalidArgument("rd_kafka_conf_new failed") }
    var errstr = [CChar](repeating: 0, count: 512)
    for (key, value) in properties {
        let res = rd_kafka_conf_set(conf, key, value, &errstr, errstr.count)
        if res != RD_KAFKA_CONF_OK {
            rd_kafka_conf_destroy(conf)
            let shown = KafkaConfiguration.isSecret(key) ? "<redacted>" : value
            throw .invalidArgument("librdkafka property \(key)=\(shown): \(errorString(errstr))")
        }
    }
    rd_kafka_conf_set_log_cb(conf, logCallback)
    if callbacks.contains(.errors) { rd_kafka_conf_set_error_cb(conf, errorCallback) }
    if callbacks.contains(.rebalance) { rd_kafka_conf_set_rebalance_cb(conf, rebalanceCallback) }
    if callbacks.contains(.deliveryReports) { rd_kafka_conf_set_dr_msg_cb(conf, deliveryCallback) }
    return conf
}

/// `rd_kafka_new`; takes ownership of `conf` in every case.
func makeHandle(_ type: rd_kafka_type_t, conf: OpaquePointer) throws(KafkaError) -> OpaquePointer {
    var errstr = [CChar](repeating: 0, count: 512)
    guard let rk = rd_kafka_new(type, conf, &errstr, errstr.count) else {
        rd_kafka_conf_destroy(conf)
        throw .invalidArgument("rd_kafka_new failed: \(errorString(errstr))")
    }
    return rk
}

func errorString(_ buffer: [CChar]) -> String {
    String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
