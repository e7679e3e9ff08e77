import Foundation
import SwiftASN1
import Synchronization
@_spi(FixedExpiryValidationTime) import X509

/// How fresh a verified chain's revocation answers are (one per cached chain, shared by every copy of the entry).
/// The hot path reads one atomic: a chain is used without any revocation work while `goodUntil` is ahead.
public final class RevocationStamp: Sendable {
    let goodUntil = Atomic<Int64>(Int64.min)
    let refreshAt = Atomic<Int64>(Int64.min)
    /// `soft` mode: the status could not be established; inputs verify unchecked until then (and are counted).
    let uncheckedUntil = Atomic<Int64>(Int64.min)
    let refreshing = Atomic<Bool>(false)

    public init() {}
}

/// Online revocation checks of verified chains (OCSP, RFC 6960), through swift-certificates' `OCSPVerifierPolicy`
/// (response signature, responder authorisation, thisUpdate/nextUpdate, the CertID match) over a shared
/// `RevocationCache`. Verdicts: good -> nothing; revoked (leaf or intermediate) -> `CERTIFICATE_REVOKED`; status not
/// established (responder down, timeout, 5xx, unknown, unusable answer) -> `soft`: verified and reported
/// (`RevocationEvent.unchecked`), `hard`: `REVOCATION_STATUS_UNAVAILABLE`, a retryable verdict, never a rejection.
public final class RevocationChecker: Sendable {
    public let cache: RevocationCache
    public var mode: RevocationSettings.Mode { cache.settings.mode }
    static let revokedPrefix = "revoked through OCSP"

    public init(cache: RevocationCache) { self.cache = cache }

    enum Evaluation: Sendable {
        case good(until: Int64, refreshAt: Int64)
        case revoked(String)
        case unavailable(String)
    }

    /// Checks `chain` (a no-op for `off` and for a chain without its certificates). Waits for responders only when
    /// the chain's answers are missing or expired; answers close to expiry are refreshed in the background.
    public func check(_ chain: VerifiedChain) throws(VerificationError) {
        let mode = self.mode
        guard mode != .off, chain.certificates.count >= 2 else { return }
        let stamp = chain.revocation
        let t = cache.now()
        if t < stamp.goodUntil.load(ordering: .relaxed) {
            if t >= stamp.refreshAt.load(ordering: .relaxed) { refreshInBackground(chain) }
            return
        }
        if mode == .soft && t < stamp.uncheckedUntil.load(ordering: .relaxed) {
            cache.observe(.unchecked(detail: "revocation status unavailable (retried after a pause)"))
            return
        }
        let certificates = chain.certificates
        let outcome = SyncBridge.run { await self.evaluate(certificates, refresh: false) }
        try settle(outcome, stamp: stamp, at: t)
    }

    private func settle(_ outcome: Evaluation, stamp: RevocationStamp, at t: Int64) throws(VerificationError) {
        switch outcome {
        case .good(let until, let refreshAt):
            stamp.refreshAt.store(refreshAt, ordering: .relaxed)
            stamp.goodUntil.store(until, ordering: .relaxed)
        case .revoked(let detail):
            cache.observe(.revoked(detail: detail))
            throw VerificationError(.certificateRevoked, detail)
        case .unavailable(let detail):
            if mode == .soft {
                stamp.uncheckedUntil.store(t + cache.settings.failureRetryMillis, ordering: .relaxed)
                cache.observe(.unchecked(detail: detail))
                return
            }
            cache.observe(.unavailable(detail: detail))
            throw VerificationError(.revocationStatusUnavailable, detail)
        }
    }

    private func refreshInBackground(_ chain: VerifiedChain) {
        let stamp = chain.revocation
        guard stamp.refreshing.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged
        else { return }
        let certificates = chain.certificates
        Task(executorPreference: SyncBridge.executor) {
            let outcome = await self.evaluate(certificates, refresh: true)
            switch outcome {
            case .good(let until, let refreshAt):
                stamp.refreshAt.store(refreshAt, ordering: .relaxed)
                stamp.goodUntil.store(until, ordering: .relaxed)
            case .revoked:
                // Revoked since: the next input re-evaluates in the foreground (and is rejected).
                stamp.goodUntil.store(Int64.min, ordering: .relaxed)
            case .unavailable:
                // Keep the still-valid answers; try again after the failure pause.
                stamp.refreshAt.store(self.cache.now() + self.cache.settings.failureRetryMillis, ordering: .relaxed)
            }
            stamp.refreshing.store(false, ordering: .releasing)
        }
    }

    /// One run of swift-certificates' `Verifier` with `OCSPVerifierPolicy` alone (hard failure mode: every failure is
    /// reported, then classified here) over the already verified path, its requests answered by the cache.
    func evaluate(_ certificates: [Certificate], refresh: Bool) async -> Evaluation {
        let t = cache.now()
        guard let leaf = certificates.first, let root = certificates.last else { return .unavailable("empty chain") }
        let requester = CachedOCSPRequester(cache: cache, refresh: refresh)
        let date = EpochMillis.date(t)
        let critical = Array(Set(certificates.flatMap { $0.extensions.filter(\.critical).map(\.oid) }))
        var verifier = Verifier(rootCertificates: CertificateStore([root])) {
            AlreadyVerified(verifyingCriticalExtensions: critical)
            OCSPVerifierPolicy(failureMode: .hard, requester: requester, fixedExpiryValidationTime: date)
        }
        let result = await verifier.validate(
            leaf: leaf, intermediates: CertificateStore(Array(certificates.dropFirst().dropLast())))
        switch result {
        case .validCertificate:
            let until = requester.served.withLock { $0.expires } ?? (t + cache.settings.maxAgeMillis)
            let lifetime = max(0, until - t)
            return .good(until: until, refreshAt: until - max(1, Int64(Double(lifetime) * cache.settings.refreshFraction)))
        case .couldNotValidate(let failures):
            let reasons = failures.map(\.policyFailureReason.description)
            if let revoked = reasons.first(where: { $0.hasPrefix(Self.revokedPrefix) }) { return .revoked(revoked) }
            cache.demote(requester.served.withLock { $0.requests })
            return .unavailable(reasons.first ?? "no path to the root for the revocation check")
        }
    }
}

/// The path was verified already (`AppleChainVerifier`): its critical extensions were handled there.
struct AlreadyVerified: VerifierPolicy {
    let verifyingCriticalExtensions: [ASN1ObjectIdentifier]
    func chainMeetsPolicyRequirements(chain: UnverifiedCertificateChain) -> PolicyEvaluationResult { .meetsPolicy }
}

/// The `OCSPRequester` the policy talks to: every query goes through the shared cache; it records what it served
/// (the earliest expiry is how long the chain's verdict may be reused).
struct CachedOCSPRequester: OCSPRequester {
    struct Served: Sendable {
        var expires: Int64?
        var requests: [[UInt8]] = []
    }

    struct Unavailable: Error, CustomStringConvertible {
        let kind: String
        let detail: String
        var description: String { "OCSP responder \(kind): \(detail)" }
    }

    final class Log: Sendable {
        let state = Mutex(Served())
        func withLock<T>(_ body: (inout Served) -> T) -> T { state.withLock { body(&$0) } }
    }

    let cache: RevocationCache
    let refresh: Bool
    let served = Log()

    init(cache: RevocationCache, refresh: Bool) {
        self.cache = cache
        self.refresh = refresh
    }

    func query(request: [UInt8], uri: String) async -> OCSPRequesterQueryResult {
        let (result, expires) = await cache.answer(request: request, uri: uri, refresh: refresh)
        served.withLock { s in
            s.expires = min(s.expires ?? .max, expires)
            s.requests.append(request)
        }
        switch result {
        case .response(let bytes): return .response(bytes)
        case .failure(let kind, let detail): return .terminalError(Unavailable(kind: kind, detail: detail))
        }
    }
}
