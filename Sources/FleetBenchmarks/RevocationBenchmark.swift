import AppStoreVerification
import FleetTestPKI
import Foundation

/// `fleet bench verify --revocation-check soft|hard`: transactions per second with online revocation checks (warm
/// answer cache, real `openssl ocsp` responders on 127.0.0.1) against the offline verifier, interleaved in the same
/// run on the same chain. Target: revocation_transactions_per_s >= 0.9 x offline_transactions_per_s.
public enum RevocationBenchmark {
    public struct Result: Sendable, Codable {
        public var revocation_check: String
        public var threads: Int
        public var offline_transactions_per_s: Double
        public var revocation_transactions_per_s: Double
        /// revocation_transactions_per_s / offline_transactions_per_s (target >= 0.9).
        public var revocation_vs_offline: Double
        /// Requests the responders answered during the whole run (warm-up included): one per certificate.
        public var ocsp_requests: Int
        public var revocation_target_met: Bool
    }

    /// - Parameter fetch: sends an OCSP request (the production HTTP fetcher, `FleetRevocation.OCSPHTTPFetcher`).
    public static func run(
        mode: RevocationSettings.Mode, seconds: Double, threads: Int, fetch: @escaping OCSPFetch
    ) throws -> Result {
        let pki = try RevocationTestPKI()
        defer { pki.stop() }
        let now = TestPayloads.nowMillis()
        let transactions: [[UInt8]] = (0..<64).map { k in
            Array(pki.good.sign(TestPayloads.transaction(
                transactionId: String(2_000_000_000_000_000 + k), purchaseDate: now - 86_400_000,
                environment: .production, signedDate: now)).utf8)
        }
        let policy = try pki.good.policy(environments: [.production])
        let offline = SignedDataVerifier(policy: policy, chainCache: ChainCache())
        let cache = RevocationCache(settings: RevocationSettings(mode: mode), fetch: fetch)
        let online = SignedDataVerifier(policy: policy, chainCache: ChainCache(), revocation: RevocationChecker(cache: cache))
        // Warm both (the online one fetches the leaf's and the intermediate's answers once).
        _ = try offline.verify(transactions[0])
        _ = try online.verify(transactions[0])
        let threads = max(1, threads)
        let offlineOp: @Sendable (Int) -> Bool = { i in (try? offline.verify(transactions[i % transactions.count])) != nil }
        let onlineOp: @Sendable (Int) -> Bool = { i in (try? online.verify(transactions[i % transactions.count])) != nil }
        var a = VerifyBenchmark.Tally(), b = VerifyBenchmark.Tally()
        let slice = 0.25
        for _ in 0..<max(1, Int((seconds / slice).rounded())) {
            a.add(VerifyBenchmark.measure(seconds: slice, threads: threads, offlineOp))
            b.add(VerifyBenchmark.measure(seconds: slice, threads: threads, onlineOp))
        }
        let ratio = a.rate > 0 ? VerifyBenchmark.round3(b.rate / a.rate) : 0
        return Result(
            revocation_check: mode.rawValue, threads: threads, offline_transactions_per_s: a.rate,
            revocation_transactions_per_s: b.rate, revocation_vs_offline: ratio,
            ocsp_requests: pki.leafResponder.requestCount + pki.rootResponder.requestCount,
            revocation_target_met: ratio >= 0.9)
    }
}
