import AppStoreVerification
import Crypto
import Foundation
import Testing

@testable import EntitlementDomain

// Mapping table tests: one per Apple notification type/subtype (docs/entitlement-mapping.md), plus client inputs.

private let day: Int64 = 86_400_000
private let t0: Int64 = 1_760_000_000_000
private let source = EventSource(topic: "appstore.raw", partition: 2, offset: 41, inputKind: "notification")

private func txn(
    productId: String = "com.example.pro.monthly", type: String = "Auto-Renewable Subscription",
    transactionId: String = "2000000000000002", original: String = "2000000000000001",
    purchase: Int64 = t0, expires: Int64? = t0 + 30 * day, quantity: Int64 = 1,
    revocationDate: Int64? = nil, revocationType: String? = nil, revocationPercentage: Int64? = nil,
    ownership: String = "PURCHASED", token: String? = "7c3e8d7a-0000-4000-8000-000000000001",
    isUpgraded: Bool? = nil, signedDate: Int64 = t0 + 1000
) -> JSONValue {
    var o: [String: JSONValue] = [
        "productId": .string(productId), "type": .string(type), "transactionId": .string(transactionId),
        "originalTransactionId": .string(original), "webOrderLineItemId": .string("wol-\(transactionId)"),
        "bundleId": .string("com.example.app"), "purchaseDate": .integer(purchase), "quantity": .integer(quantity),
        "inAppOwnershipType": .string(ownership), "environment": .string("Sandbox"), "signedDate": .integer(signedDate),
        "storefront": .string("JPN"), "someFutureAppleField": .string("kept"),
    ]
    if let expires { o["expiresDate"] = .integer(expires) }
    if let revocationDate { o["revocationDate"] = .integer(revocationDate); o["revocationReason"] = .integer(0) }
    if let revocationType { o["revocationType"] = .string(revocationType) }
    if let revocationPercentage { o["revocationPercentage"] = .integer(revocationPercentage) }
    if let token { o["appAccountToken"] = .string(token) }
    if let isUpgraded { o["isUpgraded"] = .bool(isUpgraded) }
    return .object(o)
}

private func renewal(grace: Int64? = nil) -> JSONValue {
    var o: [String: JSONValue] = [
        "originalTransactionId": .string("2000000000000001"), "autoRenewProductId": .string("com.example.pro.monthly"),
        "productId": .string("com.example.pro.monthly"), "autoRenewStatus": .integer(1),
        "environment": .string("Sandbox"), "signedDate": .integer(t0 + 1000),
    ]
    if let grace { o["gracePeriodExpiresDate"] = .integer(grace) }
    return .object(o)
}

private func notification(_ type: String, _ subtype: String?, transaction: JSONValue? = txn(), renewalInfo: JSONValue? = renewal(), appTransaction: JSONValue? = nil, signedDate: Int64 = t0 + 2000, uuid: String = "0b8e1f0c-1111-4222-8333-444455556666", extra: [String: JSONValue] = [:], withoutData: Bool = false) -> VerifiedItem {
    var body: [String: JSONValue] = [
        "notificationType": .string(type), "notificationUUID": .string(uuid), "version": .string("2.0"),
        "signedDate": .integer(signedDate),
        "data": .object(["bundleId": .string("com.example.app"), "appAppleId": .integer(1_234_567_890),
                         "environment": .string("Sandbox"), "status": .integer(1)]),
    ]
    if let subtype { body["subtype"] = .string(subtype) }
    for (k, v) in extra { body[k] = v }
    if withoutData { body["data"] = nil }
    return .notification(VerifiedNotification(
        payload: ResponseBodyV2DecodedPayload(raw: .object(body)), transaction: transaction.map(JWSTransactionDecodedPayload.init(raw:)),
        renewalInfo: renewalInfo.map(JWSRenewalInfoDecodedPayload.init(raw:)), appTransaction: appTransaction.map(AppTransaction.init(raw:))))
}

/// Decoded JSON of a client-sent JWS, taken as verified (the mapper trusts its input).
private func decoded(_ kind: VerifiedItem.Kind, _ json: JSONValue) -> VerifiedItem {
    switch kind {
    case .transaction: return .transaction(VerifiedTransaction(payload: JWSTransactionDecodedPayload(raw: json)))
    case .renewalInfo: return .renewalInfo(VerifiedRenewalInfo(payload: JWSRenewalInfoDecodedPayload(raw: json)))
    case .appTransaction: return .appTransaction(VerifiedAppTransaction(payload: AppTransaction(raw: json)))
    case .notification, .appReceipt: fatalError("notifications: notification(...); receipts: ReceiptMappingTests")
    }
}

private let catalogue = try! ProductCatalogue.parse("""
products:
  com.example.pro.monthly: { type: auto-renewable, entitlement: pro }
  com.example.premium.monthly: { type: auto-renewable, entitlement: premium }
  com.example.lifetime: { type: non-consumable, entitlement: lifetime }
  com.example.pass.30d: { type: non-renewing, duration: P30D, entitlement: pro }
  com.example.tickets.10: { type: consumable, units: 10, entitlement: tickets }
""")

private func one(_ input: VerifiedItem, mapper: EntitlementMapper = EntitlementMapper(catalogue: catalogue)) throws -> EntitlementEvent {
    let events = try mapper.events(for: input, source: source, verifiedAt: t0 + 5000)
    #expect(events.count == 1)
    return try #require(events.first)
}

struct NotificationMappingTests {
    // (type, subtype, expected kind, expected effect, expected reason)
    static let table: [(String, String?, String, EntitlementEffect, String)] = [
        ("SUBSCRIBED", "INITIAL_BUY", "SUBSCRIPTION_STARTED", .grant, "initial_buy"),
        ("SUBSCRIBED", "RESUBSCRIBE", "SUBSCRIPTION_STARTED", .grant, "resubscribe"),
        ("DID_RENEW", nil, "SUBSCRIPTION_RENEWED", .extend, "renewal"),
        ("DID_RENEW", "BILLING_RECOVERY", "SUBSCRIPTION_RECOVERED", .grant, "billing_recovery"),
        ("DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_DISABLED", "AUTO_RENEW_DISABLED", .state, "auto_renew_disabled"),
        ("DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_ENABLED", "AUTO_RENEW_ENABLED", .state, "auto_renew_enabled"),
        ("DID_CHANGE_RENEWAL_PREF", "UPGRADE", "PLAN_UPGRADED", .grant, "upgrade"),
        ("DID_CHANGE_RENEWAL_PREF", "DOWNGRADE", "PLAN_CHANGE_SCHEDULED", .state, "downgrade"),
        ("DID_CHANGE_RENEWAL_PREF", nil, "PLAN_CHANGE_CANCELLED", .state, "plan_change_cancelled"),
        ("OFFER_REDEEMED", nil, "OFFER_REDEEMED", .extend, "offer_redeemed"),
        ("OFFER_REDEEMED", "UPGRADE", "PLAN_UPGRADED", .grant, "offer_upgrade"),
        ("OFFER_REDEEMED", "DOWNGRADE", "PLAN_CHANGE_SCHEDULED", .state, "offer_downgrade"),
        ("DID_FAIL_TO_RENEW", nil, "BILLING_RETRY_STARTED", .revoke, "billing_retry"),
        ("DID_FAIL_TO_RENEW", "GRACE_PERIOD", "GRACE_PERIOD_STARTED", .extend, "grace_period"),
        ("GRACE_PERIOD_EXPIRED", nil, "GRACE_PERIOD_ENDED", .revoke, "grace_period_expired"),
        ("EXPIRED", "VOLUNTARY", "SUBSCRIPTION_EXPIRED", .revoke, "voluntary"),
        ("EXPIRED", "BILLING_RETRY", "SUBSCRIPTION_EXPIRED", .revoke, "billing_retry_exhausted"),
        ("EXPIRED", "PRICE_INCREASE", "SUBSCRIPTION_EXPIRED", .revoke, "price_increase_not_consented"),
        ("EXPIRED", "PRODUCT_NOT_FOR_SALE", "SUBSCRIPTION_EXPIRED", .revoke, "product_not_for_sale"),
        ("EXPIRED", nil, "SUBSCRIPTION_EXPIRED", .revoke, "other"),
        ("PRICE_INCREASE", "PENDING", "PRICE_INCREASE_PENDING", .state, "price_increase_pending"),
        ("PRICE_INCREASE", "ACCEPTED", "PRICE_INCREASE_ACCEPTED", .state, "price_increase_accepted"),
        ("REFUND", nil, "REFUNDED", .revoke, "refund"),
        ("REFUND_DECLINED", nil, "REFUND_DECLINED", .info, "refund_declined"),
        ("REFUND_REVERSED", nil, "REFUND_REVERSED", .restore, "refund_reversed"),
        ("CONSUMPTION_REQUEST", nil, "REFUND_REQUESTED", .info, "consumption_request"),
        ("REVOKE", nil, "FAMILY_ACCESS_REVOKED", .revoke, "family_revoke"),
        ("RENEWAL_EXTENDED", nil, "RENEWAL_DATE_EXTENDED", .extend, "renewal_extended"),
        ("RENEWAL_EXTENSION", "FAILURE", "RENEWAL_EXTENSION_FAILED", .info, "renewal_extension_failure"),
        ("ONE_TIME_CHARGE", nil, "ONE_TIME_PURCHASED", .grant, "one_time_charge"),
        ("TEST", nil, "TEST_RECEIVED", .info, "test"),
        ("METADATA_UPDATE", nil, "AC_METADATA_UPDATED", .info, "metadata_update"),
        ("MIGRATION", nil, "AC_SUBSCRIPTION_MIGRATED", .state, "migration"),
        ("PRICE_CHANGE", nil, "AC_PRICE_CHANGED", .state, "price_change"),
    ]

    @Test(arguments: 0..<table.count)
    func mapsTypeAndSubtype(_ index: Int) throws {
        let (type, subtype, kind, effect, reason) = Self.table[index]
        let e = try one(notification(type, subtype))
        #expect(e.kind == kind, "\(type)/\(subtype ?? "-")")
        #expect(e.effect == effect, "\(type)/\(subtype ?? "-")")
        #expect(e.reason == reason)
        #expect(e.schema == "entitlement-event/v1")
        #expect(e.notification?.type == type)
        #expect(e.notification?.subtype == subtype)
        #expect(e.notification?.uuid == "0b8e1f0c-1111-4222-8333-444455556666")
        #expect(e.signedDate == t0 + 2000, "ordering date is the notification's signedDate")
        #expect(e.environment == "Sandbox")
        #expect(e.bundleId == "com.example.app")
        #expect(e.appAppleId == 1_234_567_890)
        #expect(e.originalTransactionId == "2000000000000001")
        #expect(e.subject == "7c3e8d7a-0000-4000-8000-000000000001", "appAccountToken is the subject when present")
        #expect(e.source == source)
        #expect(e.transaction?["someFutureAppleField"]?.stringValue == "kept", "unknown Apple fields are kept")
        #expect(e.eventId.count == 32)
        #expect(e.eventId == Self.eventId(e, key: "0b8e1f0c-1111-4222-8333-444455556666"))
    }

    /// The event id as written down: the first 16 bytes of SHA-256 over the `|`-joined fields, in lowercase hex. It
    /// must never change: a replayed input has to get the same id for the sink to recognize it.
    static func eventId(_ e: EntitlementEvent, key: String) -> String {
        let material = ["entitlement-event/v1", e.kind, e.effect.rawValue, e.environment, key, e.productId ?? "",
                        e.transactionId ?? "", e.originalTransactionId ?? "", String(e.signedDate)].joined(separator: "|")
        return SHA256.hash(data: Data(material.utf8)).prefix(16).map { String(format: "%02x", $0) }.joined()
    }

    @Test func everyAppleTypeIsKnown() {
        // The 23 types of NotificationTypeV2 in Apple's library.
        let types = ["SUBSCRIBED", "DID_CHANGE_RENEWAL_PREF", "DID_CHANGE_RENEWAL_STATUS", "OFFER_REDEEMED", "DID_RENEW",
                     "EXPIRED", "DID_FAIL_TO_RENEW", "GRACE_PERIOD_EXPIRED", "PRICE_INCREASE", "REFUND", "REFUND_DECLINED",
                     "CONSUMPTION_REQUEST", "RENEWAL_EXTENDED", "REVOKE", "TEST", "RENEWAL_EXTENSION", "REFUND_REVERSED",
                     "EXTERNAL_PURCHASE_TOKEN", "ONE_TIME_CHARGE", "RESCIND_CONSENT", "METADATA_UPDATE", "MIGRATION", "PRICE_CHANGE"]
        #expect(types.count == 23)
        let covered = Set(Self.table.map(\.0) + ["RENEWAL_EXTENSION", "EXTERNAL_PURCHASE_TOKEN", "RESCIND_CONSENT"])
        #expect(covered == Set(types))
    }

    @Test func renewalExtensionSummaryHasNoTransaction() throws {
        let summary: JSONValue = .object(["requestIdentifier": .string("r-1"), "productId": .string("com.example.pro.monthly"),
                                          "succeededCount": .integer(120), "failedCount": .integer(2),
                                          "environment": .string("Sandbox"), "bundleId": .string("com.example.app"), "appAppleId": .integer(1)])
        let input = notification("RENEWAL_EXTENSION", "SUMMARY", transaction: nil, renewalInfo: nil, extra: ["summary": summary], withoutData: true)
        let e = try one(input)
        #expect(e.kind == "RENEWAL_EXTENSION_SUMMARY")
        #expect(e.effect == .info)
        #expect(e.environment == "Sandbox")
        #expect(e.details?["summary"]?["succeededCount"]?.int64Value == 120)
    }

    @Test func externalPurchaseTokenUnreported() throws {
        let token: JSONValue = .object(["externalPurchaseId": .string("ext-1"), "tokenCreationDate": .integer(t0),
                                        "appAppleId": .integer(55), "bundleId": .string("com.example.app")])
        let e = try one(notification("EXTERNAL_PURCHASE_TOKEN", "UNREPORTED", transaction: nil, renewalInfo: nil, extra: ["externalPurchaseToken": token]))
        #expect(e.kind == "EXTERNAL_TOKEN_UNREPORTED")
        #expect(e.effect == .info)
        #expect(e.details?["externalPurchaseToken"]?["externalPurchaseId"]?.stringValue == "ext-1")
    }

    @Test func rescindConsentCarriesAppTransaction() throws {
        let app: JSONValue = .object(["appTransactionId": .string("app-tx-9"), "bundleId": .string("com.example.app"),
                                      "receiptType": .string("Sandbox"), "receiptCreationDate": .integer(t0)])
        let input = notification("RESCIND_CONSENT", nil, transaction: nil, renewalInfo: nil, appTransaction: app)
        let e = try one(input)
        #expect(e.kind == "CONSENT_RESCINDED")
        #expect(e.effect == .info)
        #expect(e.appTransaction?["appTransactionId"]?.stringValue == "app-tx-9")
    }

    @Test func unknownTypeIsKeptAsInfo() throws {
        let e = try one(notification("SOMETHING_NEW_FROM_APPLE", "SHINY"))
        #expect(e.kind == "UNKNOWN_NOTIFICATION")
        #expect(e.effect == .info)
        #expect(e.reason == "SOMETHING_NEW_FROM_APPLE/SHINY")
        #expect(e.notification?.type == "SOMETHING_NEW_FROM_APPLE")
        let e2 = try one(notification("EXTERNAL_PURCHASE_TOKEN", "ACTIVE_TOKEN_REMINDER", transaction: nil, renewalInfo: nil))
        #expect(e2.kind == "UNKNOWN_NOTIFICATION", "a known type with an unknown subtype never grants or revokes")
        let e3 = try one(notification("SUBSCRIBED", "SOME_FUTURE_SUBTYPE"))
        #expect(e3.effect == .info)
    }

    @Test func gracePeriodExtendsToGraceExpiry() throws {
        let e = try one(notification("DID_FAIL_TO_RENEW", "GRACE_PERIOD", renewalInfo: renewal(grace: t0 + 46 * day)))
        #expect(e.validUntil == t0 + 46 * day)
    }

    @Test func subscriptionWindowComesFromTheSignedTransaction() throws {
        let e = try one(notification("SUBSCRIBED", "INITIAL_BUY"))
        #expect(e.validFrom == t0)
        #expect(e.validUntil == t0 + 30 * day)
        #expect(e.entitlement == "pro")
        #expect(e.productType == "Auto-Renewable Subscription")
    }

    @Test func refundOfSubscriptionEndsAtRevocationDate() throws {
        let e = try one(notification("REFUND", nil, transaction: txn(revocationDate: t0 + 3 * day, revocationType: "REFUND_FULL")))
        #expect(e.effect == .revoke)
        #expect(e.revocationDate == t0 + 3 * day)
        #expect(e.validUntil == t0 + 3 * day)
        #expect(e.transactionId == "2000000000000002", "refunds arrive on the same transactionId")
    }

    @Test func consumableRefundDebitsUnitsTimesQuantity() throws {
        let bought = txn(productId: "com.example.tickets.10", type: "Consumable", expires: nil, quantity: 3)
        let grant = try one(notification("ONE_TIME_CHARGE", nil, transaction: bought, renewalInfo: nil))
        #expect(grant.effect == .grant)
        #expect(grant.units == 30)
        #expect(grant.validUntil == nil)
        let refunded = txn(productId: "com.example.tickets.10", type: "Consumable", expires: nil, quantity: 3, revocationDate: t0 + day, revocationType: "REFUND_FULL")
        let debit = try one(notification("REFUND", nil, transaction: refunded, renewalInfo: nil))
        #expect(debit.effect == .revoke)
        #expect(debit.units == 30)
        let partial = txn(productId: "com.example.tickets.10", type: "Consumable", expires: nil, quantity: 3, revocationDate: t0 + day, revocationType: "REFUND_PRORATED", revocationPercentage: 50_000)
        let half = try one(notification("REFUND", nil, transaction: partial, renewalInfo: nil))
        #expect(half.units == 30, "the event carries the purchase's units; the ledger applies the percentage")
        #expect(half.revocationPercentage == 50_000)
        let reversed = try one(notification("REFUND_REVERSED", nil, transaction: bought, renewalInfo: nil))
        #expect(reversed.effect == .restore)
        #expect(reversed.units == 30)
        #expect(Set([grant.eventId, debit.eventId, reversed.eventId]).count == 3)
    }

    @Test func familySharedRevokeOnlyTouchesTheFamilyMember() throws {
        let shared = txn(productId: "com.example.lifetime", type: "Non-Consumable", transactionId: "3000000000000009", original: "3000000000000009", expires: nil, revocationDate: t0 + day, revocationType: "FAMILY_REVOKE", ownership: "FAMILY_SHARED", token: nil)
        let e = try one(notification("REVOKE", nil, transaction: shared, renewalInfo: nil))
        #expect(e.kind == "FAMILY_ACCESS_REVOKED")
        #expect(e.effect == .revoke)
        #expect(e.ownershipType == "FAMILY_SHARED")
        #expect(e.subject == "3000000000000009", "the family member's own transaction is the subject")
        #expect(e.entitlement == "lifetime")
    }

    @Test func upgradeGrantsTheNewProduct() throws {
        let upgraded = txn(productId: "com.example.premium.monthly", transactionId: "2000000000000005", purchase: t0 + 10 * day, expires: t0 + 40 * day)
        let e = try one(notification("DID_CHANGE_RENEWAL_PREF", "UPGRADE", transaction: upgraded))
        #expect(e.kind == "PLAN_UPGRADED")
        #expect(e.effect == .grant)
        #expect(e.productId == "com.example.premium.monthly")
        #expect(e.entitlement == "premium")
        #expect(e.validFrom == t0 + 10 * day)
        #expect(e.originalTransactionId == "2000000000000001", "same subscription, new tier")
    }

    @Test func nonRenewingUsesCatalogueDuration() throws {
        let pass = txn(productId: "com.example.pass.30d", type: "Non-Renewing Subscription", expires: nil)
        let e = try one(notification("ONE_TIME_CHARGE", nil, transaction: pass, renewalInfo: nil))
        #expect(e.validFrom == t0)
        #expect(e.validUntil == t0 + 30 * day)
    }

    @Test func eventIdsAreDeterministic() throws {
        let a = try one(notification("DID_RENEW", nil))
        let b = try one(notification("DID_RENEW", nil))
        #expect(a.eventId == b.eventId)
        let c = try one(notification("DID_RENEW", nil, uuid: "another-uuid"))
        #expect(c.eventId != a.eventId)
        // The formula is part of the contract (ids stored by earlier releases must match on replay): the first 16
        // bytes of SHA-256 over the "|"-joined material, as lowercase hex; the key of a notification is its UUID.
        let material = [
            "entitlement-event/v1", a.kind, a.effect.rawValue, a.environment, "0b8e1f0c-1111-4222-8333-444455556666",
            a.productId ?? "", a.transactionId ?? "", a.originalTransactionId ?? "", String(a.signedDate),
        ].joined(separator: "|")
        let expected = SHA256.hash(data: Array(material.utf8)).prefix(16)
            .map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
        #expect(a.eventId == expected)
    }

    @Test func unknownProductIsRejectedWhenRequired() throws {
        let strict = EntitlementMapper(catalogue: catalogue, requireKnownProducts: true)
        #expect(throws: DomainRejection.self) {
            _ = try strict.events(for: notification("SUBSCRIBED", "INITIAL_BUY", transaction: txn(productId: "com.evil.free")), source: source, verifiedAt: 0)
        }
        let lax = EntitlementMapper(catalogue: catalogue, requireKnownProducts: false)
        let e = try one(notification("SUBSCRIBED", "INITIAL_BUY", transaction: txn(productId: "com.other")), mapper: lax)
        #expect(e.entitlement == "com.other")
    }

    @Test func eventsRoundTripThroughJSON() throws {
        let e = try one(notification("REFUND", nil, transaction: txn(revocationDate: t0 + day, revocationType: "REFUND_FULL")))
        let data = try JSONEncoder().encode(e)
        let back = try JSONDecoder().decode(EntitlementEvent.self, from: data)
        #expect(back == e)
    }
}

struct ClientInputMappingTests {
    let mapper = EntitlementMapper(catalogue: catalogue)
    let clientSource = EventSource(topic: "appstore.raw", partition: 0, offset: 7, inputKind: "transaction")

    @Test func activeSubscriptionIsObservedAndGranted() throws {
        let e = try #require(try mapper.events(for: decoded(.transaction, txn()), source: clientSource, verifiedAt: t0).first)
        #expect(e.kind == "SUBSCRIPTION_OBSERVED")
        #expect(e.effect == .grant)
        #expect(e.signedDate == t0 + 1000, "client data orders by its own signedDate")
        #expect(e.notification == nil)
    }

    @Test func expiredSubscriptionOnlyInforms() throws {
        let old = txn(purchase: t0 - 60 * day, expires: t0 - 30 * day)
        let e = try #require(try mapper.events(for: decoded(.transaction, old), source: clientSource, verifiedAt: t0).first)
        #expect(e.effect == .info)
    }

    @Test func revokedTransactionIsARefundOrFamilyRevoke() throws {
        let refunded = txn(revocationDate: t0 + day, revocationType: "REFUND_FULL")
        let e = try #require(try mapper.events(for: decoded(.transaction, refunded), source: clientSource, verifiedAt: t0).first)
        #expect(e.kind == "REFUNDED")
        #expect(e.effect == .revoke)
        let fam = txn(revocationDate: t0 + day, revocationType: "FAMILY_REVOKE", ownership: "FAMILY_SHARED")
        let f = try #require(try mapper.events(for: decoded(.transaction, fam), source: clientSource, verifiedAt: t0).first)
        #expect(f.kind == "FAMILY_ACCESS_REVOKED")
        // The refund of a transaction must not share the purchase's event id (dedupe on transactionId alone drops refunds).
        let purchase = try #require(try mapper.events(for: decoded(.transaction, txn()), source: clientSource, verifiedAt: t0).first)
        #expect(purchase.eventId != e.eventId)
    }

    @Test func upgradedTransactionRevokesTheOldTier() throws {
        let e = try #require(try mapper.events(for: decoded(.transaction, txn(isUpgraded: true)), source: clientSource, verifiedAt: t0).first)
        #expect(e.kind == "PLAN_UPGRADED")
        #expect(e.effect == .revoke)
        #expect(e.productId == "com.example.pro.monthly")
    }

    @Test func consumablePurchaseCreditsCatalogueUnits() throws {
        let t = txn(productId: "com.example.tickets.10", type: "Consumable", expires: nil, quantity: 2)
        let e = try #require(try mapper.events(for: decoded(.transaction, t), source: clientSource, verifiedAt: t0).first)
        #expect(e.kind == "ONE_TIME_PURCHASED")
        #expect(e.units == 20)
        #expect(e.entitlement == "tickets")
    }

    @Test func renewalInfoAndAppTransaction() throws {
        let r = try #require(try mapper.events(for: decoded(.renewalInfo, renewal()), source: clientSource, verifiedAt: t0).first)
        #expect(r.kind == "RENEWAL_INFO_OBSERVED")
        #expect(r.effect == .state)
        let app: JSONValue = .object(["appTransactionId": .string("a-1"), "receiptType": .string("Sandbox"), "receiptCreationDate": .integer(t0), "bundleId": .string("com.example.app")])
        let a = try #require(try mapper.events(for: decoded(.appTransaction, app), source: clientSource, verifiedAt: t0).first)
        #expect(a.kind == "APP_TRANSACTION_OBSERVED")
        #expect(a.effect == .info)
        #expect(a.subject == "a-1")
        #expect(a.signedDate == t0)
    }

    @Test func deviceVerification() throws {
        let nonce = "D75A8E3C-1234-4ABC-9DEF-0123456789AB"
        let device = "6F1C2B9A-ABCD-4EF0-8123-456789ABCDEF"
        let digest = sha384Base64(nonce.lowercased() + device.lowercased())
        var fields = txn().objectValue!
        fields["deviceVerificationNonce"] = .string(nonce.lowercased())
        fields["deviceVerification"] = .string(digest)
        try EntitlementMapper.checkDeviceVerification(transaction: JWSTransactionDecodedPayload(raw: .object(fields)), deviceVerificationId: device)
        #expect(throws: DomainRejection.self) {
            try EntitlementMapper.checkDeviceVerification(transaction: JWSTransactionDecodedPayload(raw: .object(fields)), deviceVerificationId: "00000000-0000-4000-8000-000000000000")
        }
        #expect(throws: DomainRejection.self) {
            try EntitlementMapper.checkDeviceVerification(transaction: JWSTransactionDecodedPayload(raw: txn()), deviceVerificationId: device)
        }
    }
}

struct CatalogueTests {
    @Test func parsesMapAndListLayouts() throws {
        #expect(catalogue["com.example.tickets.10"]?.units == 10)
        #expect(catalogue["com.example.pass.30d"]?.duration?.days == 30)
        let list = try ProductCatalogue.parse("""
        {"products": [{"productId": "a", "type": "Consumable", "units": 5}]}
        """)
        #expect(list["a"]?.kind == .consumable)
        #expect(list["a"]?.entitlement == "a")
    }

    @Test func rejectsBadCatalogues() {
        #expect(throws: (any Error).self) { try ProductCatalogue.parse("products: { x: { type: weird } }") }
        #expect(throws: (any Error).self) { try ProductCatalogue.parse("products: { x: { type: non-renewing } }") }
        #expect(throws: (any Error).self) { try ProductCatalogue.parse("products: { x: { type: consumable, units: -1 } }") }
        #expect(throws: (any Error).self) { try ProductCatalogue.parse("nothing: here") }
        // A map or list as a mapping key crashed Yams' constructor (the catalogue fuzz target found it): refused.
        for text in ["products:\n  ? {a: 1}\n  : {type: consumable}\n", "? [a]\n: 1\nproducts: {}\n"] {
            do {
                _ = try ProductCatalogue.parse(text)
                Issue.record("accepted \(text)")
            } catch {
                #expect("\(error)".contains("mapping key must be a string"), "\(error)")
            }
        }
    }

    @Test func isoDurations() {
        #expect(ISODuration("P1M")?.adding(toMillis: 1_735_689_600_000) == 1_738_368_000_000) // 2025-01-01 -> 2025-02-01
        #expect(ISODuration("PT12H")?.hours == 12)
        #expect(ISODuration("P") == nil)
        #expect(ISODuration("P1X") == nil)
        #expect(ISODuration("1M") == nil)
    }
}

private func sha384Base64(_ s: String) -> String {
    Data(SHA384.hash(data: Array(s.utf8))).base64EncodedString()
}
