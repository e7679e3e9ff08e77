import AppStoreVerification
import EntitlementDomain

/// The `jws` and `receipt` targets: the whole verify path under a fixed policy trusting the embedded test roots.
///
/// Invariants on every input: a cached and an uncached verifier give the same verdict (the chain cache never changes
/// one); a rejection carries one of the documented codes and a detail; an input over the size bound is refused with
/// `PAYLOAD_TOO_LARGE` and nothing larger than a bound is ever verified. On a verified verdict: every JWS involved
/// (outer and nested) really verifies, re-checked with swift-crypto directly on the same bytes (ES256 over
/// `header.payload` with the `x5c[0]` key, the leaf signed by `x5c[1]`, `x5c[1]` by a trusted root); a receipt's RSA
/// signature and chain likewise; the environment is an accepted one; and every event mapped from it survives
/// `decode(encode(event)) == event`.
public final class VerifyTarget: Sendable {
    public static let maxInputBytes = 16 * 1024
    public static let maxReceiptBytes = 12 * 1024

    public static let shared = VerifyTarget()

    public let policy: VerificationPolicy
    let cached: SignedDataVerifier
    let uncached: SignedDataVerifier
    let mapper = EntitlementMapper()

    init() {
        var roots: [TrustedRoot] = []
        for b64 in FuzzRoots.rootsBase64 {
            // The embedded roots are generated with the seeds (`make fuzz-seeds` writes both); they parse.
            roots.append(try! TrustedRoot(der: Reference.decodeBase64(Array(b64.utf8), url: false)!))
        }
        policy = try! VerificationPolicy(
            roots: roots, bundleId: FuzzRoots.bundleId, appAppleId: FuzzRoots.appAppleId,
            environments: [.sandbox, .production], validationTime: .signedDate,
            maxInputBytes: Self.maxInputBytes, maxReceiptBytes: Self.maxReceiptBytes)
        // A small cache, so the fuzzer also exercises eviction and keys that collide in prefix.
        cached = SignedDataVerifier(policy: policy, chainCache: ChainCache(capacity: 8), now: { FuzzRoots.now })
        uncached = SignedDataVerifier(policy: policy, chainCache: nil, now: { FuzzRoots.now })
    }

    func runJWS(_ data: UnsafeBufferPointer<UInt8>) throws(InvariantViolation) {
        try check(data, target: .jws) { (v, b) throws(VerificationError) in try v.verify(buffer: b) }
    }

    /// Raw DER: the fuzzer mutates the ASN.1 directly instead of its base64 text.
    func runReceiptDER(_ data: UnsafeBufferPointer<UInt8>) throws(InvariantViolation) {
        let der = Array(data)
        try check(data, target: .receipt) { (v, _) throws(VerificationError) in .appReceipt(try v.verifyAppReceipt(der: der)) }
    }

    private func check(
        _ data: UnsafeBufferPointer<UInt8>, target: FuzzTarget,
        _ verify: (SignedDataVerifier, UnsafeBufferPointer<UInt8>) throws(VerificationError) -> VerifiedItem
    ) throws(InvariantViolation) {
        let first: Result<VerifiedItem, VerificationError>
        do { first = .success(try verify(cached, data)) } catch { first = .failure(error) }
        let second: Result<VerifiedItem, VerificationError>
        do { second = .success(try verify(uncached, data)) } catch { second = .failure(error) }
        switch (first, second) {
        case (.success(let a), .success(let b)):
            if a != b { throw InvariantViolation(target, "cached and uncached verifiers decoded different payloads") }
            try verified(a, input: data, target: target)
        case (.failure(let a), .failure(let b)):
            if a.reason != b.reason {
                throw InvariantViolation(target, "cached verifier rejected with \(a.reason), uncached with \(b.reason)")
            }
            try rejected(a, input: data, target: target)
        case (.success, .failure(let e)):
            throw InvariantViolation(target, "verified only through the chain cache; without it: \(e)")
        case (.failure(let e), .success):
            throw InvariantViolation(target, "rejected only through the chain cache (\(e)); without it verified")
        }
    }

    private func rejected(_ e: VerificationError, input: UnsafeBufferPointer<UInt8>, target: FuzzTarget) throws(InvariantViolation) {
        if !RejectionReason.verificationCodes.contains(e.reason) {
            throw InvariantViolation(target, "undocumented reason code \(e.reason.rawValue)")
        }
        if e.detail.isEmpty { throw InvariantViolation(target, "rejection \(e.reason.rawValue) without a detail") }
        let bound = target == .receipt ? policy.maxReceiptBytes : max(policy.maxInputBytes, policy.maxReceiptBytes)
        if input.count > bound && e.reason != .payloadTooLarge {
            throw InvariantViolation(target, "an input of \(input.count) bytes (bound \(bound)) was parsed: \(e)")
        }
    }

    private func verified(_ item: VerifiedItem, input: UnsafeBufferPointer<UInt8>, target: FuzzTarget) throws(InvariantViolation) {
        if !policy.environments.contains(item.environment) {
            throw InvariantViolation(target, "verified an item of environment '\(item.environment.rawValue)'")
        }
        let text = Reference.trimmed(Array(input))
        switch item {
        case .appReceipt:
            let der: [UInt8]
            if target == .receipt {
                der = Array(input)
            } else {
                guard let b64 = Reference.receiptBase64(text), let d = Reference.decodeBase64(b64.filter { !Reference.isSpace($0) }, url: false)
                else { throw InvariantViolation(target, "verified a receipt whose base64 the reference decoder refuses") }
                if b64.count > policy.maxReceiptBytes { throw InvariantViolation(target, "verified a receipt over the bound") }
                der = d
            }
            if der.count > policy.maxReceiptBytes { throw InvariantViolation(target, "verified a receipt over the bound") }
            if let problem = CryptoRecheck.receipt(der: der, roots: policy.roots) {
                throw InvariantViolation(target, "verified receipt fails the direct re-check: \(problem)")
            }
        default:
            if text.count > policy.maxInputBytes { throw InvariantViolation(target, "verified a JWS input over the bound") }
            guard let jws = Reference.outerJWS(text) else {
                throw InvariantViolation(target, "verified an input that is neither a JWS nor a signedPayload body")
            }
            var all = [jws]
            if case .notification(let n) = item {
                let raw = n.payload.raw
                for (present, section, field) in [
                    (n.transaction != nil, "data", "signedTransactionInfo"), (n.renewalInfo != nil, "data", "signedRenewalInfo"),
                    (n.appTransaction != nil, "appData", "signedAppTransactionInfo"),
                ] where present {
                    guard let nested = raw[section]?[field]?.stringValue else {
                        throw InvariantViolation(target, "a nested \(field) was verified but is not in the payload")
                    }
                    all.append(Array(nested.utf8))
                }
            }
            for j in all {
                if j.count > policy.maxInputBytes { throw InvariantViolation(target, "verified a JWS over the bound") }
                if let problem = CryptoRecheck.jws(j, roots: policy.roots) {
                    throw InvariantViolation(target, "verified JWS fails the direct re-check: \(problem)")
                }
            }
        }
        let events: [EntitlementEvent]
        do {
            events = try mapper.events(
                for: item, source: EventSource(topic: "fuzz", partition: 0, offset: 0, kind: item.itemKind),
                verifiedAt: FuzzRoots.now)
        } catch {
            return  // a domain rejection (none with the default mapper today) is a verdict, not a fault
        }
        for event in events { try EventTarget.roundTrip(event, target: target) }
    }
}
