import AppStoreVerification
import Foundation
import FleetTestPKI
import Testing

@Suite struct AcceptedInputs {
    @Test func transactionVerifiesWithTypedFieldsAndUnknownFieldsKept() throws {
        let v = Fixtures.verifier()
        let payload = Fixtures.transaction(extra: ["someFutureField": ["nested": true], "offerPeriod": "P1M"])
        let t = try v.verifyTransaction(Fixtures.pki.sign(payload))
        #expect(t.payload.transactionId == "2000000000000001")
        #expect(t.payload.type == .autoRenewable)
        #expect(t.payload.environment == .sandbox)
        #expect(t.payload.signedDate == Fixtures.t0)
        #expect(t.payload.inAppOwnershipType == .purchased)
        #expect(t.payload.offerPeriod == "P1M")
        #expect(t.payload.raw["someFutureField"]?["nested"] == .bool(true))
        #expect(t.payload.raw == payload)
    }

    /// Apple's POST body as Apple writes it (`{"signedPayload":"<JWS>"}`, read without a JSON parse) gets exactly the
    /// verdict of the same body in any other spelling (parsed): verified, a bad signature, the wrong kind, too large.
    @Test func theUsualPostBodyGetsTheParsedBodysVerdict() throws {
        let pki = Fixtures.pki
        let note = pki.signNotification(type: .didRenew, transaction: Fixtures.transaction(), signedDate: Fixtures.t0)
        let dot = note.lastIndex(of: ".")!
        let forged = String(note[..<dot]) + "." + String(note[note.index(after: dot)...].reversed())
        func outcome(_ body: String, _ v: SignedDataVerifier, transaction: Bool = false) -> Result<VerifiedItem, VerificationError> {
            do {
                return .success(transaction ? .transaction(try v.verifyTransaction(body)) : try v.verify(body))
            } catch { return .failure(error) }
        }
        let small = Fixtures.verifier(maxInputBytes: 1024)
        for jws in [note, forged] {
            let usual = "{\"signedPayload\":\"\(jws)\"}", spaced = "{ \"signedPayload\": \"\(jws)\" }"
            #expect(Array(usual.utf8).withUnsafeBufferPointer { SoleJWSBody.signedPayload.jws(in: $0) } != nil)
            #expect(Array(spaced.utf8).withUnsafeBufferPointer { SoleJWSBody.signedPayload.jws(in: $0) } == nil)
            for (v, asTransaction) in [(Fixtures.verifier(), false), (Fixtures.verifier(), true), (small, false)] {
                switch (outcome(usual, v, transaction: asTransaction), outcome(spaced, v, transaction: asTransaction)) {
                case (.success(let a), .success(let b)):
                    #expect(a == b)
                case (.failure(let a), .failure(let b)):
                    // The same rejection; only a size detail may differ (the spaced body is longer).
                    #expect(a.reason == b.reason && a.field == b.field, "\(a) against \(b)")
                    if a.reason != .payloadTooLarge { #expect(a.detail == b.detail) }
                case (let a, let b):
                    Issue.record("\(a) against \(b)")
                }
            }
        }
        #expect((try? Fixtures.verifier().verify("{\"signedPayload\":\"\(note)\"}"))?.kind == "notification")
    }

    /// The recognizer's character check, byte by byte: each of the 256 byte values, at the JWS's first and last byte
    /// and on both sides of the check's 512-byte blocks, is accepted exactly when it is a JWS character.
    @Test func theUsualBodysCharacterCheckTakesExactlyTheJWSAlphabet() {
        let alphabet = Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.".utf8)
        let prefix = Array("{\"signedTransaction\":\"".utf8)
        let jws = (0..<1300).map { Array(alphabet.sorted())[$0 % alphabet.count] }
        for position in [0, 1, 510, 511, 512, 513, 1023, 1024, jws.count - 1] {
            for byte in UInt8.min...UInt8.max {
                var inner = jws
                inner[position] = byte
                let body = prefix + inner + Array("\"}".utf8)
                let found = body.withUnsafeBufferPointer { SoleJWSBody.signedTransaction.jws(in: $0) }
                if alphabet.contains(byte) {
                    #expect(found == prefix.count..<(body.count - 2), "byte \(byte) at \(position)")
                } else {
                    #expect(found == nil, "byte \(byte) at \(position)")
                }
            }
        }
    }

    @Test func unknownEnumValuesAreKept() throws {
        let v = Fixtures.verifier()
        let payload = Fixtures.transaction(extra: ["type": "Some New Type", "inAppOwnershipType": "NEW_OWNERSHIP", "offerType": 99])
        let t = try v.verifyTransaction(Fixtures.pki.sign(payload))
        #expect(t.payload.type?.rawValue == "Some New Type")
        #expect(t.payload.inAppOwnershipType?.rawValue == "NEW_OWNERSHIP")
        #expect(t.payload.offerType == OfferType(99))
    }

    @Test func kindsAreDetected() throws {
        let pki = Fixtures.pki
        let v = Fixtures.verifier()
        let tx = Fixtures.transaction()
        let renewal = TestPayloads.renewalInfo(originalTransactionId: "2000000000000001", signedDate: Fixtures.t0)
        let app = TestPayloads.appTransaction(receiptCreationDate: Fixtures.t0)
        let note = pki.signNotification(type: .didRenew, transaction: tx, renewal: renewal, signedDate: Fixtures.t0)
        #expect(try v.verify(pki.sign(tx)).kind == "transaction")
        #expect(try v.verify(pki.sign(renewal)).kind == "renewalInfo")
        #expect(try v.verify(pki.sign(app)).kind == "appTransaction")
        let item = try v.verify(note)
        #expect(item.kind == "notification")
        guard case .notification(let n) = item else { Issue.record("not a notification"); return }
        #expect(n.payload.notificationType == .didRenew)
        #expect(n.transaction?.transactionId == "2000000000000001")
        #expect(n.renewalInfo?.autoRenewStatus == .on)
        #expect(n.payload.data?.bundleId == Fixtures.bundleId)
        // Rendering replaces nested JWS by their decoded objects.
        let rendered = item.renderedJSON
        #expect(rendered["data"]?["signedTransactionInfo"]?["transactionId"] == "2000000000000001")
        #expect(rendered["data"]?["signedRenewalInfo"]?["originalTransactionId"] == "2000000000000001")
    }

    /// Found by the differential check against Apple's library: a kind named by the caller is kept when the payload
    /// also has a member of another kind (Apple's per-kind calls decode what they are told); only another kind's own
    /// marker (notificationType, transactionId) refuses it.
    @Test func aNamedKindIsKeptDespiteAnotherKindsMember() throws {
        let v = Fixtures.verifier()
        let renewal = TestPayloads.renewalInfo(
            originalTransactionId: "2000000000000001", signedDate: Fixtures.t0,
            extra: ["receiptType": "Sandbox", "receiptCreationDate": .integer(Fixtures.t0)])
        let r = try v.verifyRenewalInfo(Fixtures.pki.sign(renewal))
        #expect(r.payload.originalTransactionId == "2000000000000001")
        let tx = try Fixtures.pki.sign(Fixtures.transaction())
        let e = expectRejected(.malformedJWS) { () throws(VerificationError) in _ = try v.verifyRenewalInfo(tx) }
        #expect(e?.detail == "payload is a transaction, expected a renewalInfo")
        let bare: JSONValue = ["signedDate": .integer(Fixtures.t0), "environment": "Sandbox"]
        let bareJWS = try Fixtures.pki.sign(bare)
        let f = expectRejected(.malformedJWS) { () throws(VerificationError) in _ = try v.verifyRenewalInfo(bareJWS) }
        #expect(f?.detail == "payload is not a renewalInfo (no originalTransactionId)")
    }

    /// Also from the differential check: an AppTransaction's chain is validated at its signedDate when it has one,
    /// at its receiptCreationDate only without one (Apple's libraries' order).
    @Test func anAppTransactionIsValidatedAtItsSignedDateFirst() throws {
        let v = Fixtures.verifier()
        let dated = TestPayloads.appTransaction(
            receiptCreationDate: Fixtures.t0, extra: ["signedDate": .integer(1_500_000_000_000)])
        let datedJWS = try Fixtures.pki.sign(dated)
        expectRejected(.certificateNotValidAtTime) { () throws(VerificationError) in _ = try v.verifyAppTransaction(datedJWS) }
        let undated = TestPayloads.appTransaction(receiptCreationDate: Fixtures.t0)
        #expect(try v.verifyAppTransaction(Fixtures.pki.sign(undated)).payload.receiptCreationDate == Fixtures.t0)
        let early = TestPayloads.appTransaction(receiptCreationDate: 1_500_000_000_000)
        let earlyJWS = try Fixtures.pki.sign(early)
        expectRejected(.certificateNotValidAtTime) { () throws(VerificationError) in _ = try v.verifyAppTransaction(earlyJWS) }
    }

    @Test func appleStylePostBodyIsAccepted() throws {
        let v = Fixtures.verifier()
        let note = Fixtures.pki.signNotification(type: .test, signedDate: Fixtures.t0)
        let body = JSONValue.object(["signedPayload": .string(note)]).serialized()
        let n = try v.verifyNotification(body)
        #expect(n.payload.notificationType == .test)
        #expect(try v.verify(Array(body.utf8)).kind == "notification")
    }

    @Test func otherNotificationShapes() throws {
        let pki = Fixtures.pki
        let v = Fixtures.verifier()
        let summary = try v.verifyNotification(pki.sign(TestPayloads.summaryNotification(signedDate: Fixtures.t0)))
        #expect(summary.payload.summary?.succeededCount == 120)
        #expect(summary.payload.subtype == .summary)
        let ext = try v.verifyNotification(pki.sign(TestPayloads.externalPurchaseTokenNotification(signedDate: Fixtures.t0)))
        #expect(ext.payload.externalPurchaseToken?.environment == .sandbox)
        let app = pki.sign(TestPayloads.appTransaction(receiptCreationDate: Fixtures.t0, appTransactionId: "704289123456"))
        let rescind = try v.verifyNotification(
            pki.sign(TestPayloads.rescindConsentNotification(signedAppTransactionInfo: app, signedDate: Fixtures.t0)))
        #expect(rescind.appTransaction?.appTransactionId == "704289123456")
        #expect(rescind.payload.notificationType == .rescindConsent)
    }

    @Test func bytesAndStringInputsAgree() throws {
        let v = Fixtures.verifier()
        let jws = Fixtures.pki.sign(Fixtures.transaction())
        let a = try v.verify(jws)
        let b = try v.verify(Array(jws.utf8))
        let c = try v.verify(Data(jws.utf8))
        #expect(a == b && b == c)
    }

    @Test func productionNeedsMatchingAppAppleIdOnlyWhereApplePutsOne() throws {
        let v = Fixtures.verifier(environments: [.production])
        // Transactions carry no appAppleId: bundle id and environment only.
        _ = try v.verifyTransaction(Fixtures.pki.sign(Fixtures.transaction(env: .production)))
        let app = TestPayloads.appTransaction(receiptType: .production, receiptCreationDate: Fixtures.t0)
        _ = try v.verifyAppTransaction(Fixtures.pki.sign(app))
    }

    @Test func validationTimeNowUsesTheClock() throws {
        let expiredLeaf = try Fixtures.pki.withLeafValidity(
            Date(timeIntervalSince1970: 1_700_000_000), Date(timeIntervalSince1970: 1_760_000_000))
        let jws = expiredLeaf.sign(Fixtures.transaction())  // signedDate 2025-06 inside the leaf window
        let offline = Fixtures.verifier(expiredLeaf)
        _ = try offline.verify(jws)
        let online = Fixtures.verifier(expiredLeaf, validationTime: .now, now: { 1_770_000_000_000 })
        expectRejected(.certificateNotValidAtTime) { () throws(VerificationError) in _ = try online.verify(jws) }
        let onlineEarly = Fixtures.verifier(expiredLeaf, validationTime: .now, now: { 1_750_000_000_000 })
        _ = try onlineEarly.verify(jws)
    }
}

@Suite struct PolicyConfiguration {
    @Test func productionWithoutAppAppleIdIsAConfigurationError() throws {
        #expect(throws: PolicyError.self) {
            try Fixtures.pki.policy(appAppleId: nil, environments: [.production])
        }
        do {
            _ = try Fixtures.pki.policy(appAppleId: nil, environments: [.production, .sandbox])
            Issue.record("expected a PolicyError")
        } catch {
            #expect(error.message.contains("appAppleId"))
        }
        _ = try Fixtures.pki.policy(appAppleId: nil, environments: [.sandbox])
    }

    @Test func unsignedEnvironmentsNeedTheDevelopmentOption() throws {
        #expect(throws: PolicyError.self) { try Fixtures.pki.policy(environments: [.xcode]) }
        _ = try Fixtures.pki.policy(environments: [.xcode], allowUnsignedEnvironments: true)
    }

    @Test func rootsLoadFromDERAndPEM() throws {
        let der = try TrustedRoot.load(derOrPEM: Fixtures.pki.rootDER)
        let pem = try TrustedRoot.load(derOrPEM: Array(Fixtures.pki.rootPEM.utf8))
        #expect(der.count == 1 && pem.count == 1)
        #expect(der[0].fingerprint == pem[0].fingerprint)
        #expect(throws: PolicyError.self) { try TrustedRoot.load(derOrPEM: Array("not a certificate".utf8)) }
    }

    @Test func severalRootsAreAccepted() throws {
        let other = try TestPKI()
        let policy = try VerificationPolicy(
            rootDERs: [other.rootDER, Fixtures.pki.rootDER], bundleId: Fixtures.bundleId, appAppleId: Fixtures.appAppleId,
            environments: [.sandbox])
        let v = SignedDataVerifier(policy: policy)
        _ = try v.verify(Fixtures.pki.sign(Fixtures.transaction()))
        _ = try v.verify(other.sign(Fixtures.transaction()))
    }
}
