import AppStoreVerification
import Crypto
import FleetTestPKI
import Foundation
import _CryptoExtras

/// The receipt part of `fleet bench verify`: full verification of a generated 4-entry app receipt (warm chain cache)
/// against the raw operation it cannot avoid, swift-crypto's (BoringSSL) RSA-2048 PKCS#1 v1.5 SHA-256 verify of the
/// same content with the same key, interleaved in short slices on the same threads.
public enum ReceiptBenchmark {
    public struct Result: Sendable, Codable {
        public var receipts_per_s: Double
        public var raw_rsa_verifies_per_s: Double
        /// receipts_per_s / raw_rsa_verifies_per_s (target >= 0.7).
        public var receipts_vs_raw_rsa: Double
        /// Size of one benchmark receipt, base64.
        public var receipt_bytes: Int
    }

    public struct Workload: Sendable {
        public let pki: TestReceiptPKI
        public let receipts: [[UInt8]]
        public let contents: [[UInt8]]
        public let signatures: [_RSA.Signing.RSASignature]
        public let policy: VerificationPolicy

        public init(count: Int = 16) throws {
            let pki = try TestReceiptPKI()
            self.pki = pki
            let now = TestPayloads.nowMillis()
            var receipts: [[UInt8]] = []
            var contents: [[UInt8]] = []
            var signatures: [_RSA.Signing.RSASignature] = []
            for k in 0..<count {
                let receipt = TestReceipt(
                    receiptType: "ProductionSandbox", creationDate: now,
                    inApp: (0..<4).map { i in
                        TestReceipt.InApp(
                            productId: "com.example.coins", transactionId: String(3_000_000_000_000_000 + k * 4 + i),
                            purchaseDate: now - Int64(i) * 60_000, productType: 1)
                    })
                let content = try receipt.contentDER()
                receipts.append(Array(Base64.encodeStandard(try pki.sign(content: content)).utf8))
                contents.append(content)
                signatures.append(try pki.leafKey.signature(for: SHA256.hash(data: content), padding: .insecurePKCS1v1_5))
            }
            self.receipts = receipts
            self.contents = contents
            self.signatures = signatures
            self.policy = try pki.policy(environments: [.sandbox])
        }
    }

    public static func run(workload w: Workload, seconds: Double, threads: Int, cache: ChainCache) -> Result {
        let threads = max(1, threads)
        let verifier = SignedDataVerifier(policy: w.policy, chainCache: cache)
        _ = try? verifier.verify(w.receipts[0])  // warm the cache
        let key = w.pki.leafKey.publicKey
        let rawOp: @Sendable (Int) -> Bool = { i in
            let k = i % w.contents.count
            return key.isValidSignature(w.signatures[k], for: SHA256.hash(data: w.contents[k]), padding: .insecurePKCS1v1_5)
        }
        let receiptOp: @Sendable (Int) -> Bool = { i in (try? verifier.verify(w.receipts[i % w.receipts.count])) != nil }
        let slice = 0.25
        var raw = VerifyBenchmark.Tally(), receipts = VerifyBenchmark.Tally()
        for _ in 0..<max(1, Int((seconds / slice).rounded())) {
            raw.add(VerifyBenchmark.measure(seconds: slice, threads: threads, rawOp))
            receipts.add(VerifyBenchmark.measure(seconds: slice, threads: threads, receiptOp))
        }
        return Result(
            receipts_per_s: receipts.rate, raw_rsa_verifies_per_s: raw.rate,
            receipts_vs_raw_rsa: raw.rate > 0 ? VerifyBenchmark.round3(receipts.rate / raw.rate) : 0,
            receipt_bytes: w.receipts[0].count)
    }
}
