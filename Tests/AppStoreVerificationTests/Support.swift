import AppStoreVerification
import Foundation
import FleetTestPKI
import Testing

/// Shared test PKIs (certificate generation is cheap but not free).
enum Fixtures {
    static let pki: TestPKI = try! TestPKI()
    static let bundleId = TestPayloads.bundleId
    static let appAppleId = TestPayloads.appAppleId
    /// 2025-06-01T00:00:00Z.
    static let t0: Int64 = 1_748_736_000_000

    static func verifier(
        _ pki: TestPKI = Fixtures.pki, environments: Set<AppStoreVerification.Environment> = [.sandbox, .production],
        appAppleId: Int64? = TestPayloads.appAppleId, validationTime: ValidationTime = .signedDate,
        allowUnsigned: Bool = false, cache: ChainCache? = ChainCache(capacity: 64), maxInputBytes: Int = 64 * 1024,
        now: @escaping @Sendable () -> Int64 = SignedDataVerifier.systemNowMillis
    ) -> SignedDataVerifier {
        let policy = try! pki.policy(
            appAppleId: appAppleId, environments: environments, validationTime: validationTime,
            allowUnsignedEnvironments: allowUnsigned, maxInputBytes: maxInputBytes)
        return SignedDataVerifier(policy: policy, chainCache: cache, now: now)
    }

    static func transaction(env: AppStoreVerification.Environment = .sandbox, signedDate: Int64 = t0, bundleId: String = TestPayloads.bundleId, extra: [String: JSONValue] = [:]) -> JSONValue {
        TestPayloads.transaction(
            transactionId: "2000000000000001", purchaseDate: signedDate - 3_600_000, environment: env,
            bundleId: bundleId, signedDate: signedDate, extra: extra)
    }
}

/// Runs `body` expecting a rejection with `reason`; returns the error.
@discardableResult
func expectRejected(
    _ reason: RejectionReason, sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () throws(VerificationError) -> Void
) -> VerificationError? {
    do {
        try body()
        Issue.record("expected \(reason.rawValue), but the input verified", sourceLocation: sourceLocation)
        return nil
    } catch {
        #expect(error.reason == reason, "detail: \(error.detail)", sourceLocation: sourceLocation)
        #expect(!error.detail.isEmpty, sourceLocation: sourceLocation)
        return error
    }
}

/// Replaces one base64url character of the segment `segment` (0 header, 1 payload, 2 signature) at its middle.
func flipCharacter(_ jws: String, segment: Int, at position: Int? = nil) -> String {
    var parts = jws.split(separator: ".", omittingEmptySubsequences: false).map { Array($0.utf8) }
    let seg = parts[segment]
    let k = position ?? seg.count / 2
    let c = seg[k]
    parts[segment][k] = c == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
    return parts.map { String(decoding: $0, as: UTF8.self) }.joined(separator: ".")
}
