import CRdKafka

/// A librdkafka error (or an error of this wrapper expressed with a librdkafka error code).
///
/// `code` is the raw `rd_kafka_resp_err_t` value: negative codes are librdkafka-internal (`__TRANSPORT`,
/// `__MSG_TIMED_OUT`, ...), positive codes are Kafka protocol errors (`NOT_LEADER_FOR_PARTITION`, ...).
public struct KafkaError: Error, Sendable, Hashable, CustomStringConvertible {
    /// Raw `rd_kafka_resp_err_t` value.
    public let code: Int32
    /// librdkafka's symbolic name of the code without the `RD_KAFKA_RESP_ERR_` prefix, e.g. `_MSG_TIMED_OUT`,
    /// `NOT_LEADER_FOR_PARTITION`.
    public let name: String
    /// Human readable detail.
    public let message: String
    /// Whether retrying the same operation may succeed.
    public let isRetriable: Bool
    /// Whether the client instance is unusable (e.g. an idempotent producer lost its guarantees).
    public let isFatal: Bool

    public init(code: Int32, message: String? = nil, isRetriable: Bool? = nil, isFatal: Bool = false) {
        let err = rd_kafka_resp_err_t(rawValue: code)
        self.code = code
        self.name = String(cString: rd_kafka_err2name(err))
        self.message = message ?? String(cString: rd_kafka_err2str(err))
        self.isRetriable = isRetriable ?? KafkaError.retriableCodes.contains(code)
        self.isFatal = isFatal
    }

    init(_ err: rd_kafka_resp_err_t, message: String? = nil, isFatal: Bool = false) {
        self.init(code: err.rawValue, message: message, isFatal: isFatal)
    }

    /// Takes ownership of an `rd_kafka_error_t` and destroys it.
    init(consuming error: OpaquePointer) {
        let code = rd_kafka_error_code(error).rawValue
        let text = rd_kafka_error_string(error).map { String(cString: $0) }
        self.init(
            code: code, message: text,
            isRetriable: rd_kafka_error_is_retriable(error) != 0 || KafkaError.retriableCodes.contains(code),
            isFatal: rd_kafka_error_is_fatal(error) != 0)
        rd_kafka_error_destroy(error)
    }

    public var description: String { "KafkaError(\(name) [\(code)]: \(message)\(isFatal ? ", fatal" : ""))" }

    public static func == (lhs: KafkaError, rhs: KafkaError) -> Bool { lhs.code == rhs.code && lhs.message == rhs.message }
    public func hash(into hasher: inout Hasher) { hasher.combine(code) }

    // MARK: well-known codes (raw values of rd_kafka_resp_err_t)
    public static let noError: Int32 = RD_KAFKA_RESP_ERR_NO_ERROR.rawValue
    public static let messageTimedOutCode: Int32 = RD_KAFKA_RESP_ERR__MSG_TIMED_OUT.rawValue
    public static let queueFullCode: Int32 = RD_KAFKA_RESP_ERR__QUEUE_FULL.rawValue
    public static let stateCode: Int32 = RD_KAFKA_RESP_ERR__STATE.rawValue
    public static let timedOutCode: Int32 = RD_KAFKA_RESP_ERR__TIMED_OUT.rawValue
    public static let fatalCode: Int32 = RD_KAFKA_RESP_ERR__FATAL.rawValue

    /// Wrapper-level errors.
    static func invalidArgument(_ text: String) -> KafkaError {
        KafkaError(RD_KAFKA_RESP_ERR__INVALID_ARG, message: text)
    }
    static func closed(_ what: String) -> KafkaError {
        KafkaError(code: RD_KAFKA_RESP_ERR__DESTROY.rawValue, message: "\(what) is closed", isRetriable: false)
    }
    static func timedOut(_ text: String) -> KafkaError {
        KafkaError(code: RD_KAFKA_RESP_ERR__TIMED_OUT.rawValue, message: text, isRetriable: true)
    }

    /// Codes for which librdkafka / Kafka clients retry or where a later attempt can succeed.
    static let retriableCodes: Set<Int32> = [
        RD_KAFKA_RESP_ERR__TRANSPORT, RD_KAFKA_RESP_ERR__TIMED_OUT, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT,
        RD_KAFKA_RESP_ERR__QUEUE_FULL, RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN, RD_KAFKA_RESP_ERR__WAIT_COORD,
        RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE, RD_KAFKA_RESP_ERR__RESOLVE, RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION,
        RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC,
        RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
        RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION,
        RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS, RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE,
        RD_KAFKA_RESP_ERR_NOT_COORDINATOR, RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART,
        RD_KAFKA_RESP_ERR_KAFKA_STORAGE_ERROR, RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
        RD_KAFKA_RESP_ERR_FENCED_LEADER_EPOCH, RD_KAFKA_RESP_ERR_UNKNOWN_LEADER_EPOCH,
        RD_KAFKA_RESP_ERR_OFFSET_NOT_AVAILABLE, RD_KAFKA_RESP_ERR_PREFERRED_LEADER_NOT_AVAILABLE,
        RD_KAFKA_RESP_ERR_THROTTLING_QUOTA_EXCEEDED,
    ].reduce(into: Set<Int32>()) { $0.insert($1.rawValue) }
}

/// Error codes by name for callers that do not import CRdKafka (tests, fault injection).
public enum KafkaErrorCode {
    public static let notLeaderForPartition: Int32 = RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION.rawValue
    public static let requestTimedOut: Int32 = RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT.rawValue
    public static let notEnoughReplicas: Int32 = RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS.rawValue
    public static let leaderNotAvailable: Int32 = RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE.rawValue
    public static let topicAuthorizationFailed: Int32 = RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED.rawValue
    public static let messageSizeTooLarge: Int32 = RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE.rawValue
    public static let invalidRecord: Int32 = RD_KAFKA_RESP_ERR_INVALID_RECORD.rawValue
    public static let corruptMessage: Int32 = RD_KAFKA_RESP_ERR_INVALID_MSG.rawValue
    public static let unknownTopicOrPartition: Int32 = RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART.rawValue
    public static let topicAlreadyExists: Int32 = RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS.rawValue
    public static let messageTimedOut: Int32 = RD_KAFKA_RESP_ERR__MSG_TIMED_OUT.rawValue
    public static let state: Int32 = RD_KAFKA_RESP_ERR__STATE.rawValue
    public static let invalidArgument: Int32 = RD_KAFKA_RESP_ERR__INVALID_ARG.rawValue
    public static let destroyed: Int32 = RD_KAFKA_RESP_ERR__DESTROY.rawValue
}

/// Kafka protocol API keys, for `EmbeddedKafkaCluster.pushRequestErrors`.
public enum KafkaAPIKey {
    public static let produce: Int16 = 0
    public static let fetch: Int16 = 1
    public static let listOffsets: Int16 = 2
    public static let metadata: Int16 = 3
    public static let offsetCommit: Int16 = 8
    public static let offsetFetch: Int16 = 9
    public static let findCoordinator: Int16 = 10
    public static let joinGroup: Int16 = 11
    public static let heartbeat: Int16 = 12
    public static let syncGroup: Int16 = 14
    public static let initProducerId: Int16 = 22
}
