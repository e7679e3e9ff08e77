import Crypto
import Foundation
import SwiftASN1
import X509

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Verifies App Store signed data (JWS) exactly per `docs/verification.md`, offline, with a shared verified-chain cache.
///
/// Order of checks for every JWS: size bound; three base64url segments; header JSON and `alg == ES256`; payload JSON;
/// kind and validation time (`signedDate`, AppTransaction `receiptCreationDate`, or now); Xcode/LocalTesting refusal;
/// `x5c` of exactly three; chain leaf -> x5c[1] -> a configured root through `AppleChainVerifier` (swift-certificates'
/// `Verifier`: RFC 5280 names, signatures, CA flag, path length, critical extensions, validity; key usage; Apple marker
/// OIDs), validity of all three at the validation time (through the cache when possible); the ES256 signature (64-byte r||s); then bundle id, environment and (Production) app id.
/// Nested JWS of a notification are verified the same way; a failure names the nested field.
public final class SignedDataVerifier: Sendable {
    public let policy: VerificationPolicy
    public let chainCache: ChainCache?
    let now: @Sendable () -> Int64
    /// The configured roots' fingerprints (a handful: a cache hit's root is compared, not hashed into a set).
    let trustedFingerprints: [[UInt8]]
    /// The one chain verifier of this instance (JWS and receipt chains alike).
    let chainVerifier: AppleChainVerifier
    /// Online revocation checks (`--revocation-check`); nil: offline.
    public let revocation: RevocationChecker?

    /// - Parameters:
    ///   - chainCache: shared verified-chain cache; pass the same instance to several verifiers to share it, nil to
    ///     verify every chain from scratch.
    ///   - now: the clock (ms since the epoch), for `.now` validation and payloads without `signedDate`.
    ///   - revocation: online revocation checks of every chain (after its signature verified); nil: none.
    public init(
        policy: VerificationPolicy,
        chainCache: ChainCache? = ChainCache(capacity: 1024),
        now: @escaping @Sendable () -> Int64 = SignedDataVerifier.systemNowMillis,
        revocation: RevocationChecker? = nil
    ) {
        self.policy = policy
        self.revocation = revocation
        self.chainCache = chainCache
        self.now = now
        var fingerprints: [[UInt8]] = []
        for root in policy.roots where !fingerprints.contains(root.fingerprint) { fingerprints.append(root.fingerprint) }
        self.trustedFingerprints = fingerprints
        self.chainVerifier = AppleChainVerifier(roots: policy.roots)
    }

    public static let systemNowMillis: @Sendable () -> Int64 = { EpochMillis.now() }

    // MARK: - Public entry points

    /// Verifies any supported input: a JWS of any kind, Apple's POST body `{"signedPayload":"..."}`, a legacy app
    /// receipt (`MI...` base64 or `{"receipt-data":"..."}`); see InputForms.swift.
    public func verify(_ input: String) throws(VerificationError) -> VerifiedItem {
        try withUTF8Bytes(input) { (buf) throws(VerificationError) in try verify(buffer: buf) }
    }

    public func verify(_ input: some Collection<UInt8>) throws(VerificationError) -> VerifiedItem {
        try withContiguousBytes(input) { (buf) throws(VerificationError) in try verify(buffer: buf) }
    }

    public func verify(buffer: UnsafeBufferPointer<UInt8>) throws(VerificationError) -> VerifiedItem {
        try verifyTop(buffer, expected: nil)
    }

    public func verifyNotification(_ input: String) throws(VerificationError) -> VerifiedNotification {
        try withUTF8Bytes(input) { (buf) throws(VerificationError) in try verifyNotification(buffer: buf) }
    }

    public func verifyNotification(_ input: some Collection<UInt8>) throws(VerificationError) -> VerifiedNotification {
        try withContiguousBytes(input) { (buf) throws(VerificationError) in try verifyNotification(buffer: buf) }
    }

    public func verifyNotification(buffer: UnsafeBufferPointer<UInt8>) throws(VerificationError) -> VerifiedNotification {
        guard case .notification(let n) = try verifyTop(buffer, expected: .notification) else {
            throw VerificationError(.malformedJWS, "not a notification")
        }
        return n
    }

    public func verifyTransaction(_ input: String) throws(VerificationError) -> VerifiedTransaction {
        try withUTF8Bytes(input) { (buf) throws(VerificationError) in try verifyTransaction(buffer: buf) }
    }

    public func verifyTransaction(_ input: some Collection<UInt8>) throws(VerificationError) -> VerifiedTransaction {
        try withContiguousBytes(input) { (buf) throws(VerificationError) in try verifyTransaction(buffer: buf) }
    }

    public func verifyTransaction(buffer: UnsafeBufferPointer<UInt8>) throws(VerificationError) -> VerifiedTransaction {
        guard case .transaction(let t) = try verifyTop(buffer, expected: .transaction) else {
            throw VerificationError(.malformedJWS, "not a transaction")
        }
        return t
    }

    public func verifyRenewalInfo(_ input: String) throws(VerificationError) -> VerifiedRenewalInfo {
        try withUTF8Bytes(input) { (buf) throws(VerificationError) in try verifyRenewalInfo(buffer: buf) }
    }

    public func verifyRenewalInfo(_ input: some Collection<UInt8>) throws(VerificationError) -> VerifiedRenewalInfo {
        try withContiguousBytes(input) { (buf) throws(VerificationError) in try verifyRenewalInfo(buffer: buf) }
    }

    public func verifyRenewalInfo(buffer: UnsafeBufferPointer<UInt8>) throws(VerificationError) -> VerifiedRenewalInfo {
        guard case .renewalInfo(let r) = try verifyTop(buffer, expected: .renewalInfo) else {
            throw VerificationError(.malformedJWS, "not a renewal info")
        }
        return r
    }

    public func verifyAppTransaction(_ input: String) throws(VerificationError) -> VerifiedAppTransaction {
        try withUTF8Bytes(input) { (buf) throws(VerificationError) in try verifyAppTransaction(buffer: buf) }
    }

    public func verifyAppTransaction(_ input: some Collection<UInt8>) throws(VerificationError) -> VerifiedAppTransaction {
        try withContiguousBytes(input) { (buf) throws(VerificationError) in try verifyAppTransaction(buffer: buf) }
    }

    public func verifyAppTransaction(buffer: UnsafeBufferPointer<UInt8>) throws(VerificationError) -> VerifiedAppTransaction {
        guard case .appTransaction(let a) = try verifyTop(buffer, expected: .appTransaction) else {
            throw VerificationError(.malformedJWS, "not an AppTransaction")
        }
        return a
    }

    /// Whether a cached chain's anchoring root is one of this verifier's roots.
    @inline(__always) func isTrusted(_ rootFingerprint: [UInt8]) -> Bool { trustedFingerprints.contains(rootFingerprint) }

    // MARK: - Input classification

    @inline(__always) static func isSpace(_ c: UInt8) -> Bool { c == 0x20 || c == 0x0A || c == 0x0D || c == 0x09 }

    // verifyTop (the input forms: bare JWS, {"signedPayload"}, receipts) is in InputForms.swift.

    // MARK: - Items

    func verifyItem(_ buf: UnsafeBufferPointer<UInt8>, expected: VerifiedItem.Kind?) throws(VerificationError) -> VerifiedItem {
        let (kind, payload) = try verifyJWS(buf, expected: expected)
        switch kind {
        case .transaction:
            let t = JWSTransactionDecodedPayload(raw: payload)
            try checkBundle(payload["bundleId"], field: "bundleId")
            let env = try checkEnvironment(payload["environment"], field: "environment")
            try checkAppAppleId(nil, environment: env, present: false)
            return .transaction(VerifiedTransaction(payload: t))
        case .renewalInfo:
            _ = try checkEnvironment(payload["environment"], field: "environment")
            return .renewalInfo(VerifiedRenewalInfo(payload: JWSRenewalInfoDecodedPayload(raw: payload)))
        case .appTransaction:
            try checkBundle(payload["bundleId"], field: "bundleId")
            let env = try checkEnvironment(payload["receiptType"], field: "receiptType")
            try checkAppAppleId(payload["appAppleId"], environment: env, present: true)
            return .appTransaction(VerifiedAppTransaction(payload: AppTransaction(raw: payload)))
        case .notification:
            return .notification(try finishNotification(payload))
        case .appReceipt:
            // No JWS payload is detected as a receipt, and hasMarker refuses one expected as a receipt.
            throw VerificationError(.malformedJWS, "a JWS payload is never an app receipt")
        }
    }

    func finishNotification(_ payload: JSONValue) throws(VerificationError) -> VerifiedNotification {
        // Where the app identity lives depends on the notification's shape.
        let section: String
        let app: JSONValue
        if let d = payload["data"] {
            section = "data"
            app = d
        } else if let s = payload["summary"] {
            section = "summary"
            app = s
        } else if let a = payload["appData"] {
            section = "appData"
            app = a
        } else if let e = payload["externalPurchaseToken"] {
            section = "externalPurchaseToken"
            app = e
        } else {
            throw VerificationError(
                .malformedJWS, "notification has none of data, summary, appData, externalPurchaseToken")
        }
        guard app.objectValue != nil else {
            throw VerificationError(.malformedJWS, "\(section) must be an object", field: section)
        }
        try checkBundle(app["bundleId"], field: "\(section).bundleId")
        let env: Environment
        if section == "externalPurchaseToken" {
            env = ExternalPurchaseToken(raw: app).environment
            try checkEnvironmentValue(env, field: "externalPurchaseToken.externalPurchaseId")
        } else {
            env = try checkEnvironment(app["environment"], field: "\(section).environment")
        }
        try checkAppAppleId(app["appAppleId"], environment: env, present: true, field: "\(section).appAppleId")

        var transaction: JWSTransactionDecodedPayload?
        var renewal: JWSRenewalInfoDecodedPayload?
        var appTransaction: AppTransaction?
        if section == "data" {
            if let v = app["signedTransactionInfo"], v != .null {
                let item = try nested(v, field: "data.signedTransactionInfo", kind: .transaction)
                if case .transaction(let t) = item { transaction = t.payload }
            }
            if let v = app["signedRenewalInfo"], v != .null {
                let item = try nested(v, field: "data.signedRenewalInfo", kind: .renewalInfo)
                if case .renewalInfo(let r) = item { renewal = r.payload }
            }
        } else if section == "appData" {
            if let v = app["signedAppTransactionInfo"], v != .null {
                let item = try nested(v, field: "appData.signedAppTransactionInfo", kind: .appTransaction)
                if case .appTransaction(let a) = item { appTransaction = a.payload }
            }
        }
        return VerifiedNotification(
            payload: ResponseBodyV2DecodedPayload(raw: payload), transaction: transaction, renewalInfo: renewal,
            appTransaction: appTransaction)
    }

    func nested(_ v: JSONValue, field: String, kind: VerifiedItem.Kind) throws(VerificationError) -> VerifiedItem {
        guard let jws = v.stringValue else {
            throw VerificationError(.malformedJWS, "\(field) must be a JWS string", field: field)
        }
        do {
            return try withUTF8Bytes(jws) { (b) throws(VerificationError) in try verifyItem(b, expected: kind) }
        } catch {
            throw error.nested(in: field)
        }
    }

    // App checks (bundle id, environment, appAppleId) are in AppChecks.swift.

    // MARK: - JWS core

    static let dot = UInt8(ascii: ".")
    static let l1Tag: UInt8 = 0x48  // 'H': exact header segment
    static let l2Tag: UInt8 = 0x58  // 'X': exact x5c[0] + x5c[1] strings

    func verifyJWS(
        _ buf: UnsafeBufferPointer<UInt8>, expected: VerifiedItem.Kind?
    ) throws(VerificationError) -> (VerifiedItem.Kind, JSONValue) {
        let n = buf.count
        if n > policy.maxInputBytes {
            throw VerificationError(.payloadTooLarge, "JWS is \(n) bytes; the limit is \(policy.maxInputBytes) bytes")
        }
        // 1. Three segments (memchr: the header alone is ~4.7 KB).
        guard let base = buf.baseAddress else { throw VerificationError(.malformedJWS, "empty JWS") }
        guard let p1 = memchr(base, Int32(Self.dot), n) else {
            throw VerificationError(.malformedJWS, "a compact JWS has three '.'-separated segments; found 1")
        }
        let d1 = UnsafeRawPointer(p1) - UnsafeRawPointer(base)
        guard let p2 = memchr(base + d1 + 1, Int32(Self.dot), n - d1 - 1) else {
            throw VerificationError(.malformedJWS, "a compact JWS has three '.'-separated segments; found 2")
        }
        let d2 = UnsafeRawPointer(p2) - UnsafeRawPointer(base)
        if memchr(base + d2 + 1, Int32(Self.dot), n - d2 - 1) != nil {
            throw VerificationError(.malformedJWS, "a compact JWS has three '.'-separated segments; found more")
        }
        guard d1 > 0, d2 > d1 + 1 else { throw VerificationError(.malformedJWS, "empty JWS segment") }
        if d2 == n - 1 { try Self.rejectEmptySignature(UnsafeBufferPointer(rebasing: buf[0..<d1])) }
        let headerSeg = UnsafeBufferPointer(rebasing: buf[0..<d1])
        let payloadSeg = UnsafeBufferPointer(rebasing: buf[(d1 + 1)..<d2])
        let sigSeg = UnsafeBufferPointer(rebasing: buf[(d2 + 1)..<n])

        // 2. Header: an exact header segment already verified skips decoding entirely.
        var chain: VerifiedChain?
        var l1Key: ChainCacheKey?
        var header: [String: JSONValue]?
        if let cache = chainCache {
            let key = Self.makeKey(tag: Self.l1Tag, headerSeg)
            if let c = cache.lookup(key, countHit: true, countMiss: false), isTrusted(c.rootFingerprint) {
                chain = c
            } else {
                l1Key = key
            }
        }
        if chain == nil {
            guard let hb = Base64.decodeURL(headerSeg) else {
                throw VerificationError(.malformedJWS, "JWS header is not valid base64url")
            }
            let hv: JSONValue
            do { hv = try hb.withUnsafeBufferPointer { try JSONValue.parse($0) } } catch {
                throw VerificationError(.malformedJWS, "JWS header is not valid JSON: \(error)")
            }
            guard case .object(let h) = hv else { throw VerificationError(.malformedJWS, "JWS header is not a JSON object") }
            guard let algValue = h["alg"] else { throw VerificationError(.unsupportedAlgorithm, "JWS header has no alg") }
            guard let alg = algValue.stringValue, alg == "ES256" else {
                throw VerificationError(
                    .unsupportedAlgorithm, "alg is \(algValue.serialized()); only ES256 is accepted")
            }
            if h["crit"] != nil {
                throw VerificationError(.malformedJWS, "JWS header lists critical extensions (crit); none are supported")
            }
            header = h
        }

        // 3. Payload.
        guard let pb = Base64.decodeURL(payloadSeg) else {
            throw VerificationError(.malformedJWS, "JWS payload is not valid base64url")
        }
        let payload: JSONValue
        do { payload = try pb.withUnsafeBufferPointer { try JSONValue.parse($0) } } catch {
            throw VerificationError(.malformedJWS, "JWS payload is not valid JSON: \(error)")
        }
        guard case .object(let obj) = payload else {
            throw VerificationError(.malformedJWS, "JWS payload is not a JSON object")
        }
        let detected: VerifiedItem.Kind
        if let expected {
            // The caller knows the kind (as with Apple's per-kind calls): a member another kind also has (a renewal
            // info with a receiptType) does not change it; only the strong markers (notificationType, transactionId)
            // of another kind refuse it.
            if let other = Self.strongKind(obj), other != expected {
                throw VerificationError(.malformedJWS, "payload is a \(other.rawValue), expected a \(expected.rawValue)")
            }
            guard Self.hasMarker(obj, of: expected) else {
                throw VerificationError(.malformedJWS, "payload is not a \(expected.rawValue) (no \(Self.markerNames(expected)))")
            }
            detected = expected
        } else {
            guard let kind = Self.detectKind(obj) else {
                throw VerificationError(
                    .malformedJWS,
                    "payload is not a notification, transaction, renewal info or AppTransaction (no notificationType, "
                        + "transactionId, receiptCreationDate, appTransactionId or originalTransactionId)")
            }
            detected = kind
        }

        // 4. Validation time, read before the signature and bound by it afterwards.
        let validationTime: Int64
        switch policy.validationTime {
        case .now:
            validationTime = now()
        case .signedDate:
            // signedDate, or for an AppTransaction without one its receiptCreationDate (Apple's libraries' order).
            let hasSignedDate = obj["signedDate"].map { $0 != .null } ?? false
            let field = detected == .appTransaction && !hasSignedDate ? "receiptCreationDate" : "signedDate"
            if let v = obj[field], v != .null {
                guard let t = v.int64Value else {
                    throw VerificationError(.malformedJWS, "\(field) must be an integer (ms since the epoch)")
                }
                validationTime = t
            } else {
                validationTime = now()
            }
        }

        // 5. Locally signed environments never reach the cryptography.
        if let env = try Self.environmentOf(kind: detected, obj), env.isUnsigned {
            if !policy.allowUnsignedEnvironments {
                throw VerificationError(
                    .unsignedEnvironmentRefused,
                    "environment \(env.rawValue) is signed locally, not by Apple; refused (development-only option "
                        + "allowUnsignedEnvironments is off)")
            }
            return (detected, payload)
        }

        // 6. Chain.
        if chain == nil, let header {
            guard let x5cValue = header["x5c"] else {
                throw VerificationError(.invalidChainLength, "JWS header has no x5c; exactly 3 certificates are required")
            }
            guard let x5c = x5cValue.arrayValue else { throw VerificationError(.malformedJWS, "x5c must be an array") }
            guard x5c.count == 3 else {
                throw VerificationError(
                    .invalidChainLength, "x5c holds \(x5c.count) certificate(s); exactly 3 are required")
            }
            guard let leafB64 = x5c[0].stringValue, let interB64 = x5c[1].stringValue, x5c[2].stringValue != nil else {
                throw VerificationError(.malformedJWS, "x5c entries must be base64 strings")
            }
            if let cache = chainCache {
                var keyBytes: [UInt8] = [Self.l2Tag]
                keyBytes.reserveCapacity(leafB64.utf8.count + interB64.utf8.count + 2)
                keyBytes.append(contentsOf: leafB64.utf8)
                keyBytes.append(0)
                keyBytes.append(contentsOf: interB64.utf8)
                let l2Key = ChainCacheKey(bytes: keyBytes)
                if let c = cache.lookup(l2Key, countHit: true, countMiss: true), isTrusted(c.rootFingerprint) {
                    chain = c
                } else {
                    let c = try verifyChain(leafB64: leafB64, interB64: interB64, validationTime: validationTime)
                    cache.insert(l2Key, c)
                    chain = c
                }
                if let l1Key, let chain { cache.insert(l1Key, chain) }
            } else {
                chain = try verifyChain(leafB64: leafB64, interB64: interB64, validationTime: validationTime)
            }
        }
        guard let chain else { throw VerificationError(.untrustedChain, "no verified chain") }

        // 7. Validity of the whole chain at the validation time.
        if !chain.isValid(atMillis: validationTime) {
            throw VerificationError(
                .certificateNotValidAtTime,
                "validation time \(Self.iso(validationTime)) is outside the chain's validity "
                    + "[\(Self.iso(chain.notBeforeMillis)), \(Self.iso(chain.notAfterMillis))]")
        }

        // 8. ES256 signature over header.payload.
        guard let sig = Base64.decodeURL(sigSeg) else {
            throw VerificationError(.malformedJWS, "JWS signature is not valid base64url")
        }
        guard sig.count == 64 else {
            throw VerificationError(
                .invalidSignature,
                "signature is \(sig.count) bytes; ES256 requires a 64-byte raw r||s value (DER signatures are invalid)")
        }
        let signature: P256.Signing.ECDSASignature
        do { signature = try P256.Signing.ECDSASignature(rawRepresentation: sig) } catch {
            throw VerificationError(.invalidSignature, "signature is not a valid P-256 r||s value")
        }
        let signingInput = UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: buf[0..<d2]))
        guard let leafKey = chain.leafKey, leafKey.isValidSignature(signature, for: SHA256.hash(data: signingInput)) else {
            throw VerificationError(.invalidSignature, "ES256 signature does not verify with the leaf certificate's key")
        }
        // 9. Revocation (opt-in): only for a signature that verified, so forgeries never cost a responder query.
        if let revocation { try revocation.check(chain) }
        return (detected, payload)
    }

    static func makeKey(tag: UInt8, _ seg: UnsafeBufferPointer<UInt8>) -> ChainCacheKey {
        let bytes = [UInt8](unsafeUninitializedCapacity: seg.count + 1) { dst, initialized in
            dst[0] = tag
            if let base = seg.baseAddress, seg.count > 0 {
                (dst.baseAddress! + 1).update(from: base, count: seg.count)
            }
            initialized = seg.count + 1
        }
        return ChainCacheKey(bytes: bytes)
    }

    static func detectKind(_ o: [String: JSONValue]) -> VerifiedItem.Kind? {
        if let kind = strongKind(o) { return kind }
        if o["receiptCreationDate"] != nil || o["receiptType"] != nil { return .appTransaction }
        if o["originalTransactionId"] != nil { return .renewalInfo }
        if o["appTransactionId"] != nil { return .appTransaction }
        return nil
    }

    /// The kinds whose marker no other kind carries: a notification (notificationType), a transaction (transactionId).
    static func strongKind(_ o: [String: JSONValue]) -> VerifiedItem.Kind? {
        if o["notificationType"] != nil { return .notification }
        if o["transactionId"] != nil { return .transaction }
        return nil
    }

    /// The members that mark each kind. Built once: `hasMarker` runs for every JWS whose kind the caller names.
    static let markerTable: [VerifiedItem.Kind: [String]] = [
        .notification: ["notificationType"],
        .transaction: ["transactionId"],
        .renewalInfo: ["originalTransactionId"],
        .appTransaction: ["receiptCreationDate", "receiptType", "appTransactionId"],
        .appReceipt: [],
    ]

    static func markers(_ kind: VerifiedItem.Kind) -> [String] { markerTable[kind] ?? [] }

    static func hasMarker(_ o: [String: JSONValue], of kind: VerifiedItem.Kind) -> Bool {
        markers(kind).contains { o[$0] != nil }
    }

    static func markerNames(_ kind: VerifiedItem.Kind) -> String { markers(kind).joined(separator: ", ") }

    static func environmentOf(kind: VerifiedItem.Kind, _ o: [String: JSONValue]) throws(VerificationError) -> Environment? {
        func read(_ v: JSONValue?, _ field: String) throws(VerificationError) -> Environment? {
            guard let v, v != .null else { return nil }
            guard let s = v.stringValue else { throw VerificationError(.malformedJWS, "\(field) must be a string") }
            return Environment(s)
        }
        switch kind {
        case .transaction, .renewalInfo: return try read(o["environment"], "environment")
        case .appTransaction: return try read(o["receiptType"], "receiptType")
        case .appReceipt: return nil
        case .notification:
            for section in ["data", "summary", "appData"] {
                if let s = o[section]?.objectValue { return try read(s["environment"], "\(section).environment") }
            }
            return nil
        }
    }

    static func iso(_ ms: Int64) -> String {
        EpochMillis.date(ms).formatted(.iso8601)
    }

    // MARK: - Chain verification (cache miss)

    /// Decodes `x5c[0]` and `x5c[1]` and verifies leaf -> intermediate -> a configured root through the shared
    /// `AppleChainVerifier` (swift-certificates' `Verifier`: RFC 5280 at the validation time, key usage, Apple's
    /// marker OIDs). `x5c[2]` is never used: the anchor is always a configured root. ES256 needs a P-256 leaf key.
    func verifyChain(leafB64: String, interB64: String, validationTime: Int64) throws(VerificationError) -> VerifiedChain {
        guard let leafDER = Base64.decodeStandard(leafB64) else {
            throw VerificationError(.malformedJWS, "x5c[0] is not valid base64")
        }
        guard let interDER = Base64.decodeStandard(interB64) else {
            throw VerificationError(.malformedJWS, "x5c[1] is not valid base64")
        }
        let leaf: Certificate
        let inter: Certificate
        do { leaf = try Certificate(derEncoded: leafDER) } catch {
            throw VerificationError(.untrustedChain, "x5c[0] is not a valid X.509 certificate: \(Self.certificateError(error))")
        }
        do { inter = try Certificate(derEncoded: interDER) } catch {
            throw VerificationError(.untrustedChain, "x5c[1] is not a valid X.509 certificate: \(Self.certificateError(error))")
        }
        let r = try chainVerifier.verify(leaf: leaf, intermediates: [inter], validationTime: validationTime)
        guard r.certificates.count == 3 else {
            throw VerificationError(
                .untrustedChain, "the path has \(r.certificates.count) certificates; leaf, x5c[1] and a root are required")
        }
        guard let leafKey = P256.Signing.PublicKey(leaf.publicKey) else {
            throw VerificationError(.untrustedChain, "leaf key is not a P-256 key (ES256 requires P-256)")
        }
        return VerifiedChain(
            leafKey: leafKey, notBeforeMillis: r.notBeforeMillis, notAfterMillis: r.notAfterMillis,
            rootFingerprint: r.anchor.fingerprint, certificates: r.certificates)
    }
}

extension SignedDataVerifier {
    /// Why a certificate did not parse, for a rejection's detail: the same text for the same input. swift-crypto's
    /// `underlyingCoreCryptoError(error:)` carries BoringSSL's packed error code, which also depends on what the
    /// thread's error queue held before (two verifiers of one mutated receipt reported 67108968 and 100663398), so it
    /// is named without the code.
    static func certificateError(_ error: any Error) -> String {
        if let crypto = error as? CryptoKitError, case .underlyingCoreCryptoError = crypto {
            return "swift-crypto could not parse a key in it"
        }
        return "\(error)"
    }
}
