import AppStoreVerification
import Foundation
import FleetTestPKI
import Testing

@Suite struct Rejections {
    let pki = Fixtures.pki
    let v = Fixtures.verifier()

    func verify(_ s: String) throws(VerificationError) { _ = try v.verify(s) }

    @Test(arguments: [
        "hello", "a.b", "a.b.c.d", "..", "eyJhbGciOiJFUzI1NiJ9..sig", "@@@.@@@.@@@", "{}", "{\"foo\":1}", "[1,2]",
        "{not json", "\u{0}\u{1}",
    ])
    func garbageIsMalformed(_ line: String) {
        expectRejected(.malformedJWS) { () throws(VerificationError) in try verify(line) }
    }

    @Test func emptyInputIsMalformed() {
        expectRejected(.malformedJWS) { () throws(VerificationError) in try verify("   \n") }
    }

    @Test func headerAndPayloadMustBeJSONObjects() {
        let header = Base64.encodeURL(Array("{\"alg\":\"ES256\",\"x5c\":[]}".utf8))
        let notJSON = Base64.encodeURL(Array("not json".utf8))
        let array = Base64.encodeURL(Array("[1]".utf8))
        expectRejected(.malformedJWS) { () throws(VerificationError) in try verify("\(notJSON).\(notJSON).AAAA") }
        expectRejected(.malformedJWS) { () throws(VerificationError) in try verify("\(header).\(notJSON).AAAA") }
        expectRejected(.malformedJWS) { () throws(VerificationError) in try verify("\(header).\(array).AAAA") }
        // A payload that is no known kind.
        let signed = pki.sign(["hello": "world"])
        expectRejected(.malformedJWS) { () throws(VerificationError) in try verify(signed) }
    }

    @Test func oversizedInputIsTooLarge() {
        let small = Fixtures.verifier(maxInputBytes: 4096)
        let jws = pki.sign(Fixtures.transaction())  // about 3 KiB of certificates alone
        let big = pki.sign(Fixtures.transaction(extra: ["padding": .string(String(repeating: "x", count: 5000))]))
        expectRejected(.payloadTooLarge) { () throws(VerificationError) in _ = try small.verify(big) }
        expectRejected(.payloadTooLarge) { () throws(VerificationError) in
            try verify(String(repeating: "A", count: 70_000))
        }
        #expect(jws.utf8.count > 1000)
    }

    @Test(arguments: ["none", "HS256", "ES384", "RS256", "es256"])
    func onlyES256IsAccepted(_ alg: String) {
        let jws = pki.sign(Fixtures.transaction(), header: .init(alg: alg))
        let e = expectRejected(.unsupportedAlgorithm) { () throws(VerificationError) in try verify(jws) }
        #expect(e?.detail.contains(alg) == true)
    }

    @Test func missingAlgIsUnsupported() {
        let jws = pki.sign(Fixtures.transaction(), header: .init(alg: nil))
        expectRejected(.unsupportedAlgorithm) { () throws(VerificationError) in try verify(jws) }
    }

    @Test(arguments: [0, 1, 2, 4])
    func chainMustHaveExactlyThreeCertificates(_ count: Int) {
        let x5c = pki.x5c
        let list = count == 4 ? x5c + [x5c[2]] : Array(x5c.prefix(count))
        let jws = pki.sign(Fixtures.transaction(), header: .init(x5c: list))
        expectRejected(.invalidChainLength) { () throws(VerificationError) in try verify(jws) }
    }

    @Test func missingX5cIsInvalidChainLength() {
        let jws = pki.sign(Fixtures.transaction(), header: .init(omitX5c: true))
        expectRejected(.invalidChainLength) { () throws(VerificationError) in try verify(jws) }
    }

    @Test func forgedChainWithApplesNamesIsUntrusted() throws {
        let forged = try TestPKI.forged()
        #expect(forged.root.subject == pki.root.subject)
        #expect(forged.intermediate.subject == pki.intermediate.subject)
        expectRejected(.untrustedChain) { () throws(VerificationError) in try verify(forged.sign(Fixtures.transaction())) }
        // Even with the genuine root placed in x5c[2]: x5c[2] is never trusted.
        let withRealRoot = forged.sign(Fixtures.transaction(), header: .init(x5c: [forged.x5c[0], forged.x5c[1], pki.x5c[2]]))
        expectRejected(.untrustedChain) { () throws(VerificationError) in try verify(withRealRoot) }
        // A genuine intermediate with a leaf it did not sign.
        let mixed = forged.sign(Fixtures.transaction(), header: .init(x5c: [forged.x5c[0], pki.x5c[1], pki.x5c[2]]))
        expectRejected(.untrustedChain) { () throws(VerificationError) in try verify(mixed) }
    }

    @Test func intermediateThatIsNotACAIsUntrusted() throws {
        var o = TestPKI.Options()
        o.intermediateIsCA = false
        let bad = try pki.withNewIntermediate(options: o)
        let e = expectRejected(.untrustedChain) { () throws(VerificationError) in try verify(bad.sign(Fixtures.transaction())) }
        #expect(e?.detail.contains("CA") == true)
    }

    @Test func garbageCertificatesAreRejected() {
        let jws = pki.sign(Fixtures.transaction(), header: .init(x5c: ["AAAA", pki.x5c[1], pki.x5c[2]]))
        expectRejected(.untrustedChain) { () throws(VerificationError) in try verify(jws) }
        let notBase64 = pki.sign(Fixtures.transaction(), header: .init(x5c: ["%%%%", pki.x5c[1], pki.x5c[2]]))
        expectRejected(.malformedJWS) { () throws(VerificationError) in try verify(notBase64) }
    }

    @Test func leafWithoutAppleOIDIsRejected() throws {
        var o = TestPKI.Options()
        o.leafAppleOID = false
        let bad = try pki.withNewLeaf(options: o)
        let e = expectRejected(.missingAppleOID) { () throws(VerificationError) in try verify(bad.sign(Fixtures.transaction())) }
        #expect(e?.detail.contains("1.2.840.113635.100.6.11.1") == true)
    }

    @Test func intermediateWithoutAppleOIDIsRejected() throws {
        var o = TestPKI.Options()
        o.intermediateAppleOID = false
        let bad = try pki.withNewIntermediate(options: o)
        let e = expectRejected(.missingAppleOID) { () throws(VerificationError) in try verify(bad.sign(Fixtures.transaction())) }
        #expect(e?.detail.contains("1.2.840.113635.100.6.2.1") == true)
    }

    @Test func expiredLeafAtSignedDateIsRejected() throws {
        let leaf = try pki.withLeafValidity(Date(timeIntervalSince1970: 1_600_000_000), Date(timeIntervalSince1970: 1_700_000_000))
        expectRejected(.certificateNotValidAtTime) { () throws(VerificationError) in
            try verify(leaf.sign(Fixtures.transaction(signedDate: 1_700_000_001_000)))
        }
        // The same chain verifies for data signed inside the window.
        _ = try v.verify(leaf.sign(Fixtures.transaction(signedDate: 1_650_000_000_000)))
    }

    @Test func notYetValidLeafAtSignedDateIsRejected() throws {
        let leaf = try pki.withLeafValidity(Date(timeIntervalSince1970: 1_800_000_000), Date(timeIntervalSince1970: 1_900_000_000))
        expectRejected(.certificateNotValidAtTime) { () throws(VerificationError) in
            try verify(leaf.sign(Fixtures.transaction(signedDate: Fixtures.t0)))
        }
    }

    @Test func expiredIntermediateIsRejected() throws {
        var o = TestPKI.Options()
        o.intermediateNotAfter = Date(timeIntervalSince1970: 1_700_000_000)
        let bad = try pki.withNewIntermediate(options: o)
        expectRejected(.certificateNotValidAtTime) { () throws(VerificationError) in try verify(bad.sign(Fixtures.transaction())) }
    }

    @Test func tamperedPayloadFailsTheSignature() {
        let jws = pki.sign(Fixtures.transaction())
        let parts = jws.split(separator: ".").map(String.init)
        var payload = Fixtures.transaction()
        if case .object(var o) = payload {
            o["productId"] = "com.example.fleet.lifetime"
            payload = .object(o)
        }
        let swapped = parts[0] + "." + Base64.encodeURL(payload.serializedBytes()) + "." + parts[2]
        expectRejected(.invalidSignature) { () throws(VerificationError) in try verify(swapped) }
    }

    @Test func derSignatureIsInvalid() {
        let jws = pki.sign(Fixtures.transaction(), header: .init(derSignature: true))
        let e = expectRejected(.invalidSignature) { () throws(VerificationError) in try verify(jws) }
        #expect(e?.detail.contains("64-byte") == true)
    }

    @Test func signatureByAnotherKeyIsInvalid() throws {
        let other = JWSSigner(key: .init(), x5c: pki.x5c)
        expectRejected(.invalidSignature) { () throws(VerificationError) in try verify(other.sign(Fixtures.transaction())) }
    }

    @Test func flippedCharactersAreRejected() {
        let jws = pki.sign(Fixtures.transaction())
        for segment in 0..<3 {
            let flipped = flipCharacter(jws, segment: segment)
            do {
                _ = try v.verify(flipped)
                Issue.record("flipped segment \(segment) verified")
            } catch {
                #expect(error.reason != .wrongBundleId)
            }
        }
    }

    @Test func wrongBundleId() {
        let jws = pki.sign(Fixtures.transaction(bundleId: "com.evil.app"))
        let e = expectRejected(.wrongBundleId) { () throws(VerificationError) in try verify(jws) }
        #expect(e?.detail.contains("com.evil.app") == true)
        let note = pki.signNotification(type: .test, bundleId: "com.evil.app", signedDate: Fixtures.t0)
        expectRejected(.wrongBundleId) { () throws(VerificationError) in try verify(note) }
    }

    @Test func wrongAppAppleId() {
        let prod = Fixtures.verifier(environments: [.production])
        let other = pki.signNotification(type: .test, environment: .production, appAppleId: 42, signedDate: Fixtures.t0)
        expectRejected(.wrongAppAppleId) { () throws(VerificationError) in _ = try prod.verify(other) }
        let missing = pki.signNotification(type: .test, environment: .production, appAppleId: nil, signedDate: Fixtures.t0)
        expectRejected(.wrongAppAppleId) { () throws(VerificationError) in _ = try prod.verify(missing) }
        let app = pki.sign(TestPayloads.appTransaction(appAppleId: 7, receiptType: .production, receiptCreationDate: Fixtures.t0))
        expectRejected(.wrongAppAppleId) { () throws(VerificationError) in _ = try prod.verify(app) }
        // Sandbox: an app id, when present, must still match.
        let sandboxOther = pki.signNotification(type: .test, environment: .sandbox, appAppleId: 42, signedDate: Fixtures.t0)
        expectRejected(.wrongAppAppleId) { () throws(VerificationError) in try verify(sandboxOther) }
    }

    @Test func wrongEnvironment() {
        let sandboxOnly = Fixtures.verifier(environments: [.sandbox])
        let prod = pki.sign(Fixtures.transaction(env: .production))
        expectRejected(.wrongEnvironment) { () throws(VerificationError) in _ = try sandboxOnly.verify(prod) }
        let prodOnly = Fixtures.verifier(environments: [.production])
        let renewal = pki.sign(TestPayloads.renewalInfo(originalTransactionId: "1", environment: .sandbox, signedDate: Fixtures.t0))
        expectRejected(.wrongEnvironment) { () throws(VerificationError) in _ = try prodOnly.verify(renewal) }
        let weird = pki.sign(Fixtures.transaction(env: AppStoreVerification.Environment("Staging")))
        expectRejected(.wrongEnvironment) { () throws(VerificationError) in try verify(weird) }
    }

    @Test func xcodeDataIsRefusedByDefault() throws {
        // Xcode signs locally with a one-certificate x5c.
        let localKey = JWSSigner(key: .init(), x5c: [pki.x5c[0]])
        let xcode = localKey.sign(Fixtures.transaction(env: .xcode))
        let e = expectRejected(.unsignedEnvironmentRefused) { () throws(VerificationError) in try verify(xcode) }
        #expect(e?.detail.contains("Xcode") == true)
        let local = localKey.sign(Fixtures.transaction(env: .localTesting))
        expectRejected(.unsignedEnvironmentRefused) { () throws(VerificationError) in try verify(local) }
        // Explicit development option.
        let dev = Fixtures.verifier(allowUnsigned: true)
        #expect(try dev.verify(xcode).environment == .xcode)
        // Even then, the algorithm and bundle id are still checked.
        let badBundle = localKey.sign(Fixtures.transaction(env: .xcode, bundleId: "com.other"))
        expectRejected(.wrongBundleId) { () throws(VerificationError) in _ = try dev.verify(badBundle) }
        let hs = localKey.sign(Fixtures.transaction(env: .xcode), header: .init(alg: "HS256"))
        expectRejected(.unsupportedAlgorithm) { () throws(VerificationError) in _ = try dev.verify(hs) }
    }

    @Test func legacyReceiptsAreVerifiedAsReceipts() {
        // Garbage in the receipt forms gets the receipt's own reason (GeneratedReceiptTests verifies real ones).
        let receipt = "MIIT" + Base64.encodeStandard((0..<600).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        expectRejected(.malformedReceipt) { () throws(VerificationError) in try verify(receipt) }
        let body = JSONValue.object(["receipt-data": .string(receipt), "password": "x"]).serialized()
        expectRejected(.malformedReceipt) { () throws(VerificationError) in try verify(body) }
    }

    @Test func unsecuredJWSWithEmptySignatureIsUnsupportedAlgorithm() {
        // The classic attack: alg none and an empty signature segment; the README promises UNSUPPORTED_ALGORITHM.
        let payload = Base64.encodeURL(Fixtures.transaction().serializedBytes())
        for alg in ["none", "None", "HS256"] {
            let header = Base64.encodeURL(Array("{\"alg\":\"\(alg)\",\"typ\":\"JWT\"}".utf8))
            expectRejected(.unsupportedAlgorithm) { () throws(VerificationError) in try verify("\(header).\(payload).") }
        }
        let noAlg = Base64.encodeURL(Array("{\"typ\":\"JWT\"}".utf8))
        expectRejected(.unsupportedAlgorithm) { () throws(VerificationError) in try verify("\(noAlg).\(payload).") }
        // ES256 with the signature missing is still malformed.
        let es = Base64.encodeURL(Array("{\"alg\":\"ES256\"}".utf8))
        expectRejected(.malformedJWS) { () throws(VerificationError) in try verify("\(es).\(payload).") }
    }

    @Test func nestedForgedTransactionRejectsTheNotification() throws {
        let forged = try TestPKI.forged()
        let forgedTx = forged.sign(Fixtures.transaction())
        let payload = TestPayloads.notification(
            type: .didRenew, signedDate: Fixtures.t0, signedTransactionInfo: forgedTx)
        let note = pki.sign(payload)
        let e = expectRejected(.untrustedChain) { () throws(VerificationError) in try verify(note) }
        #expect(e?.field == "data.signedTransactionInfo")
        #expect(e?.detail.contains("data.signedTransactionInfo") == true)
        // Nested renewal info with a bad signature.
        let renewal = pki.sign(TestPayloads.renewalInfo(originalTransactionId: "1", signedDate: Fixtures.t0))
        let tampered = flipCharacter(renewal, segment: 2, at: 10)
        let note2 = pki.sign(TestPayloads.notification(type: .didRenew, signedDate: Fixtures.t0, signedRenewalInfo: tampered))
        let e2 = expectRejected(.invalidSignature) { () throws(VerificationError) in try verify(note2) }
        #expect(e2?.field == "data.signedRenewalInfo")
        // Nested transaction for another app.
        let otherApp = pki.sign(Fixtures.transaction(bundleId: "com.other.app"))
        let note3 = pki.sign(TestPayloads.notification(type: .didRenew, signedDate: Fixtures.t0, signedTransactionInfo: otherApp))
        let e3 = expectRejected(.wrongBundleId) { () throws(VerificationError) in try verify(note3) }
        #expect(e3?.field == "data.signedTransactionInfo")
        // A nested value of the wrong kind.
        let note4 = pki.sign(TestPayloads.notification(type: .didRenew, signedDate: Fixtures.t0, signedTransactionInfo: renewal))
        expectRejected(.malformedJWS) { () throws(VerificationError) in try verify(note4) }
    }

    @Test func everyCoreReasonCodeIsDistinctAndStable() {
        let codes = RejectionReason.verificationCodes.map(\.rawValue)
        #expect(Set(codes).count == 14)
        #expect(codes.contains("MALFORMED_RECEIPT"))
        #expect(codes.contains("LEGACY_TRANSACTION_RECEIPT_UNSUPPORTED"))
        #expect(RejectionReason.malformedJWS.rawValue == "MALFORMED_JWS")
    }
}
