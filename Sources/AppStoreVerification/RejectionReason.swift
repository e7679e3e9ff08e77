/// A stable, machine-readable reason code for a rejected input.
///
/// The verification core defines the codes below; other layers (entitlement mapping, worker) add their own as
/// extensions, e.g. `extension RejectionReason { static let unknownProduct = RejectionReason("UNKNOWN_PRODUCT") }`.
/// The raw value is what goes on the rejected topic's `reason` header and in `fleet verify` output.
public struct RejectionReason: RawRepresentable, Hashable, Sendable, Codable, CustomStringConvertible {
    public let rawValue: String

    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: String) { self.rawValue = rawValue }

    public var description: String { rawValue }

    public init(from decoder: any Decoder) throws {
        self.rawValue = try decoder.singleValueContainer().decode(String.self)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(rawValue)
    }

    /// Not a compact JWS (three base64url segments, JSON object header and payload), or a required field has the
    /// wrong shape, or the input is neither a JWS nor Apple's `{"signedPayload": ...}` body.
    public static let malformedJWS = RejectionReason("MALFORMED_JWS")
    /// The input (or a nested JWS) is larger than the configured `maxInputBytes`.
    public static let payloadTooLarge = RejectionReason("PAYLOAD_TOO_LARGE")
    /// Header `alg` is not exactly `ES256` (e.g. `none`, `HS256`, `ES384`).
    public static let unsupportedAlgorithm = RejectionReason("UNSUPPORTED_ALGORITHM")
    /// Header `x5c` does not hold exactly three certificates.
    public static let invalidChainLength = RejectionReason("INVALID_CHAIN_LENGTH")
    /// The chain leaf -> x5c[1] -> configured root does not verify (names, signatures, CA flag, path length,
    /// key usage, unhandled critical extension, unparseable certificate, non-P-256 leaf key).
    public static let untrustedChain = RejectionReason("UNTRUSTED_CHAIN")
    /// The leaf lacks 1.2.840.113635.100.6.11.1 or the intermediate lacks 1.2.840.113635.100.6.2.1.
    public static let missingAppleOID = RejectionReason("MISSING_APPLE_OID")
    /// A certificate of the chain (leaf, intermediate or root) is not valid at the validation time.
    public static let certificateNotValidAtTime = RejectionReason("CERTIFICATE_NOT_VALID_AT_TIME")
    /// The ES256 signature does not verify, or is not a 64-byte raw r||s value (DER signatures are invalid).
    public static let invalidSignature = RejectionReason("INVALID_SIGNATURE")
    /// The payload's bundle id differs from the configured one.
    public static let wrongBundleId = RejectionReason("WRONG_BUNDLE_ID")
    /// Production data without the configured `appAppleId`, or an `appAppleId` that differs from it.
    public static let wrongAppAppleId = RejectionReason("WRONG_APP_APPLE_ID")
    /// The payload's environment is not one of the accepted environments.
    public static let wrongEnvironment = RejectionReason("WRONG_ENVIRONMENT")
    /// `Xcode` / `LocalTesting` data (locally signed, not by Apple) while the development-only option is off.
    public static let unsignedEnvironmentRefused = RejectionReason("UNSIGNED_ENVIRONMENT_REFUSED")
    /// Kept for compatibility: legacy app receipts are verified now (see `malformedReceipt`); no longer produced.
    public static let legacyReceiptUnsupported = RejectionReason("LEGACY_RECEIPT_UNSUPPORTED")
    /// A legacy app receipt (`MI...` base64 line or `{"receipt-data": ...}` body) that is not valid base64, strict-DER
    /// CMS SignedData with one signer and embedded content, or a valid receipt attribute SET.
    public static let malformedReceipt = RejectionReason("MALFORMED_RECEIPT")
    /// A StoreKit 1 `transactionReceipt` (old-style plist with `signature` and `purchase-info`): not verified.
    public static let legacyTransactionReceiptUnsupported = RejectionReason("LEGACY_TRANSACTION_RECEIPT_UNSUPPORTED")
    /// `--revocation-check soft|hard`: the OCSP responder says the leaf or the intermediate is revoked.
    public static let certificateRevoked = RejectionReason("CERTIFICATE_REVOKED")
    /// `--revocation-check hard`: the chain's revocation status could not be established (responder down, timeout,
    /// 5xx, unknown status, unusable answer). Not a rejection: a retryable verdict (see `VerificationError.isRetryable`).
    public static let revocationStatusUnavailable = RejectionReason("REVOCATION_STATUS_UNAVAILABLE")

    /// Every code defined by the verification core, in documentation order.
    public static let verificationCodes: [RejectionReason] = [
        .malformedJWS, .payloadTooLarge, .unsupportedAlgorithm, .invalidChainLength, .untrustedChain,
        .missingAppleOID, .certificateNotValidAtTime, .invalidSignature, .wrongBundleId, .wrongAppAppleId,
        .wrongEnvironment, .unsignedEnvironmentRefused, .malformedReceipt,
        .legacyTransactionReceiptUnsupported,
    ]
}

/// Why an input was rejected: a stable code, a human detail, and (for nested JWS) which field failed.
public struct VerificationError: Error, Sendable, Hashable, CustomStringConvertible {
    public var reason: RejectionReason
    public var detail: String
    /// The nested field path that failed, e.g. `data.signedTransactionInfo`; nil for the outer JWS.
    public var field: String?

    public init(_ reason: RejectionReason, _ detail: String, field: String? = nil) {
        self.reason = reason
        self.detail = detail
        self.field = field
    }

    public init(reason: RejectionReason, detail: String, field: String? = nil) {
        self.init(reason, detail, field: field)
    }

    /// True when the input was neither verified nor rejected and must be tried again later (revocation status
    /// unavailable in `hard` mode): never publish it as rejected.
    public var isRetryable: Bool { reason == .revocationStatusUnavailable }

    public var description: String {
        if let field { return "\(reason.rawValue): \(field): \(detail)" }
        return "\(reason.rawValue): \(detail)"
    }

    /// The error re-attributed to a nested field (paths compose: `data.signedTransactionInfo`).
    func nested(in field: String) -> VerificationError {
        let path = self.field.map { "\(field).\($0)" } ?? field
        var detail = self.detail
        if self.field == nil { detail = "\(field): \(detail)" }
        return VerificationError(reason, detail, field: path)
    }
}
