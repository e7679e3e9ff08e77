// Typed views of Apple's decoded payloads. Field names follow apple/app-store-server-library-swift.
// Every model keeps its full `raw` JSON, so fields Apple adds later are never dropped. Dates are Int64 milliseconds
// since the Unix epoch, as Apple sends them. A known field with an unexpected JSON type reads as nil (its value stays
// in `raw`); the fields the verifier relies on (bundle id, environment, dates used for validation, app id) are
// checked strictly by the verifier itself.

extension JSONValue {
    @inline(__always) func str(_ key: String) -> String? { self[key]?.stringValue }
    @inline(__always) func int(_ key: String) -> Int64? { self[key]?.int64Value }
    @inline(__always) func bool(_ key: String) -> Bool? { self[key]?.boolValue }
    @inline(__always) func strings(_ key: String) -> [String]? {
        guard let a = self[key]?.arrayValue else { return nil }
        var out: [String] = []
        out.reserveCapacity(a.count)
        for v in a {
            guard let s = v.stringValue else { return nil }
            out.append(s)
        }
        return out
    }
}

/// A decoded transaction (`signedTransactionInfo`, StoreKit 2 `Transaction.jwsRepresentation`).
public struct JWSTransactionDecodedPayload: Sendable, Hashable {
    public let raw: JSONValue

    public var originalTransactionId: String? { raw.str("originalTransactionId") }
    public var transactionId: String? { raw.str("transactionId") }
    public var webOrderLineItemId: String? { raw.str("webOrderLineItemId") }
    public var bundleId: String? { raw.str("bundleId") }
    public var productId: String? { raw.str("productId") }
    public var subscriptionGroupIdentifier: String? { raw.str("subscriptionGroupIdentifier") }
    public var purchaseDate: Int64? { raw.int("purchaseDate") }
    public var originalPurchaseDate: Int64? { raw.int("originalPurchaseDate") }
    public var expiresDate: Int64? { raw.int("expiresDate") }
    public var quantity: Int64? { raw.int("quantity") }
    public var type: ProductType? { raw.str("type").map(ProductType.init(rawValue:)) }
    public var appAccountToken: String? { raw.str("appAccountToken") }
    public var inAppOwnershipType: InAppOwnershipType? {
        raw.str("inAppOwnershipType").map(InAppOwnershipType.init(rawValue:))
    }
    public var signedDate: Int64? { raw.int("signedDate") }
    public var revocationReason: RevocationReason? { raw.int("revocationReason").map(RevocationReason.init(rawValue:)) }
    public var revocationDate: Int64? { raw.int("revocationDate") }
    public var isUpgraded: Bool? { raw.bool("isUpgraded") }
    public var offerType: OfferType? { raw.int("offerType").map(OfferType.init(rawValue:)) }
    public var offerIdentifier: String? { raw.str("offerIdentifier") }
    public var environment: Environment? { raw.str("environment").map(Environment.init(rawValue:)) }
    public var storefront: String? { raw.str("storefront") }
    public var storefrontId: String? { raw.str("storefrontId") }
    public var transactionReason: TransactionReason? {
        raw.str("transactionReason").map(TransactionReason.init(rawValue:))
    }
    public var currency: String? { raw.str("currency") }
    /// Milliunits of the currency.
    public var price: Int64? { raw.int("price") }
    public var offerDiscountType: OfferDiscountType? {
        raw.str("offerDiscountType").map(OfferDiscountType.init(rawValue:))
    }
    public var appTransactionId: String? { raw.str("appTransactionId") }
    /// ISO 8601 duration of the offer, e.g. `P1M`.
    public var offerPeriod: String? { raw.str("offerPeriod") }
    public var revocationType: RevocationType? { raw.str("revocationType").map(RevocationType.init(rawValue:)) }
    /// Thousandths of a percent (50000 = 50%).
    public var revocationPercentage: Int64? { raw.int("revocationPercentage") }
    /// Advanced Commerce API data, kept as JSON.
    public var advancedCommerceInfo: JSONValue? { raw["advancedCommerceInfo"] }
    /// StoreKit's device check: base64(SHA-384(lowercased `deviceVerificationNonce` + lowercased device id)).
    public var deviceVerification: String? { raw.str("deviceVerification") }
    public var deviceVerificationNonce: String? { raw.str("deviceVerificationNonce") }

    public init(raw: JSONValue) { self.raw = raw }
}

/// Decoded renewal info (`signedRenewalInfo`).
public struct JWSRenewalInfoDecodedPayload: Sendable, Hashable {
    public let raw: JSONValue

    public var expirationIntent: ExpirationIntent? { raw.int("expirationIntent").map(ExpirationIntent.init(rawValue:)) }
    public var originalTransactionId: String? { raw.str("originalTransactionId") }
    public var autoRenewProductId: String? { raw.str("autoRenewProductId") }
    public var productId: String? { raw.str("productId") }
    public var autoRenewStatus: AutoRenewStatus? { raw.int("autoRenewStatus").map(AutoRenewStatus.init(rawValue:)) }
    public var isInBillingRetryPeriod: Bool? { raw.bool("isInBillingRetryPeriod") }
    public var priceIncreaseStatus: PriceIncreaseStatus? {
        raw.int("priceIncreaseStatus").map(PriceIncreaseStatus.init(rawValue:))
    }
    public var gracePeriodExpiresDate: Int64? { raw.int("gracePeriodExpiresDate") }
    public var offerType: OfferType? { raw.int("offerType").map(OfferType.init(rawValue:)) }
    public var offerIdentifier: String? { raw.str("offerIdentifier") }
    public var signedDate: Int64? { raw.int("signedDate") }
    public var environment: Environment? { raw.str("environment").map(Environment.init(rawValue:)) }
    public var recentSubscriptionStartDate: Int64? { raw.int("recentSubscriptionStartDate") }
    public var renewalDate: Int64? { raw.int("renewalDate") }
    public var currency: String? { raw.str("currency") }
    public var renewalPrice: Int64? { raw.int("renewalPrice") }
    public var offerDiscountType: OfferDiscountType? {
        raw.str("offerDiscountType").map(OfferDiscountType.init(rawValue:))
    }
    public var eligibleWinBackOfferIds: [String]? { raw.strings("eligibleWinBackOfferIds") }
    public var appAccountToken: String? { raw.str("appAccountToken") }
    public var appTransactionId: String? { raw.str("appTransactionId") }
    public var offerPeriod: String? { raw.str("offerPeriod") }
    public var advancedCommerceInfo: JSONValue? { raw["advancedCommerceInfo"] }

    public init(raw: JSONValue) { self.raw = raw }
}

/// A decoded AppTransaction (`AppTransaction.shared` JWS, or `appData.signedAppTransactionInfo`).
public struct AppTransaction: Sendable, Hashable {
    public let raw: JSONValue

    public var receiptType: Environment? { raw.str("receiptType").map(Environment.init(rawValue:)) }
    public var appAppleId: Int64? { raw.int("appAppleId") }
    public var bundleId: String? { raw.str("bundleId") }
    public var applicationVersion: String? { raw.str("applicationVersion") }
    public var versionExternalIdentifier: Int64? { raw.int("versionExternalIdentifier") }
    public var receiptCreationDate: Int64? { raw.int("receiptCreationDate") }
    public var originalPurchaseDate: Int64? { raw.int("originalPurchaseDate") }
    public var originalApplicationVersion: String? { raw.str("originalApplicationVersion") }
    public var deviceVerification: String? { raw.str("deviceVerification") }
    public var deviceVerificationNonce: String? { raw.str("deviceVerificationNonce") }
    public var preorderDate: Int64? { raw.int("preorderDate") }
    public var appTransactionId: String? { raw.str("appTransactionId") }
    public var originalPlatform: PurchasePlatform? { raw.str("originalPlatform").map(PurchasePlatform.init(rawValue:)) }
    /// Some producers also put `signedDate` in AppTransactions; Apple documents `receiptCreationDate`.
    public var signedDate: Int64? { raw.int("signedDate") }
    /// Some producers also send an `environment` member; Apple documents `receiptType`.
    public var environment: Environment? { raw.str("environment").map(Environment.init(rawValue:)) }

    public init(raw: JSONValue) { self.raw = raw }
}

/// `data` of a notification.
public struct NotificationData: Sendable, Hashable {
    public let raw: JSONValue

    public var environment: Environment? { raw.str("environment").map(Environment.init(rawValue:)) }
    public var appAppleId: Int64? { raw.int("appAppleId") }
    public var bundleId: String? { raw.str("bundleId") }
    public var bundleVersion: String? { raw.str("bundleVersion") }
    public var signedTransactionInfo: String? { raw.str("signedTransactionInfo") }
    public var signedRenewalInfo: String? { raw.str("signedRenewalInfo") }
    public var status: Status? { raw.int("status").map(Status.init(rawValue:)) }
    public var consumptionRequestReason: ConsumptionRequestReason? {
        raw.str("consumptionRequestReason").map(ConsumptionRequestReason.init(rawValue:))
    }

    public init(raw: JSONValue) { self.raw = raw }
}

/// `summary` of a RENEWAL_EXTENSION / SUMMARY notification.
public struct Summary: Sendable, Hashable {
    public let raw: JSONValue

    public var environment: Environment? { raw.str("environment").map(Environment.init(rawValue:)) }
    public var appAppleId: Int64? { raw.int("appAppleId") }
    public var bundleId: String? { raw.str("bundleId") }
    public var productId: String? { raw.str("productId") }
    public var requestIdentifier: String? { raw.str("requestIdentifier") }
    public var storefrontCountryCodes: [String]? { raw.strings("storefrontCountryCodes") }
    public var succeededCount: Int64? { raw.int("succeededCount") }
    public var failedCount: Int64? { raw.int("failedCount") }

    public init(raw: JSONValue) { self.raw = raw }
}

/// `externalPurchaseToken` of an EXTERNAL_PURCHASE_TOKEN notification.
public struct ExternalPurchaseToken: Sendable, Hashable {
    public let raw: JSONValue

    public var externalPurchaseId: String? { raw.str("externalPurchaseId") }
    public var tokenCreationDate: Int64? { raw.int("tokenCreationDate") }
    public var appAppleId: Int64? { raw.int("appAppleId") }
    public var bundleId: String? { raw.str("bundleId") }
    /// Apple marks sandbox tokens by an `externalPurchaseId` starting with `SANDBOX` (as Apple's libraries do).
    public var environment: Environment {
        (externalPurchaseId?.hasPrefix("SANDBOX") ?? false) ? .sandbox : .production
    }

    public init(raw: JSONValue) { self.raw = raw }
}

/// `appData` of a RESCIND_CONSENT notification.
public struct AppData: Sendable, Hashable {
    public let raw: JSONValue

    public var appAppleId: Int64? { raw.int("appAppleId") }
    public var bundleId: String? { raw.str("bundleId") }
    public var environment: Environment? { raw.str("environment").map(Environment.init(rawValue:)) }
    public var signedAppTransactionInfo: String? { raw.str("signedAppTransactionInfo") }

    public init(raw: JSONValue) { self.raw = raw }
}

/// The decoded `signedPayload` of an App Store Server Notification V2.
public struct ResponseBodyV2DecodedPayload: Sendable, Hashable {
    public let raw: JSONValue

    public var notificationType: NotificationTypeV2? {
        raw.str("notificationType").map(NotificationTypeV2.init(rawValue:))
    }
    public var subtype: Subtype? { raw.str("subtype").map(Subtype.init(rawValue:)) }
    public var notificationUUID: String? { raw.str("notificationUUID") }
    public var version: String? { raw.str("version") }
    public var signedDate: Int64? { raw.int("signedDate") }
    public var data: NotificationData? { raw["data"].flatMap { $0.objectValue != nil ? NotificationData(raw: $0) : nil } }
    public var summary: Summary? { raw["summary"].flatMap { $0.objectValue != nil ? Summary(raw: $0) : nil } }
    public var externalPurchaseToken: ExternalPurchaseToken? {
        raw["externalPurchaseToken"].flatMap { $0.objectValue != nil ? ExternalPurchaseToken(raw: $0) : nil }
    }
    public var appData: AppData? { raw["appData"].flatMap { $0.objectValue != nil ? AppData(raw: $0) : nil } }

    /// The app identity the notification is about, from whichever of data/summary/appData/externalPurchaseToken it has.
    public var bundleId: String? {
        data?.bundleId ?? summary?.bundleId ?? appData?.bundleId ?? externalPurchaseToken?.bundleId
    }
    public var appAppleId: Int64? {
        data?.appAppleId ?? summary?.appAppleId ?? appData?.appAppleId ?? externalPurchaseToken?.appAppleId
    }
    public var environment: Environment? {
        data?.environment ?? summary?.environment ?? appData?.environment ?? externalPurchaseToken?.environment
    }

    public init(raw: JSONValue) { self.raw = raw }
}
