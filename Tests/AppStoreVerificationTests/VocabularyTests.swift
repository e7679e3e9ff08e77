import AppStoreVerification
import Foundation
import FleetTestPKI
import Testing

@Suite struct KindVocabulary {
    @Test func oneKindNamesEveryVerifiedItem() throws {
        #expect(VerifiedItem.Kind.allCases.map(\.rawValue) == [
            "notification", "transaction", "renewalInfo", "appTransaction", "appReceipt",
        ])
        let v = Fixtures.verifier()
        let item = try v.verify(Fixtures.pki.sign(Fixtures.transaction()))
        #expect(item.itemKind == .transaction)
        #expect(item.kind == VerifiedItem.Kind.transaction.rawValue)
        #expect(item.transactionPayload?.transactionId == "2000000000000001")
        let receipt = VerifiedItem.appReceipt(VerifiedAppReceipt(payload: AppReceipt()))
        #expect(receipt.itemKind == .appReceipt)
        #expect(receipt.transactionPayload == nil)
    }

    @Test func aNotificationCarriesItsTransaction() throws {
        let tx = Fixtures.transaction()
        let note = Fixtures.pki.signNotification(type: .didRenew, transaction: tx, signedDate: Fixtures.t0)
        let item = try Fixtures.verifier().verify(note)
        #expect(item.itemKind == .notification)
        #expect(item.transactionPayload?.raw == tx)
    }
}

@Suite struct TypedAccessors {
    @Test func deviceVerificationFieldsAreTyped() {
        let t = JWSTransactionDecodedPayload(raw: .object([
            "deviceVerification": .string("abc="), "deviceVerificationNonce": .string("n-1"), "isUpgraded": .bool(true),
            "price": .integer(4990), "currency": .string("EUR"), "revocationType": .string("REFUND_PRORATED"),
            "revocationPercentage": .integer(50_000),
        ]))
        #expect(t.deviceVerification == "abc=")
        #expect(t.deviceVerificationNonce == "n-1")
        #expect(t.isUpgraded == true)
        #expect(t.price == 4990 && t.currency == "EUR")
        #expect(t.revocationType == .refundProrated && t.revocationPercentage == 50_000)
        #expect(JWSTransactionDecodedPayload(raw: .object(["deviceVerification": .integer(1)])).deviceVerification == nil)
    }

    @Test func appTransactionKeepsAnEnvironmentMemberApartFromReceiptType() {
        let a = AppTransaction(raw: .object(["receiptType": .string("Sandbox"), "environment": .string("Production")]))
        #expect(a.receiptType == .sandbox)
        #expect(a.environment == .production)
        #expect(AppTransaction(raw: .object([:])).environment == nil)
    }

    @Test func receiptEntryProductTypeIsApplesTransactionType() {
        var entry = AppReceiptInApp()
        var types: [ProductType?] = []
        for field in [nil, 0, 1, 2, 3, 4] as [Int64?] {
            entry.productType = field
            types.append(entry.type)
        }
        #expect(types == [nil, .nonConsumable, .consumable, .nonRenewing, .autoRenewable, nil])
        #expect(ProductType.autoRenewable.rawValue == "Auto-Renewable Subscription")
    }
}

@Suite struct EpochMillisTests {
    @Test func millisecondsSurviveTheRoundTripThroughDate() {
        // 1_760_000_000_123 / 1000 is not exact in binary: truncating date * 1000 would give ...122.
        for ms: Int64 in [0, 1, 999, 1_760_000_000_123, 1_760_000_000_999, 4_102_444_799_999] {
            #expect(EpochMillis.millis(EpochMillis.date(ms)) == ms, "\(ms)")
        }
        #expect(EpochMillis.millis(Date(timeIntervalSince1970: 1.0004)) == 1000)
        #expect(EpochMillis.millis(Date(timeIntervalSince1970: 1.0006)) == 1001)
    }

    @Test func nowIsTheClockInMilliseconds() {
        let before = Date().timeIntervalSince1970 * 1000
        let now = EpochMillis.now()
        let after = Date().timeIntervalSince1970 * 1000
        #expect(Double(now) >= before.rounded(.down) && Double(now) <= after.rounded(.up))
        #expect(SignedDataVerifier.systemNowMillis() >= now)
    }
}
