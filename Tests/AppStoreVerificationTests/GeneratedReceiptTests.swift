import AppStoreVerification
import Foundation
import FleetTestPKI
import SwiftASN1
import Testing
import X509

/// App receipts signed by the Apple-shaped RSA test PKI: every check of the receipt path, on inputs we control.
enum ReceiptFixtures {
    static let pki: TestReceiptPKI = try! TestReceiptPKI()
    static let t0 = Fixtures.t0

    static func receipt(
        type: String = "ProductionSandbox", appAppleId: Int64 = 0, bundleId: String = TestPayloads.bundleId,
        created: Int64 = t0, entries: Int = 4
    ) -> TestReceipt {
        TestReceipt(
            receiptType: type, appAppleId: appAppleId, bundleId: bundleId, creationDate: created,
            inApp: (0..<entries).map { i in
                TestReceipt.InApp(
                    productId: "com.example.coins", transactionId: "20000000000000\(i)", purchaseDate: created - Int64(i) * 60_000,
                    quantity: Int64(i + 1), productType: 1)
            })
    }

    static func verifier(
        _ pki: TestReceiptPKI = pki, environments: Set<AppStoreVerification.Environment> = [.sandbox, .production],
        validationTime: ValidationTime = .signedDate, allowUnsigned: Bool = false, cache: ChainCache? = ChainCache(capacity: 8)
    ) -> SignedDataVerifier {
        SignedDataVerifier(
            policy: try! pki.policy(environments: environments, validationTime: validationTime, allowUnsigned: allowUnsigned),
            chainCache: cache)
    }
}

@Suite struct GeneratedReceipts {
    let pki = ReceiptFixtures.pki

    func verify(_ v: SignedDataVerifier, _ der: [UInt8]) throws(VerificationError) -> VerifiedAppReceipt {
        guard case .appReceipt(let r) = try v.verify(Base64.encodeStandard(der)) else {
            throw VerificationError(.malformedReceipt, "not a receipt")
        }
        return r
    }

    @Test(arguments: [TestReceiptPKI.Digest.sha1, .sha256], [false, true])
    func verifiesWithEitherDigestAndWithSignedAttributes(_ digest: TestReceiptPKI.Digest, _ attrs: Bool) throws {
        let der = try pki.sign(ReceiptFixtures.receipt(), digest: digest, signedAttributes: attrs)
        let r = try verify(ReceiptFixtures.verifier(), der)
        #expect(r.environment == .sandbox)
        #expect(r.payload.inApp.map(\.transactionId) == (0..<4).map { "20000000000000\($0)" })
        #expect(r.payload.inApp.map(\.quantity) == [1, 2, 3, 4])
        #expect(r.payload.receiptCreationDate == ReceiptFixtures.t0)
        #expect(r.payload.inApp[0].expiresDate == nil)
    }

    @Test func productionNeedsTheAppId() throws {
        let good = try pki.sign(ReceiptFixtures.receipt(type: "Production", appAppleId: TestPayloads.appAppleId))
        #expect(try verify(ReceiptFixtures.verifier(), good).environment == .production)
        let other = try pki.sign(ReceiptFixtures.receipt(type: "Production", appAppleId: 42))
        expectRejected(.wrongAppAppleId) { () throws(VerificationError) in _ = try verify(ReceiptFixtures.verifier(), other) }
    }

    @Test func xcodeIsRefusedUnlessAllowed() throws {
        let der = try pki.sign(ReceiptFixtures.receipt(type: "Xcode"))
        expectRejected(.unsignedEnvironmentRefused) { () throws(VerificationError) in _ = try verify(ReceiptFixtures.verifier(), der) }
        let dev = ReceiptFixtures.verifier(environments: [.sandbox], allowUnsigned: true)
        #expect(try verify(dev, der).environment == .xcode)
    }

    @Test func markerOIDsAreRequired() throws {
        var noLeaf = TestReceiptPKI.Options()
        noLeaf.leafAppleOID = false
        let a = try pki.withNewLeaf(options: noLeaf)
        expectRejected(.missingAppleOID) { () throws(VerificationError) in
            _ = try verify(ReceiptFixtures.verifier(a), try! a.sign(ReceiptFixtures.receipt()))
        }
        var noInter = TestReceiptPKI.Options()
        noInter.intermediateAppleOID = false
        let b = try pki.withNewIntermediate(options: noInter)
        expectRejected(.missingAppleOID) { () throws(VerificationError) in
            _ = try verify(ReceiptFixtures.verifier(b), try! b.sign(ReceiptFixtures.receipt()))
        }
    }

    @Test func expiredSignerIsNotValidAtTheCreationDate() throws {
        var o = TestReceiptPKI.Options()
        o.leafNotBefore = Date(timeIntervalSince1970: Double(ReceiptFixtures.t0) / 1000 - 86_400 * 30)
        o.leafNotAfter = Date(timeIntervalSince1970: Double(ReceiptFixtures.t0) / 1000 + 86_400)
        let short = try pki.withNewLeaf(options: o)
        let cache = ChainCache(capacity: 8)
        let v = ReceiptFixtures.verifier(short, cache: cache)
        // Inside the window (a cache miss: verified by swift-certificates' Verifier) ...
        _ = try verify(v, try short.sign(ReceiptFixtures.receipt()))
        // ... a later receipt from the same signer (a cache hit) and a fresh verifier (a miss) both refuse it.
        let late = try short.sign(ReceiptFixtures.receipt(created: ReceiptFixtures.t0 + 86_400_000 * 3))
        expectRejected(.certificateNotValidAtTime) { () throws(VerificationError) in _ = try verify(v, late) }
        expectRejected(.certificateNotValidAtTime) { () throws(VerificationError) in
            _ = try verify(ReceiptFixtures.verifier(short, cache: nil), late)
        }
    }

    @Test func forgedChainWithApplesNamesIsUntrusted() throws {
        let forged = try TestReceiptPKI()  // same names, other keys
        let der = try forged.sign(ReceiptFixtures.receipt())
        expectRejected(.untrustedChain) { () throws(VerificationError) in _ = try verify(ReceiptFixtures.verifier(), der) }
        // The forged leaf spliced under the real intermediate and root (the signature chain breaks).
        let spliced = try TestReceiptPKI(
            rootKey: forged.rootKey, root: pki.root, intermediateKey: forged.intermediateKey, intermediate: pki.intermediate)
        expectRejected(.untrustedChain) { () throws(VerificationError) in
            _ = try verify(ReceiptFixtures.verifier(), try! spliced.sign(ReceiptFixtures.receipt()))
        }
    }

    @Test func tamperedContentIsInvalidSignature() throws {
        var der = try pki.sign(ReceiptFixtures.receipt())
        let needle = Array("com.example.coins".utf8)
        let at = try #require((0..<(der.count - needle.count)).first { Array(der[$0..<($0 + needle.count)]) == needle })
        der[at] ^= 0x01
        expectRejected(.invalidSignature) { () throws(VerificationError) in _ = try verify(ReceiptFixtures.verifier(), der) }
        // A tampered signed-attributes receipt: the message digest no longer matches.
        var withAttrs = try pki.sign(ReceiptFixtures.receipt(), signedAttributes: true)
        let at2 = try #require((0..<(withAttrs.count - needle.count)).first { Array(withAttrs[$0..<($0 + needle.count)]) == needle })
        withAttrs[at2] ^= 0x01
        expectRejected(.invalidSignature) { () throws(VerificationError) in _ = try verify(ReceiptFixtures.verifier(), withAttrs) }
    }

    @Test func wrongBundleAndEnvironment() throws {
        let other = try pki.sign(ReceiptFixtures.receipt(bundleId: "com.other.app"))
        expectRejected(.wrongBundleId) { () throws(VerificationError) in _ = try verify(ReceiptFixtures.verifier(), other) }
        let sandbox = try pki.sign(ReceiptFixtures.receipt())
        expectRejected(.wrongEnvironment) { () throws(VerificationError) in
            _ = try verify(ReceiptFixtures.verifier(environments: [.production]), sandbox)
        }
    }

    @Test func receiptsHaveTheirOwnSizeBound() throws {
        let big = try pki.sign(ReceiptFixtures.receipt(entries: 600))
        #expect(big.count > 64 * 1024)  // over the JWS bound, under the receipt bound
        #expect(try verify(ReceiptFixtures.verifier(), big).payload.inApp.count == 600)
        let policy = try VerificationPolicy(
            roots: [try TrustedRoot(der: pki.rootDER)], bundleId: TestPayloads.bundleId, environments: [.sandbox], maxReceiptBytes: 4096)
        expectRejected(.payloadTooLarge) { () throws(VerificationError) in
            _ = try SignedDataVerifier(policy: policy).verify(Base64.encodeStandard(big))
        }
    }

    @Test func garbageReceiptsAreMalformed() {
        let v = ReceiptFixtures.verifier()
        let receipt = "MIIT" + Base64.encodeStandard((0..<600).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        expectRejected(.malformedReceipt) { () throws(VerificationError) in _ = try v.verify(receipt) }
        let body = JSONValue.object(["receipt-data": .string(receipt), "password": "x"]).serialized()
        expectRejected(.malformedReceipt) { () throws(VerificationError) in _ = try v.verify(body) }
        expectRejected(.malformedReceipt) { () throws(VerificationError) in _ = try v.verify("{\"receipt-data\": 12}") }
        expectRejected(.malformedReceipt) { () throws(VerificationError) in _ = try v.verify("MIITnotbase64===xyz") }
        // A receipt where a JWS is expected.
        expectRejected(.malformedJWS) { () throws(VerificationError) in _ = try v.verifyTransaction(receipt) }
    }
}
