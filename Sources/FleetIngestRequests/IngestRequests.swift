import AppStoreVerification

/// Why a request body was refused with 400 (nothing published). `reason` is a stable code (metrics label and the
/// `reason` of the JSON answer); `detail` says what exactly was wrong.
public struct BadBody: Error, Sendable, Equatable {
    public var reason: String
    public var detail: String

    public init(_ reason: String, _ detail: String) {
        self.reason = reason
        self.detail = detail
    }

    public static let reasons = [
        "not_json", "not_an_object", "missing_signed_payload", "signed_payload_not_a_string", "empty_signed_payload",
        "missing_input", "ambiguous_input", "signed_transaction_not_a_string", "empty_signed_transaction",
        "receipt_data_not_a_string", "empty_receipt_data", "app_account_token_not_a_string",
        "device_verification_id_not_a_string",
    ]
}

/// What `POST /apple/notifications` publishes: the body unchanged, keyed by the (unverified) notificationUUID.
public struct NotificationRequest: Sendable, Equatable {
    public var key: [UInt8]?
}

/// What `POST /v1/transactions` publishes and verifies.
public struct TransactionRequest: Sendable, Equatable {
    public enum Kind: String, Sendable { case signedTransaction, receipt }
    public var kind: Kind
    /// The raw-topic value: the bare JWS of `signedTransaction`, or the whole body unchanged for `receipt-data`.
    public var value: [UInt8]
    public var key: [UInt8]?
    public var deviceVerificationId: String?
    public var appAccountToken: String?
}

/// Parses request bodies. Apple may add keys to its body: unknown keys are accepted and kept (the body is published
/// unchanged). The JWS inside is not verified here (the workers do that); only its shape as JSON is checked.
public enum IngestRequests {
    public static func notification(_ body: [UInt8]) throws(BadBody) -> NotificationRequest {
        let object = try parseObject(body)
        guard let field = object["signedPayload"] else {
            throw BadBody("missing_signed_payload", "the body has no \"signedPayload\" (App Store Server Notifications V2 body expected)")
        }
        guard case .string(let jws) = field else {
            throw BadBody("signed_payload_not_a_string", "\"signedPayload\" must be a string, found \(typeName(field))")
        }
        guard !jws.isEmpty else { throw BadBody("empty_signed_payload", "\"signedPayload\" is empty") }
        return NotificationRequest(key: unverifiedClaim(jws, "notificationUUID").map { Array($0.utf8) })
    }

    public static func transaction(_ body: [UInt8]) throws(BadBody) -> TransactionRequest {
        let object = try parseObject(body)
        let device = try optionalString(object, "deviceVerificationId", reason: "device_verification_id_not_a_string")
        let token = try optionalString(object, "appAccountToken", reason: "app_account_token_not_a_string")
        switch (object["signedTransaction"], object["receipt-data"]) {
        case (nil, nil):
            throw BadBody("missing_input", "the body needs \"signedTransaction\" (a JWS) or \"receipt-data\" (a base64 receipt)")
        case (.some, .some):
            throw BadBody("ambiguous_input", "the body has both \"signedTransaction\" and \"receipt-data\"; send one")
        case (.some(let field), nil):
            guard case .string(let jws) = field else {
                throw BadBody("signed_transaction_not_a_string", "\"signedTransaction\" must be a string, found \(typeName(field))")
            }
            guard !jws.isEmpty else { throw BadBody("empty_signed_transaction", "\"signedTransaction\" is empty") }
            return TransactionRequest(
                kind: .signedTransaction, value: Array(jws.utf8),
                key: unverifiedClaim(jws, "transactionId").map { Array($0.utf8) },
                deviceVerificationId: device, appAccountToken: token)
        case (nil, .some(let field)):
            guard case .string(let receipt) = field else {
                throw BadBody("receipt_data_not_a_string", "\"receipt-data\" must be a string, found \(typeName(field))")
            }
            guard !receipt.isEmpty else { throw BadBody("empty_receipt_data", "\"receipt-data\" is empty") }
            return TransactionRequest(kind: .receipt, value: body, key: nil, deviceVerificationId: device, appAccountToken: token)
        }
    }

    static func parseObject(_ body: [UInt8]) throws(BadBody) -> [String: JSONValue] {
        let value: JSONValue
        do { value = try JSONValue.parse(bytes: body) } catch {
            throw BadBody("not_json", "the body is not JSON: \(error)")
        }
        guard case .object(let object) = value else {
            throw BadBody("not_an_object", "the body must be a JSON object, found \(typeName(value))")
        }
        return object
    }

    static func optionalString(_ object: [String: JSONValue], _ key: String, reason: String) throws(BadBody) -> String? {
        guard let field = object[key], field != .null else { return nil }
        guard case .string(let s) = field else { throw BadBody(reason, "\"\(key)\" must be a string, found \(typeName(field))") }
        return s.isEmpty ? nil : s
    }

    static func typeName(_ v: JSONValue) -> String {
        switch v {
        case .null: return "null"
        case .bool: return "a boolean"
        case .integer, .number: return "a number"
        case .string: return "a string"
        case .array: return "an array"
        case .object: return "an object"
        }
    }

    /// A string claim of the JWS payload, read WITHOUT verification (only used as a partition key). Nil when the
    /// JWS is not well-formed or the claim is absent: the workers reject such input with a reason.
    static func unverifiedClaim(_ jws: String, _ claim: String) -> String? {
        let parts = jws.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard parts.count == 3, parts[1].count <= 256 * 1024 else { return nil }
        guard let payload = Base64.decodeURL(String(decoding: parts[1], as: UTF8.self)),
              let json = try? JSONValue.parse(bytes: payload) else { return nil }
        if case .string(let s)? = json[claim], !s.isEmpty, s.utf8.count <= 256 { return s }
        if case .integer(let i)? = json[claim] { return String(i) }
        return nil
    }
}
