import AppStoreVerification
import FleetTestPKI
import Foundation
import Testing

/// StoreKit 1 transaction receipts: verified with their issuer configured as a trusted intermediate, refused with
/// their own code without it; generated ones from an Apple-shaped test PKI, and the real one when the fixtures are there.
@Suite struct TransactionReceipts {
    static let pki: TestTransactionReceiptPKI = try! TestTransactionReceiptPKI()
    static let t0: Int64 = 1_760_000_000_000

    static func info(_ id: String = "1000000181298734", product: String = "com.example.coins", bundle: String = TestPayloads.bundleId,
                     appItemId: Int64? = nil) -> [UInt8] {
        TestTransactionReceiptPKI.purchaseInfo(
            transactionId: id, productId: product, purchaseDate: t0, bundleId: bundle, quantity: 2, appItemId: appItemId)
    }

    static func verifier(_ policy: VerificationPolicy) -> SignedDataVerifier { SignedDataVerifier(policy: policy) }

    @Test func verifiesWithTheIntermediateConfigured() throws {
        let v = Self.verifier(try Self.pki.policy())
        let receipt = try Self.pki.sign(purchaseInfo: Self.info())
        let item = try v.verify(receipt)
        guard case .appReceipt(let r) = item else { Issue.record("not an appReceipt"); return }
        #expect(item.kind == "appReceipt")
        #expect(r.payload.form == "transactionReceipt")
        #expect(r.environment == .sandbox)
        #expect(r.payload.bundleId == TestPayloads.bundleId)
        #expect(r.payload.receiptCreationDate == Self.t0)
        #expect(r.payload.inApp.count == 1)
        #expect(r.payload.inApp[0].transactionId == "1000000181298734")
        #expect(r.payload.inApp[0].productId == "com.example.coins")
        #expect(r.payload.inApp[0].quantity == 2)
        #expect(item.renderedJSON["form"]?.stringValue == "transactionReceipt")
        // Again, from the chain cache; and in a verifyReceipt body.
        #expect(try v.verify(receipt) == item)
        #expect(try v.verify(JSONValue.object(["receipt-data": .string(receipt)]).serialized()) == item)
    }

    @Test func withoutTheIntermediateItHasItsOwnCode() throws {
        let v = Self.verifier(try Self.pki.policy(trustIntermediate: false))
        let e = expectRejected(.legacyTransactionReceiptUnsupported) { () throws(VerificationError) in
            _ = try v.verify(try! Self.pki.sign(purchaseInfo: Self.info()))
        }
        #expect(e?.detail.contains("--trusted-intermediate") == true)
        #expect(e?.detail.contains("Apple iTunes Store Certification Authority") == true)
    }

    @Test func tamperedPurchaseInfoIsInvalidSignature() throws {
        let v = Self.verifier(try Self.pki.policy())
        let good = Array(String(decoding: Base64.decodeStandard(try Self.pki.sign(purchaseInfo: Self.info()))!, as: UTF8.self).utf8)
        // Swap the signed purchase-info for another purchase's, keeping the signature.
        let text = String(decoding: good, as: UTF8.self)
        let other = Base64.encodeStandard(Self.info("1000000999999999"))
        let original = Base64.encodeStandard(Self.info())
        let forged = text.replacingOccurrences(of: original, with: other)
        #expect(forged != text)
        expectRejected(.invalidSignature) { () throws(VerificationError) in
            _ = try v.verify(Base64.encodeStandard(Array(forged.utf8)))
        }
    }

    @Test func chainsAndMarkersAreChecked() throws {
        // A signer from another PKI with Apple's names: its issuer is "configured" by name only.
        let other = try TestTransactionReceiptPKI()
        let v = Self.verifier(try Self.pki.policy())
        expectRejected(.untrustedChain) { () throws(VerificationError) in
            _ = try v.verify(try! other.sign(purchaseInfo: Self.info()))
        }
        // An intermediate configured but not issued by a configured root.
        let wrongRoot = try VerificationPolicy(
            roots: [try TrustedRoot(der: other.rootDER)], bundleId: TestPayloads.bundleId, environments: [.sandbox],
            trustedIntermediates: [try TrustedRoot(der: Self.pki.intermediateDER)])
        expectRejected(.untrustedChain) { () throws(VerificationError) in
            _ = try Self.verifier(wrongRoot).verify(try! Self.pki.sign(purchaseInfo: Self.info()))
        }
        let unmarked = try TestTransactionReceiptPKI(markers: false)
        expectRejected(.missingAppleOID) { () throws(VerificationError) in
            _ = try Self.verifier(try! unmarked.policy()).verify(try! unmarked.sign(purchaseInfo: Self.info()))
        }
    }

    @Test func policyChecks() throws {
        let v = Self.verifier(try Self.pki.policy())
        expectRejected(.wrongBundleId) { () throws(VerificationError) in
            _ = try v.verify(try! Self.pki.sign(purchaseInfo: Self.info(bundle: "com.other")))
        }
        // No environment label: Production, which this policy does not accept.
        expectRejected(.wrongEnvironment) { () throws(VerificationError) in
            _ = try v.verify(try! Self.pki.sign(purchaseInfo: Self.info(), environment: nil))
        }
        // A signed app-item-id is Production whatever the (unsigned) label says.
        expectRejected(.wrongEnvironment) { () throws(VerificationError) in
            _ = try v.verify(try! Self.pki.sign(purchaseInfo: Self.info(appItemId: 42), environment: "Sandbox"))
        }
        let prod = Self.verifier(try Self.pki.policy(environments: [.production], appAppleId: 42))
        let r = try prod.verify(try Self.pki.sign(purchaseInfo: Self.info(appItemId: 42), environment: nil))
        #expect(r.environment == .production)
        expectRejected(.wrongAppAppleId) { () throws(VerificationError) in
            _ = try prod.verify(try! Self.pki.sign(purchaseInfo: Self.info(appItemId: 7), environment: nil))
        }
        expectRejected(.wrongAppAppleId) { () throws(VerificationError) in
            _ = try prod.verify(try! Self.pki.sign(purchaseInfo: Self.info(), environment: nil))
        }
    }

    @Test func malformedOnesAreMalformed() throws {
        let v = Self.verifier(try Self.pki.policy())
        // Real ones start "{\n\t" (base64 "ew"), which routes them here.
        for text in ["{\n\t\"signature\" = \"AAAA\"; }", "{\n\t\"signature\" = \"AA\"; \"purchase-info\" = \"AA==\"; }",
                     "{\n\t\"a\" = \"b\"; \"a\" = \"c\"; }", "{\n\t\"signature\" = \"x\" ", "{\n}", "{\n\t\"signature\" = \"AQID\"; \"purchase-info\" = \"e30=\"; }"] {
            expectRejected(.malformedReceipt) { () throws(VerificationError) in
                _ = try v.verify(Base64.encodeStandard(Array((text + String(repeating: " ", count: 20)).utf8)))
            }
        }
    }

    /// The real receipt (../shared/fixtures): refused without the intermediate; with "Apple iTunes Store
    /// Certification Authority" (a DER file named by FLEET_TEST_ITUNES_STORE_CA, or next to the fixtures as
    /// AppleITunesStoreCertificationAuthority.cer) it verifies at its purchase date.
    @Test(.enabled(if: AppleReceipts.available, "../shared/fixtures/apple-receipts is absent"))
    func theRealOne() throws {
        let receipt = try AppleReceipts.text("sk1-transaction-receipt.b64")
        let root = try TrustedRoot(der: Array(try Data(contentsOf: AppleReceipts.directory.appendingPathComponent("AppleIncRootCertificate.cer"))))
        let without = try VerificationPolicy(roots: [root], bundleId: "com.mbaasy.ios.demo", environments: [.sandbox])
        expectRejected(.legacyTransactionReceiptUnsupported) { () throws(VerificationError) in
            _ = try Self.verifier(without).verify(receipt)
        }
        // With an intermediate of another PKI: the signer's issuer is not configured.
        let wrong = try VerificationPolicy(
            roots: [root], bundleId: "com.mbaasy.ios.demo", environments: [.sandbox],
            trustedIntermediates: [try TrustedRoot(der: Self.pki.intermediateDER)])
        expectRejected(.untrustedChain) { () throws(VerificationError) in _ = try Self.verifier(wrong).verify(receipt) }

        let candidates: [String?] = [ProcessInfo.processInfo.environment["FLEET_TEST_ITUNES_STORE_CA"],
                          AppleReceipts.directory.appendingPathComponent("AppleITunesStoreCertificationAuthority.cer").path]
        guard let path = candidates.compactMap({ $0 }).first(where: { FileManager.default.fileExists(atPath: $0) }) else { return }
        let ca = try TrustedRoot(der: Array(try Data(contentsOf: URL(fileURLWithPath: path))))
        let with = try VerificationPolicy(
            roots: [root], bundleId: "com.mbaasy.ios.demo", environments: [.sandbox], trustedIntermediates: [ca])
        let item = try Self.verifier(with).verify(receipt)
        guard case .appReceipt(let r) = item else { Issue.record("not an appReceipt"); return }
        #expect(r.payload.inApp.first?.transactionId == "1000000181298734")
        #expect(r.payload.inApp.first?.productId == "yearly")
        #expect(r.payload.receiptCreationDate == 1_447_821_281_000)
        #expect(r.environment == .sandbox)
    }
}
