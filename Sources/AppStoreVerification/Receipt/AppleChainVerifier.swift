import Dispatch
import Foundation
import SwiftASN1
@_spi(FixedExpiryValidationTime) import X509

/// Apple's marker-extension rule, as a swift-certificates `VerifierPolicy`.
///
/// The rule (checked on the real App Store receipts and on App Store JWS chains):
/// - the leaf (the signer: "Mac App Store and iTunes Store Receipt Signing", "Mac App Store Receipt Signing", or the
///   JWS "Prod ECC Mac App Store and iTunes Store Receipt Signing") carries 1.2.840.113635.100.6.11.1;
/// - the certificate directly above it (an "Apple Worldwide Developer Relations Certification Authority", G1 or G5,
///   for receipts; the WWDR G6 for JWS) carries 1.2.840.113635.100.6.2.1;
/// - the root is the configured anchor and carries neither (Apple Root CA does not).
/// Both extensions are declared handled, so a chain that marks them critical still validates.
public struct AppleMarkerOIDPolicy: VerifierPolicy {
    public static let leafOID: ASN1ObjectIdentifier = [1, 2, 840, 113635, 100, 6, 11, 1]
    public static let intermediateOID: ASN1ObjectIdentifier = [1, 2, 840, 113635, 100, 6, 2, 1]
    /// Prefix of every failure reason of this policy (how a failure is told apart from RFC 5280's).
    public static let failurePrefix = "AppleMarkerOIDPolicy:"

    public init() {}

    public let verifyingCriticalExtensions: [ASN1ObjectIdentifier] = [Self.leafOID, Self.intermediateOID]

    public func chainMeetsPolicyRequirements(chain: UnverifiedCertificateChain) -> PolicyEvaluationResult {
        guard chain.count >= 3 else {
            return .failsToMeetPolicy(
                reason: "\(Self.failurePrefix) chain has \(chain.count) certificate(s); leaf, intermediate and root are required")
        }
        if chain.leaf.extensions[oid: Self.leafOID] == nil {
            return .failsToMeetPolicy(reason: "\(Self.failurePrefix) leaf lacks Apple's marker extension 1.2.840.113635.100.6.11.1")
        }
        if chain[1].extensions[oid: Self.intermediateOID] == nil {
            return .failsToMeetPolicy(
                reason: "\(Self.failurePrefix) intermediate lacks Apple's marker extension 1.2.840.113635.100.6.2.1")
        }
        return .meetsPolicy
    }
}

/// Key usage where present (RFC 5280 §4.2.1.3; swift-certificates' `RFC5280Policy` does not enforce it): the leaf
/// must allow digitalSignature, every certificate above it keyCertSign.
public struct SigningKeyUsagePolicy: VerifierPolicy {
    public init() {}
    public let verifyingCriticalExtensions: [ASN1ObjectIdentifier] = []

    public func chainMeetsPolicyRequirements(chain: UnverifiedCertificateChain) -> PolicyEvaluationResult {
        for (i, cert) in chain.enumerated() {
            let ku: KeyUsage?
            do { ku = try cert.extensions.keyUsage } catch {
                return .failsToMeetPolicy(reason: "\(cert.subject) has an invalid keyUsage extension")
            }
            guard let ku else { continue }
            if i == 0 && !ku.digitalSignature {
                return .failsToMeetPolicy(reason: "leaf key usage does not allow digitalSignature")
            }
            if i > 0 && !ku.keyCertSign {
                return .failsToMeetPolicy(reason: "\(cert.subject) key usage does not allow keyCertSign")
            }
        }
        return .meetsPolicy
    }
}

/// Chain verification for App Store signed data through swift-certificates' `Verifier`: RFC 5280
/// (`RFC5280Policy` at a fixed validation time: signatures, names, CA flags, path length, critical extensions,
/// validity of every certificate) plus `SigningKeyUsagePolicy` and `AppleMarkerOIDPolicy`, anchored at the policy's configured roots.
///
/// Key-type neutral (it returns the leaf's `Certificate.PublicKey`): one verifier for JWS (`x5c`) and receipt chains.
/// Failures map onto the core's reason codes: no path to a configured root or an RFC 5280 failure ->
/// `UNTRUSTED_CHAIN`; a validity failure -> `CERTIFICATE_NOT_VALID_AT_TIME`; the marker rule -> `MISSING_APPLE_OID`.
public struct AppleChainVerifier: Sendable {
    public struct Result: Sendable {
        public let leafKey: Certificate.PublicKey
        public let anchor: TrustedRoot
        /// The verified path, leaf first, the configured root last.
        public let certificates: [Certificate]
        /// The intersection of every certificate's validity window, ms since the epoch (inclusive).
        public let notBeforeMillis: Int64
        public let notAfterMillis: Int64
    }

    public let roots: [TrustedRoot]

    public init(roots: [TrustedRoot]) { self.roots = roots }

    /// Verifies `leaf` through `intermediates` to a configured root at `validationTime` (ms since the epoch).
    public func verify(
        leaf: Certificate, intermediates: [Certificate], validationTime: Int64
    ) throws(VerificationError) -> Result {
        let date = EpochMillis.date(validationTime)
        let rootCerts = roots.map(\.certificate)
        let outcome = SyncBridge.run {
            var verifier = Verifier(rootCertificates: CertificateStore(rootCerts)) {
                RFC5280Policy(fixedExpiryValidationTime: date)
                SigningKeyUsagePolicy()
                AppleMarkerOIDPolicy()
            }
            return await verifier.validate(leaf: leaf, intermediates: CertificateStore(intermediates))
        }
        switch outcome {
        case .validCertificate(let chain):
            let certs = Array(chain)
            guard let top = certs.last, let anchor = roots.first(where: { $0.certificate == top }) else {
                throw VerificationError(.untrustedChain, "the verified chain does not end at a configured root")
            }
            var notBefore = Int64.min
            var notAfter = Int64.max
            for c in certs {
                notBefore = max(notBefore, EpochMillis.millis(c.notValidBefore))
                notAfter = min(notAfter, EpochMillis.millis(c.notValidAfter))
            }
            return Result(
                leafKey: leaf.publicKey, anchor: anchor, certificates: certs, notBeforeMillis: notBefore,
                notAfterMillis: notAfter)
        case .couldNotValidate(let failures):
            throw Self.map(failures, leaf: leaf, intermediates: intermediates, date: date)
        }
    }

    /// Critical extensions the policies above handle (RFC 5280's and the marker OIDs).
    static let handledCritical: Set<ASN1ObjectIdentifier> = [
        [2, 5, 29, 19], [2, 5, 29, 15], [2, 5, 29, 30], [2, 5, 29, 17], [2, 5, 29, 37],
        AppleMarkerOIDPolicy.leafOID, AppleMarkerOIDPolicy.intermediateOID,
    ]

    /// The most specific reason among the candidate chains' failures (a chain that reached a root was built).
    static func map(
        _ failures: [CertificateValidationResult.PolicyFailure], leaf: Certificate, intermediates: [Certificate], date: Date
    ) -> VerificationError {
        if failures.isEmpty {
            // The Verifier builds no chain through a certificate with a critical extension no policy handles.
            for (cert, name) in [(leaf, "leaf")] + intermediates.map({ ($0, "intermediate \($0.subject)") }) {
                for ext in cert.extensions where ext.critical && !Self.handledCritical.contains(ext.oid) {
                    return VerificationError(.untrustedChain, "\(name) has an unhandled critical extension \(ext.oid)")
                }
            }
            return VerificationError(
                .untrustedChain,
                "no chain from the leaf (\(leaf.subject)) through the given intermediate certificates (JWS x5c[1], "
                    + "receipt SignedData certificates) to a configured root certificate (leaf issuer \(leaf.issuer))")
        }
        // The marker rule speaks only for a full path (leaf, intermediate, root); a shorter one (an intermediate
        // configured as a root) is untrusted.
        for f in failures
        where f.chain.count >= 3 && f.policyFailureReason.description.hasPrefix(AppleMarkerOIDPolicy.failurePrefix) {
            return VerificationError(.missingAppleOID, String(f.policyFailureReason.description.dropFirst(AppleMarkerOIDPolicy.failurePrefix.count + 1)))
        }
        for f in failures {
            for c in f.chain where date < c.notValidBefore || date > c.notValidAfter {
                return VerificationError(
                    .certificateNotValidAtTime,
                    "validation time \(date.formatted(.iso8601)) is outside the validity of \(c.subject) "
                        + "[\(c.notValidBefore.formatted(.iso8601)), \(c.notValidAfter.formatted(.iso8601))]")
            }
        }
        return VerificationError(.untrustedChain, "chain rejected: \(failures[0].policyFailureReason)")
    }
}

/// Runs an async computation to completion from synchronous code, on a task executor of its own (a concurrent
/// dispatch queue: a task runs one job at a time, several callers' tasks run side by side), so a caller blocked on a
/// cooperative-pool thread never waits for that pool. Used only on chain-cache misses (swift-certificates' `Verifier`
/// is async; it never suspends on in-memory certificate stores) and on revocation-status misses (OCSP).
enum SyncBridge {
    final class QueueExecutor: TaskExecutor, @unchecked Sendable {
        let queue = DispatchQueue(label: "AppStoreVerification.chain-verifier", attributes: .concurrent)
        func enqueue(_ job: consuming ExecutorJob) {
            let job = UnownedJob(job)
            let executor = asUnownedTaskExecutor()
            queue.async { job.runSynchronously(on: executor) }
        }
    }

    static let executor = QueueExecutor()

    final class Box<T: Sendable>: @unchecked Sendable {
        var value: T?
    }

    static func run<T: Sendable>(_ body: @escaping @Sendable () async -> T) -> T {
        let box = Box<T>()
        let done = DispatchSemaphore(value: 0)
        Task(executorPreference: executor) {
            box.value = await body()
            done.signal()
        }
        done.wait()
        return box.value!
    }
}
