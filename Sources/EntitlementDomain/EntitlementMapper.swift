import AppStoreVerification
import Crypto
import Foundation

/// A verified input, as the mapper sees it: the decoded payload of the outer JWS and the verified nested ones.
/// Everything here must already have passed the verification core; the mapper trusts it.
public struct VerifiedInput: Sendable {
    public enum Kind: String, Sendable, Codable {
        case notification, transaction, renewalInfo, appTransaction, appReceipt
    }

    public var kind: Kind
    /// The outer decoded payload (notification body, transaction, renewal info or AppTransaction).
    public var payload: JSONValue
    public var transaction: JSONValue?
    public var renewalInfo: JSONValue?
    public var appTransaction: JSONValue?

    public init(kind: Kind, payload: JSONValue, transaction: JSONValue? = nil, renewalInfo: JSONValue? = nil, appTransaction: JSONValue? = nil) {
        self.kind = kind
        self.payload = payload
        self.transaction = transaction
        self.renewalInfo = renewalInfo
        self.appTransaction = appTransaction
    }
}

/// Why a verified input is still refused by the domain (sent to the rejected topic like a verification failure).
public struct DomainRejection: Error, Sendable, Equatable {
    public var reason: RejectionReason
    public var detail: String

    public init(reason: RejectionReason, detail: String) {
        self.reason = reason
        self.detail = detail
    }
}

extension RejectionReason {
    /// `--require-known-products` is on and the productId is not in the catalogue.
    public static let unknownProduct = RejectionReason(rawValue: "UNKNOWN_PRODUCT")
    /// The `device-verification-id` header does not match the transaction's `deviceVerification`.
    public static let deviceVerificationMismatch = RejectionReason(rawValue: "DEVICE_VERIFICATION_MISMATCH")
}

/// Turns verified App Store data into entitlement events, following `docs/entitlement-mapping.md`:
/// the signed transaction and renewal info say what access is; notification type/subtype say why.
public struct EntitlementMapper: Sendable {
    public var catalogue: ProductCatalogue
    public var requireKnownProducts: Bool

    public init(catalogue: ProductCatalogue = ProductCatalogue(), requireKnownProducts: Bool = false) {
        self.catalogue = catalogue
        self.requireKnownProducts = requireKnownProducts
    }

    /// The Kafka key for an event: its ordering key (originalTransactionId, else transactionId, else appTransactionId).
    public static func partitionKey(for event: EntitlementEvent) -> String {
        event.originalTransactionId ?? event.transactionId
            ?? event.appTransaction?["appTransactionId"]?.stringValue ?? event.notification?.uuid ?? event.eventId
    }

    // MARK: - Entry point

    public func events(for input: VerifiedInput, source: EventSource, verifiedAt: Int64) throws(DomainRejection) -> [EntitlementEvent] {
        switch input.kind {
        case .notification: return try notificationEvents(input, source: source, verifiedAt: verifiedAt)
        case .transaction: return try clientTransactionEvents(input.payload, source: source, verifiedAt: verifiedAt)
        case .renewalInfo: return [renewalInfoEvent(input.payload, source: source, verifiedAt: verifiedAt)]
        case .appTransaction: return [appTransactionEvent(input.payload, source: source, verifiedAt: verifiedAt)]
        case .appReceipt: return try receiptEvents(input.payload, source: source, verifiedAt: verifiedAt)
        }
    }

    /// Device check from the seeds: `deviceVerification` == base64(SHA-384(lowercased nonce + lowercased device id)).
    public static func checkDeviceVerification(transaction: JSONValue, deviceVerificationId: String) throws(DomainRejection) {
        guard let expected = transaction["deviceVerification"]?.stringValue,
              let nonce = transaction["deviceVerificationNonce"]?.stringValue
        else {
            throw DomainRejection(reason: .deviceVerificationMismatch, detail: "a device-verification-id was given but the transaction has no deviceVerification/deviceVerificationNonce")
        }
        let digest = SHA384.hash(data: Array((nonce.lowercased() + deviceVerificationId.lowercased()).utf8))
        let computed = Data(digest).base64EncodedString()
        guard computed == expected else {
            throw DomainRejection(reason: .deviceVerificationMismatch, detail: "deviceVerification does not match SHA-384(nonce + device id) for device id \(deviceVerificationId.lowercased())")
        }
    }

    // MARK: - Notifications

    /// (kind, effect, reason) for every known notification type/subtype; nil = unknown combination.
    static func classify(type: String, subtype: String?) -> (kind: String, effect: EntitlementEffect, reason: String?)? {
        switch (type, subtype) {
        case ("SUBSCRIBED", "INITIAL_BUY"): return ("SUBSCRIPTION_STARTED", .grant, "initial_buy")
        case ("SUBSCRIBED", "RESUBSCRIBE"): return ("SUBSCRIPTION_STARTED", .grant, "resubscribe")
        case ("DID_RENEW", nil): return ("SUBSCRIPTION_RENEWED", .extend, "renewal")
        case ("DID_RENEW", "BILLING_RECOVERY"): return ("SUBSCRIPTION_RECOVERED", .grant, "billing_recovery")
        case ("DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_DISABLED"): return ("AUTO_RENEW_DISABLED", .state, "auto_renew_disabled")
        case ("DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_ENABLED"): return ("AUTO_RENEW_ENABLED", .state, "auto_renew_enabled")
        case ("DID_CHANGE_RENEWAL_PREF", "UPGRADE"): return ("PLAN_UPGRADED", .grant, "upgrade")
        case ("DID_CHANGE_RENEWAL_PREF", "DOWNGRADE"): return ("PLAN_CHANGE_SCHEDULED", .state, "downgrade")
        case ("DID_CHANGE_RENEWAL_PREF", nil): return ("PLAN_CHANGE_CANCELLED", .state, "plan_change_cancelled")
        case ("OFFER_REDEEMED", nil): return ("OFFER_REDEEMED", .extend, "offer_redeemed")
        case ("OFFER_REDEEMED", "UPGRADE"): return ("PLAN_UPGRADED", .grant, "offer_upgrade")
        case ("OFFER_REDEEMED", "DOWNGRADE"): return ("PLAN_CHANGE_SCHEDULED", .state, "offer_downgrade")
        case ("DID_FAIL_TO_RENEW", nil): return ("BILLING_RETRY_STARTED", .revoke, "billing_retry")
        case ("DID_FAIL_TO_RENEW", "GRACE_PERIOD"): return ("GRACE_PERIOD_STARTED", .extend, "grace_period")
        case ("GRACE_PERIOD_EXPIRED", nil): return ("GRACE_PERIOD_ENDED", .revoke, "grace_period_expired")
        case ("EXPIRED", "VOLUNTARY"): return ("SUBSCRIPTION_EXPIRED", .revoke, "voluntary")
        case ("EXPIRED", "BILLING_RETRY"): return ("SUBSCRIPTION_EXPIRED", .revoke, "billing_retry_exhausted")
        case ("EXPIRED", "PRICE_INCREASE"): return ("SUBSCRIPTION_EXPIRED", .revoke, "price_increase_not_consented")
        case ("EXPIRED", "PRODUCT_NOT_FOR_SALE"): return ("SUBSCRIPTION_EXPIRED", .revoke, "product_not_for_sale")
        case ("EXPIRED", nil): return ("SUBSCRIPTION_EXPIRED", .revoke, "other")
        case ("PRICE_INCREASE", "PENDING"): return ("PRICE_INCREASE_PENDING", .state, "price_increase_pending")
        case ("PRICE_INCREASE", "ACCEPTED"): return ("PRICE_INCREASE_ACCEPTED", .state, "price_increase_accepted")
        case ("REFUND", nil): return ("REFUNDED", .revoke, "refund")
        case ("REFUND_DECLINED", nil): return ("REFUND_DECLINED", .info, "refund_declined")
        case ("REFUND_REVERSED", nil): return ("REFUND_REVERSED", .restore, "refund_reversed")
        case ("CONSUMPTION_REQUEST", nil): return ("REFUND_REQUESTED", .info, "consumption_request")
        case ("REVOKE", nil): return ("FAMILY_ACCESS_REVOKED", .revoke, "family_revoke")
        case ("RENEWAL_EXTENDED", nil): return ("RENEWAL_DATE_EXTENDED", .extend, "renewal_extended")
        case ("RENEWAL_EXTENSION", "SUMMARY"): return ("RENEWAL_EXTENSION_SUMMARY", .info, "renewal_extension_summary")
        case ("RENEWAL_EXTENSION", "FAILURE"): return ("RENEWAL_EXTENSION_FAILED", .info, "renewal_extension_failure")
        case ("ONE_TIME_CHARGE", nil): return ("ONE_TIME_PURCHASED", .grant, "one_time_charge")
        case ("TEST", nil): return ("TEST_RECEIVED", .info, "test")
        case ("EXTERNAL_PURCHASE_TOKEN", "UNREPORTED"): return ("EXTERNAL_TOKEN_UNREPORTED", .info, "external_token_unreported")
        case ("RESCIND_CONSENT", nil): return ("CONSENT_RESCINDED", .info, "consent_rescinded")
        case ("METADATA_UPDATE", nil): return ("AC_METADATA_UPDATED", .info, "metadata_update")
        case ("MIGRATION", nil): return ("AC_SUBSCRIPTION_MIGRATED", .state, "migration")
        case ("PRICE_CHANGE", nil): return ("AC_PRICE_CHANGED", .state, "price_change")
        default: return nil
        }
    }

    func notificationEvents(_ input: VerifiedInput, source: EventSource, verifiedAt: Int64) throws(DomainRejection) -> [EntitlementEvent] {
        let body = input.payload
        let type = body["notificationType"]?.stringValue ?? ""
        let subtype = body["subtype"]?.stringValue
        let uuid = body["notificationUUID"]?.stringValue ?? ""
        let signedDate = body["signedDate"]?.int64Value ?? 0
        let data = body["data"] ?? body["appData"]
        let notification = EventNotification(uuid: uuid, type: type, subtype: subtype, signedDate: signedDate, version: body["version"]?.stringValue)
        let txn = input.transaction
        let renewal = input.renewalInfo

        var details: [String: JSONValue] = [:]
        for key in ["summary", "externalPurchaseToken"] { if let v = body[key] { details[key] = v } }
        if let data = body["data"] {
            for key in ["status", "consumptionRequestReason", "bundleVersion"] { if let v = data[key] { details[key] = v } }
        }

        var base = try baseEvent(
            transaction: txn, renewal: renewal, appTransaction: input.appTransaction,
            environment: data?["environment"]?.stringValue ?? txn?["environment"]?.stringValue
                ?? body["summary"]?["environment"]?.stringValue ?? body["externalPurchaseToken"]?["environment"]?.stringValue ?? "Unknown",
            bundleId: data?["bundleId"]?.stringValue ?? txn?["bundleId"]?.stringValue
                ?? body["summary"]?["bundleId"]?.stringValue ?? body["externalPurchaseToken"]?["bundleId"]?.stringValue,
            appAppleId: data?["appAppleId"]?.int64Value ?? body["summary"]?["appAppleId"]?.int64Value
                ?? body["externalPurchaseToken"]?["appAppleId"]?.int64Value,
            signedDate: signedDate, source: source, verifiedAt: verifiedAt)
        base.notification = notification
        base.details = details.isEmpty ? nil : .object(details)

        guard let (kind, effect, reason) = Self.classify(type: type, subtype: subtype) else {
            var e = base
            e.kind = "UNKNOWN_NOTIFICATION"
            e.effect = .info
            e.reason = ([type] + (subtype.map { [$0] } ?? [])).joined(separator: "/")
            return [finish(e, key: uuid)]
        }
        var e = base
        e.kind = kind
        e.effect = effect
        e.reason = reason

        let productKind = productKind(e)
        switch (type, effect) {
        case ("DID_FAIL_TO_RENEW", _) where subtype == "GRACE_PERIOD":
            e.validUntil = renewal?["gracePeriodExpiresDate"]?.int64Value ?? e.validUntil
        case ("REFUND", _), ("REVOKE", _):
            e.validUntil = e.revocationDate ?? signedDate
        case ("ONE_TIME_CHARGE", _):
            applyOneTime(&e, kind: productKind)
        case (_, .revoke):
            // Expiry-like revocations end access at the signed expiry (or now, if Apple sent none).
            e.validUntil = e.validUntil ?? signedDate
        default:
            break
        }
        // Access-changing effects need a transaction to act on; without one they only inform.
        if txn == nil && [.grant, .extend, .revoke, .restore].contains(e.effect) {
            e.effect = .info
            e.reason = (e.reason ?? "") + ":no_transaction"
        }
        return [finish(e, key: uuid)]
    }

    // MARK: - Client-sent data (StoreKit 2)

    func clientTransactionEvents(_ txn: JSONValue, source: EventSource, verifiedAt: Int64) throws(DomainRejection) -> [EntitlementEvent] {
        let signedDate = txn["signedDate"]?.int64Value ?? 0
        var e = try baseEvent(
            transaction: txn, renewal: nil, appTransaction: nil,
            environment: txn["environment"]?.stringValue ?? "Unknown", bundleId: txn["bundleId"]?.stringValue,
            appAppleId: nil, signedDate: signedDate, source: source, verifiedAt: verifiedAt)
        let kind = productKind(e)
        if let revoked = e.revocationDate {
            let family = e.revocationType == "FAMILY_REVOKE"
            e.kind = family ? "FAMILY_ACCESS_REVOKED" : "REFUNDED"
            e.effect = .revoke
            e.reason = family ? "family_revoke" : "refund"
            e.validUntil = revoked
            return [finish(e, key: "client:\(e.transactionId ?? ""):revoked:\(revoked)")]
        }
        if txn["isUpgraded"]?.boolValue == true {
            e.kind = "PLAN_UPGRADED"
            e.effect = .revoke
            e.reason = "upgraded_away"
            e.validUntil = e.validUntil.map { min($0, signedDate) } ?? signedDate
            return [finish(e, key: "client:\(e.transactionId ?? "")")]
        }
        if kind == .autoRenewable {
            e.kind = "SUBSCRIPTION_OBSERVED"
            if let expires = e.validUntil, expires > signedDate {
                e.effect = .grant
                e.reason = "client_transaction"
            } else {
                e.effect = .info
                e.reason = "expired_when_signed"
            }
            return [finish(e, key: "client:\(e.transactionId ?? "")")]
        }
        e.kind = "ONE_TIME_PURCHASED"
        e.effect = .grant
        e.reason = "client_transaction"
        applyOneTime(&e, kind: kind)
        return [finish(e, key: "client:\(e.transactionId ?? "")")]
    }

    func renewalInfoEvent(_ info: JSONValue, source: EventSource, verifiedAt: Int64) -> EntitlementEvent {
        let signedDate = info["signedDate"]?.int64Value ?? 0
        let original = info["originalTransactionId"]?.stringValue
        var e = EntitlementEvent(
            eventId: "", kind: "RENEWAL_INFO_OBSERVED", effect: .state, reason: "client_renewal_info",
            environment: info["environment"]?.stringValue ?? "Unknown", subject: original,
            productId: info["productId"]?.stringValue, productType: "Auto-Renewable Subscription",
            originalTransactionId: original, appAccountToken: info["appAccountToken"]?.stringValue,
            signedDate: signedDate, verifiedAt: verifiedAt, source: source, renewalInfo: info)
        if let token = e.appAccountToken, !token.isEmpty { e.subject = token }
        if let p = e.productId, let product = catalogue[p] { e.entitlement = product.entitlement }
        return finish(e, key: "client-renewal:\(original ?? "")")
    }

    func appTransactionEvent(_ app: JSONValue, source: EventSource, verifiedAt: Int64) -> EntitlementEvent {
        let signedDate = app["signedDate"]?.int64Value ?? app["receiptCreationDate"]?.int64Value ?? 0
        let id = app["appTransactionId"]?.stringValue
        let e = EntitlementEvent(
            eventId: "", kind: "APP_TRANSACTION_OBSERVED", effect: .info, reason: "app_transaction",
            environment: app["receiptType"]?.stringValue ?? app["environment"]?.stringValue ?? "Unknown",
            bundleId: app["bundleId"]?.stringValue, appAppleId: app["appAppleId"]?.int64Value, subject: id,
            originalTransactionId: nil, signedDate: signedDate, verifiedAt: verifiedAt, source: source,
            appTransaction: app)
        return finish(e, key: "app:\(id ?? "")")
    }

    // MARK: - Helpers

    func baseEvent(
        transaction txn: JSONValue?, renewal: JSONValue?, appTransaction: JSONValue?, environment: String,
        bundleId: String?, appAppleId: Int64?, signedDate: Int64, source: EventSource, verifiedAt: Int64
    ) throws(DomainRejection) -> EntitlementEvent {
        let productId = txn?["productId"]?.stringValue ?? renewal?["productId"]?.stringValue
        let original = txn?["originalTransactionId"]?.stringValue ?? renewal?["originalTransactionId"]?.stringValue
        let token = txn?["appAccountToken"]?.stringValue ?? renewal?["appAccountToken"]?.stringValue
        var e = EntitlementEvent(
            eventId: "", kind: "", effect: .info, environment: environment, bundleId: bundleId, appAppleId: appAppleId,
            subject: (token?.isEmpty == false ? token : nil) ?? original
                ?? appTransaction?["appTransactionId"]?.stringValue,
            productId: productId, productType: txn?["type"]?.stringValue,
            transactionId: txn?["transactionId"]?.stringValue, originalTransactionId: original,
            webOrderLineItemId: txn?["webOrderLineItemId"]?.stringValue, appAccountToken: token,
            ownershipType: txn?["inAppOwnershipType"]?.stringValue,
            quantity: txn?["quantity"]?.int64Value.map { Int($0) },
            validFrom: txn?["purchaseDate"]?.int64Value, validUntil: txn?["expiresDate"]?.int64Value,
            revocationDate: txn?["revocationDate"]?.int64Value,
            revocationReason: txn?["revocationReason"]?.int64Value.map { Int($0) },
            revocationType: txn?["revocationType"]?.stringValue,
            revocationPercentage: txn?["revocationPercentage"]?.int64Value.map { Int($0) },
            signedDate: signedDate, verifiedAt: verifiedAt, source: source,
            transaction: txn, renewalInfo: renewal, appTransaction: appTransaction)
        if let productId {
            if let product = catalogue[productId] {
                e.entitlement = product.entitlement
                if e.productType == nil { e.productType = product.kind.appleProductType }
                if product.kind == .consumable { e.units = product.units * (e.quantity ?? 1) }
            } else if requireKnownProducts {
                throw DomainRejection(reason: .unknownProduct, detail: "productId \(productId) is not in the product catalogue")
            } else {
                e.entitlement = productId
                if e.productType == "Consumable" { e.units = e.quantity ?? 1 }
            }
        }
        return e
    }

    func productKind(_ e: EntitlementEvent) -> ProductCatalogue.ProductKind? {
        if let p = e.productId, let product = catalogue[p] { return product.kind }
        switch e.productType {
        case "Auto-Renewable Subscription": return .autoRenewable
        case "Non-Renewing Subscription": return .nonRenewing
        case "Non-Consumable": return .nonConsumable
        case "Consumable": return .consumable
        default: return nil
        }
    }

    func applyOneTime(_ e: inout EntitlementEvent, kind: ProductCatalogue.ProductKind?) {
        switch kind {
        case .nonConsumable, .consumable:
            e.validUntil = nil
        case .nonRenewing:
            if let start = e.validFrom, let p = e.productId, let duration = catalogue[p]?.duration {
                e.validUntil = duration.adding(toMillis: start)
            }
        default:
            break
        }
    }

    private static let hexDigits: [UInt8] = Array("0123456789abcdef".utf8)

    /// Fills the deterministic `eventId`: the same input always yields the same id.
    func finish(_ event: EntitlementEvent, key: String) -> EntitlementEvent {
        var e = event
        let material = [
            "entitlement-event/v1", e.kind, e.effect.rawValue, e.environment, key, e.productId ?? "",
            e.transactionId ?? "", e.originalTransactionId ?? "", String(e.signedDate),
        ].joined(separator: "|")
        let digest = SHA256.hash(data: Array(material.utf8))
        // 16 bytes as 32 lowercase hex digits, written straight into the string's storage.
        e.eventId = digest.withUnsafeBytes { bytes in
            String(unsafeUninitializedCapacity: 32) { out in
                for i in 0..<16 {
                    out[2 * i] = Self.hexDigits[Int(bytes[i] >> 4)]
                    out[2 * i + 1] = Self.hexDigits[Int(bytes[i] & 0xF)]
                }
                return 32
            }
        }
        return e
    }
}
