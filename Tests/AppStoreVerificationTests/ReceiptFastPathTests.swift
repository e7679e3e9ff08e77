import Crypto
@testable import AppStoreVerification
import Foundation
import FleetTestPKI
import Testing

/// The receipt fast path (`ReceiptFastPath.swift`): a chain-cache hit without decoding the certificate set's base64
/// must give exactly the full path's verdict, reason, detail and payload.
@Suite struct ReceiptFastPathTests {
    let pki = ReceiptFixtures.pki

    enum Outcome: Equatable {
        case verified(VerifiedAppReceipt)
        case rejected(VerificationError)
    }

    func outcome(_ v: SignedDataVerifier, _ input: String) -> Outcome {
        do {
            guard case .appReceipt(let r) = try v.verify(input) else {
                return .rejected(VerificationError(.malformedReceipt, "not a receipt"))
            }
            return .verified(r)
        } catch { return .rejected(error) }
    }

    /// Cold (no cache), first use of a fresh cache, then a warm cache (twice), and the full path over the DER with
    /// the same warm cache (`verifyAppReceipt(der:)` never takes the fast path): all agree.
    func expectSameEverywhere(
        _ input: String, warm: SignedDataVerifier, sourceLocation: SourceLocation = #_sourceLocation
    ) -> Outcome {
        let cold = outcome(SignedDataVerifier(policy: warm.policy, chainCache: nil), input)
        #expect(outcome(SignedDataVerifier(policy: warm.policy, chainCache: ChainCache()), input) == cold, sourceLocation: sourceLocation)
        #expect(outcome(warm, input) == cold, sourceLocation: sourceLocation)
        #expect(outcome(warm, input) == cold, sourceLocation: sourceLocation)
        if input.hasPrefix("MI"), let der = Base64.decodeStandard(input) {  // Else not routed as a receipt.
            let full: Outcome
            do { full = .verified(try warm.verifyAppReceipt(der: der)) } catch { full = .rejected(error) }
            #expect(full == cold, sourceLocation: sourceLocation)
        }
        return cold
    }

    func certificateSet(_ der: [UInt8]) throws -> Range<Int> {
        try PKCS7SignedData(der: der).certificateSetDER.indices
    }

    @Test func aWarmCacheHitsWithoutDecodingTheCertificatesAndAgreesWithACold() throws {
        var residues: Set<[Int]> = []
        for (k, digest) in [TestReceiptPKI.Digest.sha1, .sha256].enumerated() {
            for attrs in [false, true] {
                for productExtra in 0..<3 {
                    let t0 = ReceiptFixtures.t0
                    let receipt = TestReceipt(
                        receiptType: "ProductionSandbox", bundleId: TestPayloads.bundleId, creationDate: t0,
                        inApp: (0..<(1 + k)).map { i in
                            TestReceipt.InApp(
                                productId: "com.example.coins" + String(repeating: "x", count: productExtra),
                                transactionId: "20000000000000\(i)", purchaseDate: t0, quantity: 1, productType: 1)
                        })
                    let der = try pki.sign(receipt, digest: digest, signedAttributes: attrs)
                    let set = try certificateSet(der)
                    residues.insert([set.lowerBound % 3, set.upperBound % 3])
                    let input = Base64.encodeStandard(der)
                    let cache = ChainCache(capacity: 8)
                    let warm = ReceiptFixtures.verifier(cache: cache)
                    let first = outcome(warm, input)
                    let hits = cache.hits
                    let spliced = Array(input.utf8).withUnsafeBufferPointer {
                        SignedDataVerifier.spliceReceipt($0, maxBytes: 1 << 20)
                    }
                    #expect(spliced != nil, "the fast path applies")
                    #expect(try spliced?.content == PKCS7SignedData(der: der).content)
                    #expect(spliced?.certificates.isEmpty == true)
                    #expect(expectSameEverywhere(input, warm: warm) == first)
                    #expect(cache.hits == hits + 3, "both warm verifications hit, and the full path's lookup")
                    if case .rejected(let e) = first { Issue.record("\(e)") }
                }
            }
        }
        #expect(residues.count >= 3, "several alignments of the certificate set: \(residues)")
    }

    @Test func rejectionsAfterAHitAreTheFullPathsOwn() throws {
        let cache = ChainCache(capacity: 8)
        let warm = ReceiptFixtures.verifier(environments: [.sandbox], cache: cache)
        _ = outcome(warm, Base64.encodeStandard(try pki.sign(ReceiptFixtures.receipt())))
        let inputs = [
            try pki.sign(ReceiptFixtures.receipt(bundleId: "com.example.other")),
            try pki.sign(ReceiptFixtures.receipt(type: "Production", appAppleId: 42)),
            try pki.sign(ReceiptFixtures.receipt(type: "Xcode")),
        ]
        for der in inputs {
            if case .verified = expectSameEverywhere(Base64.encodeStandard(der), warm: warm) {
                Issue.record("expected a rejection")
            }
        }
        // Tampered content and signature, same certificate set: a hit, then the full path's invalid signature.
        var der = try pki.sign(ReceiptFixtures.receipt())
        let set = try certificateSet(der)
        let contentByte = set.lowerBound - 20
        der[contentByte] ^= 0x01
        let tamperedContent = Base64.encodeStandard(der)
        der[contentByte] ^= 0x01
        der[der.count - 10] ^= 0x01
        let tamperedSignature = Base64.encodeStandard(der)
        for input in [tamperedContent, tamperedSignature] {
            let hits = cache.hits
            let got = expectSameEverywhere(input, warm: warm)
            #expect(cache.hits > hits, "the same certificate set hits")
            if case .rejected(let e) = got { #expect(e.reason == .invalidSignature || e.reason == .malformedReceipt) } else {
                Issue.record("tampered receipt verified")
            }
        }
    }

    @Test func aCertificateSetDifferingInOneByteNeverHits() throws {
        let genuine = try pki.sign(ReceiptFixtures.receipt())
        let set = try certificateSet(genuine)
        let cache = ChainCache(capacity: 64)
        let warm = ReceiptFixtures.verifier(cache: cache)
        guard case .verified = outcome(warm, Base64.encodeStandard(genuine)) else {
            Issue.record("the genuine receipt must verify")
            return
        }
        // One byte changed at several places inside the set (certificate signatures, keys, names, headers).
        let stride = max(1, set.count / 40)
        for offset in Swift.stride(from: set.lowerBound, to: set.upperBound, by: stride) {
            for delta: UInt8 in [0x01, 0x80] {
                var der = genuine
                der[offset] ^= delta
                let input = Base64.encodeStandard(der)
                let key = Array(input.utf8).withUnsafeBufferPointer { b -> ChainCacheKey? in
                    guard let s = SignedDataVerifier.spliceReceipt(b, maxBytes: 1 << 20) else { return nil }
                    return SignedDataVerifier.receiptSpanKey(b, s.certificateSetDER.indices, s.signerInfo)
                }
                if let key { #expect(cache.lookup(key, countHit: false, countMiss: false) == nil, "offset \(offset)") }
                let hits = cache.hits
                let got = outcome(warm, input)
                #expect(cache.hits == hits, "a forged certificate set must not hit (offset \(offset))")
                #expect(got == outcome(ReceiptFixtures.verifier(cache: nil), input), "offset \(offset)")
            }
        }
        // A receipt signed by another PKI with the same names: rejected as cold, never from the cache.
        let forged = try TestReceiptPKI()
        let f = Base64.encodeStandard(try forged.sign(ReceiptFixtures.receipt()))
        #expect(outcome(warm, f) == outcome(ReceiptFixtures.verifier(cache: nil), f))
    }

    /// A CI run failed here once: a mutated certificate's key was refused by swift-crypto with BoringSSL error codes
    /// that differed between the warm and the cold verifier (67108968 against 100663398), and the detail carried them.
    @Test func certificateErrorsCarryNoBoringSSLCode() {
        let a = SignedDataVerifier.certificateError(CryptoKitError.underlyingCoreCryptoError(error: 67108968))
        let b = SignedDataVerifier.certificateError(CryptoKitError.underlyingCoreCryptoError(error: 100663398))
        #expect(a == b)
        #expect(!a.contains("67108968"))
        #expect(SignedDataVerifier.certificateError(CryptoKitError.incorrectKeySize) == "\(CryptoKitError.incorrectKeySize)")
    }

    @Test func oneByteMutationsAnywhereAgreeWarmAndCold() throws {
        let genuine = try pki.sign(ReceiptFixtures.receipt(), signedAttributes: true)
        let warm = ReceiptFixtures.verifier()
        _ = outcome(warm, Base64.encodeStandard(genuine))
        for offset in Swift.stride(from: 0, to: genuine.count, by: max(1, genuine.count / 80)) {
            var der = genuine
            der[offset] ^= 0x21
            _ = expectSameEverywhere(Base64.encodeStandard(der), warm: warm)
        }
    }

    @Test func whitespaceWrappedBase64VerifiesThroughTheFullPath() throws {
        let input = Base64.encodeStandard(try pki.sign(ReceiptFixtures.receipt()))
        var lines: [String] = []
        var rest = Substring(input)
        while !rest.isEmpty {
            lines.append(String(rest.prefix(76)))
            rest = rest.dropFirst(76)
        }
        let cache = ChainCache(capacity: 8)
        let warm = ReceiptFixtures.verifier(cache: cache)
        let plain = outcome(warm, input)
        guard case .verified = plain else {
            Issue.record("\(plain)")
            return
        }
        for wrapped in [lines.joined(separator: "\n"), lines.joined(separator: "\r\n") + "\n"] {
            let spliced = Array(wrapped.utf8).withUnsafeBufferPointer { SignedDataVerifier.spliceReceipt($0, maxBytes: 1 << 20) }
            #expect(spliced == nil, "no fast path over whitespace")
            #expect(expectSameEverywhere(wrapped, warm: warm) == plain)
            #expect(try ReceiptFixtures.verifier().verifyAppReceipt(wrapped) == ReceiptFixtures.verifier().verifyAppReceipt(input))
        }
    }

    @Test func truncationsAndCutsInsideTheCertificateSetKeepTheirCode() throws {
        let der = try pki.sign(ReceiptFixtures.receipt())
        let set = try certificateSet(der)
        let warm = ReceiptFixtures.verifier()
        _ = outcome(warm, Base64.encodeStandard(der))
        let stride = max(1, set.count / 25)
        for cut in Swift.stride(from: set.lowerBound, to: set.upperBound + 3, by: stride) {
            // The DER truncated at `cut`; a run of bytes removed at `cut`; the base64 text itself cut.
            let truncated = Base64.encodeStandard(der[..<cut])
            let removed = Base64.encodeStandard(Array(der[..<cut]) + der[(cut + 7)...])
            let text = Base64.encodeStandard(der)
            let textCut = String(text.prefix(cut / 3 * 4 + cut % 4))
            for input in [truncated, removed, textCut] {
                let got = expectSameEverywhere(input, warm: warm)
                guard case .rejected(let e) = got else {
                    Issue.record("a cut receipt verified (cut \(cut))")
                    continue
                }
                #expect(e.reason == .malformedReceipt, "cut \(cut): \(e)")
            }
        }
    }

    @Test func nonCanonicalOrPaddedInsideFallsBack() throws {
        let input = Array(Base64.encodeStandard(try pki.sign(ReceiptFixtures.receipt())).utf8)
        let warm = ReceiptFixtures.verifier()
        _ = outcome(warm, String(decoding: input, as: UTF8.self))
        // "=" inside the certificate region and in the head, an invalid character, a bad final group.
        for (position, c) in [(input.count / 2, "="), (40, "="), (input.count / 2, "*"), (input.count - 1, "A")] {
            var b = input
            b[position] = UInt8(ascii: Unicode.Scalar(c)!)
            let s = String(decoding: b, as: UTF8.self)
            let got = expectSameEverywhere(s, warm: warm)
            if case .verified = got, c != "A" { Issue.record("an invalid character verified") }
        }
    }
}
