import AppStoreVerification
import Crypto
import Foundation

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
            ?? event.appTransactionPayload?.appTransactionId ?? event.notification?.uuid ?? event.eventId
    }

    // MARK: - Entry point

    /// The events of an item verified by the core, read through the core's typed payloads. The item must already
    /// have passed the verification core: the mapper trusts it.
    public func events(for item: VerifiedItem, source: EventSource, verifiedAt: Int64) throws(DomainRejection) -> [EntitlementEvent] {
        switch item {
        case .notification(let n): return try notificationEvents(n, source: source, verifiedAt: verifiedAt)
        case .transaction(let t): return try clientTransactionEvents(t.payload, source: source, verifiedAt: verifiedAt)
        case .renewalInfo(let r): return [renewalInfoEvent(r.payload, source: source, verifiedAt: verifiedAt)]
        case .appTransaction(let a): return [appTransactionEvent(a.payload, source: source, verifiedAt: verifiedAt)]
        case .appReceipt(let r): return try receiptEvents(r.payload, source: source, verifiedAt: verifiedAt)
        }
    }

    /// Device check from the seeds: `deviceVerification` == base64(SHA-384(lowercased nonce + lowercased device id)).
    public static func checkDeviceVerification(
        transaction: JWSTransactionDecodedPayload, deviceVerificationId: String
    ) throws(DomainRejection) {
        guard let expected = transaction.deviceVerification, let nonce = transaction.deviceVerificationNonce else {
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

    func notificationEvents(_ n: VerifiedNotification, source: EventSource, verifiedAt: Int64) throws(DomainRejection) -> [EntitlementEvent] {
        let body = n.payload
        let type = body.notificationType?.rawValue ?? ""
        let subtype = body.subtype?.rawValue
        let uuid = body.notificationUUID ?? ""
        let signedDate = body.signedDate ?? 0
        let notification = EventNotification(uuid: uuid, type: type, subtype: subtype, signedDate: signedDate, version: body.version)
        let txn = n.transaction
        let renewal = n.renewalInfo
        // The app section: `data`, else `appData` (RESCIND_CONSENT).
        let app = body.data.map { (environment: $0.environment, bundleId: $0.bundleId, appAppleId: $0.appAppleId) }
            ?? body.appData.map { (environment: $0.environment, bundleId: $0.bundleId, appAppleId: $0.appAppleId) }

        var base = try baseEvent(
            transaction: txn, renewal: renewal, appTransaction: n.appTransaction,
            // Not the token's derived environment (its `externalPurchaseId` prefix): only an `environment` member, as sent.
            environment: app?.environment?.rawValue ?? txn?.environment?.rawValue ?? body.summary?.environment?.rawValue
                ?? body.externalPurchaseToken?.raw["environment"]?.stringValue ?? "Unknown",
            bundleId: app?.bundleId ?? txn?.bundleId ?? body.summary?.bundleId ?? body.externalPurchaseToken?.bundleId,
            appAppleId: app?.appAppleId ?? body.summary?.appAppleId ?? body.externalPurchaseToken?.appAppleId,
            signedDate: signedDate, source: source, verifiedAt: verifiedAt)
        base.notification = notification
        base.details = Self.notificationDetails(body)

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
            e.validUntil = renewal?.gracePeriodExpiresDate ?? e.validUntil
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

    /// Notification-level extras, copied as Apple sent them (whatever their JSON type): `summary`,
    /// `externalPurchaseToken`, and `data`'s `status`, `consumptionRequestReason`, `bundleVersion`.
    static func notificationDetails(_ body: ResponseBodyV2DecodedPayload) -> JSONValue? {
        var details: [String: JSONValue] = [:]
        for key in ["summary", "externalPurchaseToken"] { if let v = body.raw[key] { details[key] = v } }
        if let data = body.data?.raw {
            for key in ["status", "consumptionRequestReason", "bundleVersion"] { if let v = data[key] { details[key] = v } }
        }
        return details.isEmpty ? nil : .object(details)
    }

    // MARK: - Client-sent data (StoreKit 2)

    func clientTransactionEvents(_ txn: JWSTransactionDecodedPayload, source: EventSource, verifiedAt: Int64) throws(DomainRejection) -> [EntitlementEvent] {
        let signedDate = txn.signedDate ?? 0
        var e = try baseEvent(
            transaction: txn, renewal: nil, appTransaction: nil,
            environment: txn.environment?.rawValue ?? "Unknown", bundleId: txn.bundleId,
            appAppleId: nil, signedDate: signedDate, source: source, verifiedAt: verifiedAt)
        let kind = productKind(e)
        if let revoked = e.revocationDate {
            let family = txn.revocationType == .familyRevoke
            e.kind = family ? "FAMILY_ACCESS_REVOKED" : "REFUNDED"
            e.effect = .revoke
            e.reason = family ? "family_revoke" : "refund"
            e.validUntil = revoked
            return [finish(e, key: "client:\(e.transactionId ?? ""):revoked:\(revoked)")]
        }
        if txn.isUpgraded == true {
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

    func renewalInfoEvent(_ info: JWSRenewalInfoDecodedPayload, source: EventSource, verifiedAt: Int64) -> EntitlementEvent {
        let signedDate = info.signedDate ?? 0
        let original = info.originalTransactionId
        var e = EntitlementEvent(
            eventId: "", kind: "RENEWAL_INFO_OBSERVED", effect: .state, reason: "client_renewal_info",
            environment: info.environment?.rawValue ?? "Unknown", subject: original,
            productId: info.productId, productType: ProductType.autoRenewable.rawValue,
            originalTransactionId: original, appAccountToken: info.appAccountToken,
            signedDate: signedDate, verifiedAt: verifiedAt, source: source, renewalInfo: info.raw)
        if let token = e.appAccountToken, !token.isEmpty { e.subject = token }
        if let p = e.productId, let product = catalogue[p] { e.entitlement = product.entitlement }
        return finish(e, key: "client-renewal:\(original ?? "")")
    }

    func appTransactionEvent(_ app: AppTransaction, source: EventSource, verifiedAt: Int64) -> EntitlementEvent {
        let signedDate = app.signedDate ?? app.receiptCreationDate ?? 0
        let id = app.appTransactionId
        let e = EntitlementEvent(
            eventId: "", kind: "APP_TRANSACTION_OBSERVED", effect: .info, reason: "app_transaction",
            environment: app.receiptType?.rawValue ?? app.environment?.rawValue ?? "Unknown",
            bundleId: app.bundleId, appAppleId: app.appAppleId, subject: id,
            originalTransactionId: nil, signedDate: signedDate, verifiedAt: verifiedAt, source: source,
            appTransaction: app.raw)
        return finish(e, key: "app:\(id ?? "")")
    }

    // MARK: - Helpers

    func baseEvent(
        transaction txn: JWSTransactionDecodedPayload?, renewal: JWSRenewalInfoDecodedPayload?,
        appTransaction: AppTransaction?, environment: String, bundleId: String?, appAppleId: Int64?, signedDate: Int64,
        source: EventSource, verifiedAt: Int64
    ) throws(DomainRejection) -> EntitlementEvent {
        let productId = txn?.productId ?? renewal?.productId
        let original = txn?.originalTransactionId ?? renewal?.originalTransactionId
        let token = txn?.appAccountToken ?? renewal?.appAccountToken
        var e = EntitlementEvent(
            eventId: "", kind: "", effect: .info, environment: environment, bundleId: bundleId, appAppleId: appAppleId,
            subject: (token?.isEmpty == false ? token : nil) ?? original ?? appTransaction?.appTransactionId,
            productId: productId, productType: txn?.type?.rawValue,
            transactionId: txn?.transactionId, originalTransactionId: original,
            webOrderLineItemId: txn?.webOrderLineItemId, appAccountToken: token,
            ownershipType: txn?.inAppOwnershipType?.rawValue,
            quantity: txn?.quantity.map { Int($0) },
            validFrom: txn?.purchaseDate, validUntil: txn?.expiresDate,
            revocationDate: txn?.revocationDate,
            revocationReason: txn?.revocationReason.map { Int($0.rawValue) },
            revocationType: txn?.revocationType?.rawValue,
            revocationPercentage: txn?.revocationPercentage.map { Int($0) },
            signedDate: signedDate, verifiedAt: verifiedAt, source: source,
            transaction: txn?.raw, renewalInfo: renewal?.raw, appTransaction: appTransaction?.raw)
        if let productId {
            if let product = catalogue[productId] {
                e.entitlement = product.entitlement
                if e.productType == nil { e.productType = product.kind.productType.rawValue }
                if product.kind == .consumable { e.units = product.units * (e.quantity ?? 1) }
            } else if requireKnownProducts {
                throw DomainRejection(reason: .unknownProduct, detail: "productId \(productId) is not in the product catalogue")
            } else {
                e.entitlement = productId
                if e.isConsumable { e.units = e.quantity ?? 1 }
            }
        }
        return e
    }

    func productKind(_ e: EntitlementEvent) -> ProductCatalogue.ProductKind? {
        if let p = e.productId, let product = catalogue[p] { return product.kind }
        return e.appleProductType.flatMap(ProductCatalogue.ProductKind.init(productType:))
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
        // "entitlement-event/v1|kind|effect|environment|key|productId|transactionId|originalTransactionId|signedDate",
        // written straight into one buffer (no array of strings, no joined string).
        var material = [UInt8]()
        material.reserveCapacity(160 + key.utf8.count)
        material.append(contentsOf: "entitlement-event/v1".utf8)
        func field(_ s: String) {
            material.append(UInt8(ascii: "|"))
            material.append(contentsOf: s.utf8)
        }
        field(e.kind)
        field(e.effect.rawValue)
        field(e.environment)
        field(key)
        field(e.productId ?? "")
        field(e.transactionId ?? "")
        field(e.originalTransactionId ?? "")
        field(String(e.signedDate))
        let digest = SHA256.hash(data: material)
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
