import AppStoreVerification
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

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
        if let jws = sole(.signedPayload, body) {
            return NotificationRequest(key: unverifiedClaim(jws, "notificationUUID").map { Array($0.utf8) })
        }
        return try parsedNotification(body)
    }

    /// `notification(_:)` by the full JSON parse.
    package static func parsedNotification(_ body: [UInt8]) throws(BadBody) -> NotificationRequest {
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
        if let jws = sole(.signedTransaction, body) {
            return TransactionRequest(
                kind: .signedTransaction, value: Array(jws),
                key: unverifiedClaim(jws, "transactionId").map { Array($0.utf8) }, deviceVerificationId: nil, appAccountToken: nil)
        }
        return try parsedTransaction(body)
    }

    /// `transaction(_:)` by the full JSON parse.
    package static func parsedTransaction(_ body: [UInt8]) throws(BadBody) -> TransactionRequest {
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

    /// The JWS of a body that is exactly `{"<name>":"<JWS>"}` (`SoleJWSBody`): what the full parse would take from it.
    static func sole(_ form: SoleJWSBody, _ body: [UInt8]) -> ArraySlice<UInt8>? {
        body.withUnsafeBufferPointer { form.jws(in: $0) }.map { body[$0] }
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
    /// JWS is not well-formed or the claim is absent: the workers reject such input with a reason. The payload is
    /// decoded straight from the JWS bytes and scanned for the one top-level member, not parsed into values (a
    /// notification's payload carries two nested JWS of several KB each).
    static func unverifiedClaim(_ jws: String, _ claim: String) -> String? {
        var jws = jws
        return jws.withUTF8 { unverifiedClaim($0, claim) }
    }

    static func unverifiedClaim(_ jws: ArraySlice<UInt8>, _ claim: String) -> String? {
        jws.withUnsafeBufferPointer { unverifiedClaim($0, claim) }
    }

    static func unverifiedClaim(_ bytes: UnsafeBufferPointer<UInt8>, _ claim: String) -> String? {
        // The header (a transaction's carries its ~4 KB certificate chain) is skipped with memchr, not a byte loop.
        guard let first = dotIndex(bytes, from: 0),
              let second = dotIndex(bytes, from: first + 1),
              dotIndex(bytes, from: second + 1) == nil,
              second - first - 1 <= 256 * 1024
        else { return nil }
        let encoded = UnsafeBufferPointer(rebasing: bytes[(first + 1)..<second])
        let key = Array(claim.utf8)
        // Apple's payloads name these claims first (transactionId, notificationUUID): a prefix is decoded and scanned
        // first, the whole payload only when the claim is not complete in it. (So a payload whose later part is not
        // base64 can still be keyed by a claim read before that part; the workers reject it with its reason.)
        if encoded.count > claimPrefixCharacters,
           let head = Base64.decodeURL(UnsafeBufferPointer(rebasing: encoded[..<claimPrefixCharacters])),
           let value = topLevelMember(head, key, truncated: true) {
            return value
        }
        guard let payload = Base64.decodeURL(encoded) else { return nil }
        return topLevelMember(payload, key)
    }

    /// How much of a payload's base64 `unverifiedClaim` decodes first (a multiple of 4: 384 bytes).
    static let claimPrefixCharacters = 512

    /// The index of the first `.` at or after `from`; nil when there is none.
    static func dotIndex(_ bytes: UnsafeBufferPointer<UInt8>, from: Int) -> Int? {
        guard from < bytes.count, let base = bytes.baseAddress,
              let hit = memchr(base + from, Int32(UInt8(ascii: ".")), bytes.count - from)
        else { return nil }
        return UnsafeRawPointer(hit) - UnsafeRawPointer(base)
    }

    /// The value of top-level member `key` of a JSON object when it is a string (1...256 bytes of valid UTF-8, no escapes) or an
    /// integer; nil otherwise. A scan, not a validator: only used to pick a partition key from unverified input.
    /// `truncated`: `b` is only the document's beginning, so a value that reaches its end is not taken (a number may
    /// go on after it).
    static func topLevelMember(_ b: [UInt8], _ key: [UInt8], truncated: Bool = false) -> String? {
        let quote = UInt8(ascii: "\""), backslash = UInt8(ascii: "\\")
        var i = 0
        let n = b.count
        func skipSpace() {
            while i < n, b[i] == 0x20 || b[i] == 0x0A || b[i] == 0x0D || b[i] == 0x09 { i += 1 }
        }
        /// The content range of the string at `i` (which must start with a quote) and whether it has escapes.
        func string() -> (Range<Int>, Bool)? {
            guard i < n, b[i] == quote else { return nil }
            i += 1
            let start = i
            var escaped = false
            while i < n {
                if b[i] == backslash { escaped = true; i += 2; continue }
                if b[i] == quote { i += 1; return (start..<(i - 1), escaped) }
                i += 1
            }
            return nil
        }
        func skipValue() -> Bool {
            guard i < n else { return false }
            switch b[i] {
            case quote:
                return string() != nil
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                var depth = 0
                while i < n {
                    switch b[i] {
                    case quote:
                        guard string() != nil else { return false }
                        continue
                    case UInt8(ascii: "{"), UInt8(ascii: "["):
                        depth += 1
                    case UInt8(ascii: "}"), UInt8(ascii: "]"):
                        depth -= 1
                        if depth == 0 { i += 1; return true }
                    default: break
                    }
                    i += 1
                }
                return false
            default:
                let start = i
                while i < n, ![UInt8(ascii: ","), UInt8(ascii: "}"), UInt8(ascii: "]"), 0x20, 0x0A, 0x0D, 0x09].contains(b[i]) { i += 1 }
                return i > start
            }
        }
        skipSpace()
        guard i < n, b[i] == UInt8(ascii: "{") else { return nil }
        i += 1
        while true {
            skipSpace()
            guard let name = string()?.0 else { return nil }
            skipSpace()
            guard i < n, b[i] == UInt8(ascii: ":") else { return nil }
            i += 1
            skipSpace()
            if b[name].elementsEqual(key) {
                guard i < n else { return nil }
                if b[i] == quote {
                    guard let value = string(), !value.1, (1...256).contains(value.0.count) else { return nil }
                    // Valid UTF-8 only: decoding with repair would turn each bad byte into a 3-byte U+FFFD and let the
                    // key grow past the bound (found by the ingest fuzz target: a 390-byte key).
                    return String(validating: b[value.0], as: UTF8.self)
                }
                let start = i
                if i < n, b[i] == UInt8(ascii: "-") { i += 1 }
                while i < n, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(b[i]) { i += 1 }
                guard i > start, i - start <= 20, (i == n && !truncated) || (i < n && [UInt8(ascii: ","), UInt8(ascii: "}"), 0x20, 0x0A, 0x0D, 0x09].contains(b[i]))
                else { return nil }
                return String(decoding: b[start..<i], as: UTF8.self)
            }
            guard skipValue() else { return nil }
            skipSpace()
            guard i < n, b[i] == UInt8(ascii: ",") else { return nil }
            i += 1
        }
    }
}
