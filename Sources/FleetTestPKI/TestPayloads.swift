import AppStoreVerification
import Foundation

/// Realistic App Store payloads as `JSONValue` (field names and shapes as Apple sends them), for tests, benchmarks and
/// demo traffic. Every builder takes `extra` fields that are merged last (to add unknown fields or override).
public enum TestPayloads {
    public static let bundleId = "com.example.fleet"
    public static let appAppleId: Int64 = 1_234_567_890

    public static func nowMillis() -> Int64 { EpochMillis.now() }

    static func merge(_ base: [String: JSONValue?], _ extra: [String: JSONValue]) -> JSONValue {
        var o: [String: JSONValue] = [:]
        for (k, v) in base { if let v { o[k] = v } }
        for (k, v) in extra { o[k] = v }
        return .object(o)
    }

    /// A signed transaction's payload (`JWSTransactionDecodedPayload`).
    public static func transaction(
        productId: String = "com.example.fleet.premium.monthly",
        transactionId: String = String(UInt64.random(in: 2_000_000_000_000_000..<2_999_999_999_999_999)),
        originalTransactionId: String? = nil,
        purchaseDate: Int64 = TestPayloads.nowMillis(),
        originalPurchaseDate: Int64? = nil,
        expiresDate: Int64? = nil,
        type: ProductType = .autoRenewable,
        environment: AppStoreVerification.Environment = .sandbox,
        bundleId: String = TestPayloads.bundleId,
        signedDate: Int64? = nil,
        webOrderLineItemId: String? = nil,
        subscriptionGroupIdentifier: String? = "21000001",
        quantity: Int64 = 1,
        inAppOwnershipType: InAppOwnershipType = .purchased,
        transactionReason: TransactionReason = .purchase,
        appAccountToken: String? = nil,
        revocationDate: Int64? = nil,
        revocationReason: RevocationReason? = nil,
        revocationType: RevocationType? = nil,
        revocationPercentage: Int64? = nil,
        isUpgraded: Bool? = nil,
        offerType: OfferType? = nil,
        offerIdentifier: String? = nil,
        offerDiscountType: OfferDiscountType? = nil,
        price: Int64 = 4990,
        currency: String = "USD",
        storefront: String = "USA",
        storefrontId: String = "143441",
        appTransactionId: String? = "704289" + String(UInt32.random(in: 100_000..<999_999)),
        extra: [String: JSONValue] = [:]
    ) -> JSONValue {
        let isSubscription = type == .autoRenewable
        let expires = expiresDate ?? (isSubscription ? purchaseDate + 30 * 86_400_000 : nil)
        return merge(
            [
                "transactionId": .string(transactionId),
                "originalTransactionId": .string(originalTransactionId ?? transactionId),
                "webOrderLineItemId": isSubscription
                    ? .string(webOrderLineItemId ?? String(UInt64.random(in: 2_000_000_000_000_000..<2_999_999_999_999_999)))
                    : webOrderLineItemId.map { .string($0) },
                "bundleId": .string(bundleId),
                "productId": .string(productId),
                "subscriptionGroupIdentifier": isSubscription ? subscriptionGroupIdentifier.map { .string($0) } : nil,
                "purchaseDate": .integer(purchaseDate),
                "originalPurchaseDate": .integer(originalPurchaseDate ?? purchaseDate),
                "expiresDate": expires.map { .integer($0) },
                "quantity": .integer(quantity),
                "type": .string(type.rawValue),
                "appAccountToken": appAccountToken.map { .string($0) },
                "inAppOwnershipType": .string(inAppOwnershipType.rawValue),
                "signedDate": .integer(signedDate ?? max(purchaseDate, nowMillis())),
                "environment": .string(environment.rawValue),
                "transactionReason": .string(transactionReason.rawValue),
                "storefront": .string(storefront),
                "storefrontId": .string(storefrontId),
                "price": .integer(price),
                "currency": .string(currency),
                "revocationDate": revocationDate.map { .integer($0) },
                "revocationReason": revocationReason.map { .integer($0.rawValue) },
                "revocationType": revocationType.map { .string($0.rawValue) },
                "revocationPercentage": revocationPercentage.map { .integer($0) },
                "isUpgraded": isUpgraded.map { .bool($0) },
                "offerType": offerType.map { .integer($0.rawValue) },
                "offerIdentifier": offerIdentifier.map { .string($0) },
                "offerDiscountType": offerDiscountType.map { .string($0.rawValue) },
                "appTransactionId": appTransactionId.map { .string($0) },
            ], extra)
    }

    /// A renewal info payload (`JWSRenewalInfoDecodedPayload`).
    public static func renewalInfo(
        originalTransactionId: String,
        productId: String = "com.example.fleet.premium.monthly",
        autoRenewProductId: String? = nil,
        autoRenewStatus: AutoRenewStatus = .on,
        environment: AppStoreVerification.Environment = .sandbox,
        signedDate: Int64 = TestPayloads.nowMillis(),
        renewalDate: Int64? = nil,
        recentSubscriptionStartDate: Int64? = nil,
        expirationIntent: ExpirationIntent? = nil,
        isInBillingRetryPeriod: Bool? = nil,
        gracePeriodExpiresDate: Int64? = nil,
        priceIncreaseStatus: PriceIncreaseStatus? = nil,
        offerType: OfferType? = nil,
        offerIdentifier: String? = nil,
        renewalPrice: Int64 = 4990,
        currency: String = "USD",
        appAccountToken: String? = nil,
        extra: [String: JSONValue] = [:]
    ) -> JSONValue {
        merge(
            [
                "originalTransactionId": .string(originalTransactionId),
                "productId": .string(productId),
                "autoRenewProductId": .string(autoRenewProductId ?? productId),
                "autoRenewStatus": .integer(autoRenewStatus.rawValue),
                "environment": .string(environment.rawValue),
                "signedDate": .integer(signedDate),
                "renewalDate": renewalDate.map { .integer($0) },
                "recentSubscriptionStartDate": recentSubscriptionStartDate.map { .integer($0) },
                "expirationIntent": expirationIntent.map { .integer($0.rawValue) },
                "isInBillingRetryPeriod": isInBillingRetryPeriod.map { .bool($0) },
                "gracePeriodExpiresDate": gracePeriodExpiresDate.map { .integer($0) },
                "priceIncreaseStatus": priceIncreaseStatus.map { .integer($0.rawValue) },
                "offerType": offerType.map { .integer($0.rawValue) },
                "offerIdentifier": offerIdentifier.map { .string($0) },
                "renewalPrice": .integer(renewalPrice),
                "currency": .string(currency),
                "appAccountToken": appAccountToken.map { .string($0) },
            ], extra)
    }

    /// An AppTransaction payload.
    public static func appTransaction(
        bundleId: String = TestPayloads.bundleId,
        appAppleId: Int64? = TestPayloads.appAppleId,
        receiptType: AppStoreVerification.Environment = .sandbox,
        receiptCreationDate: Int64 = TestPayloads.nowMillis(),
        appTransactionId: String = "704289" + String(UInt32.random(in: 100_000..<999_999)),
        applicationVersion: String = "42",
        originalApplicationVersion: String = "1",
        originalPurchaseDate: Int64 = 1_700_000_000_000,
        originalPlatform: PurchasePlatform = .iOS,
        extra: [String: JSONValue] = [:]
    ) -> JSONValue {
        merge(
            [
                "receiptType": .string(receiptType.rawValue),
                "appAppleId": appAppleId.map { .integer($0) },
                "bundleId": .string(bundleId),
                "applicationVersion": .string(applicationVersion),
                "versionExternalIdentifier": .integer(0),
                "receiptCreationDate": .integer(receiptCreationDate),
                "requestDate": .integer(receiptCreationDate),
                "originalPurchaseDate": .integer(originalPurchaseDate),
                "originalApplicationVersion": .string(originalApplicationVersion),
                "deviceVerification": .string(Base64.encodeStandard((0..<48).map { _ in UInt8.random(in: 0...255) })),
                "deviceVerificationNonce": .string(UUID().uuidString.lowercased()),
                "appTransactionId": .string(appTransactionId),
                "originalPlatform": .string(originalPlatform.rawValue),
            ], extra)
    }

    /// A notification payload with `data` (the usual shape). Nested JWS are passed already signed.
    public static func notification(
        type: NotificationTypeV2,
        subtype: Subtype? = nil,
        notificationUUID: String = UUID().uuidString.lowercased(),
        signedDate: Int64 = TestPayloads.nowMillis(),
        environment: AppStoreVerification.Environment = .sandbox,
        bundleId: String = TestPayloads.bundleId,
        appAppleId: Int64? = TestPayloads.appAppleId,
        bundleVersion: String = "42",
        signedTransactionInfo: String? = nil,
        signedRenewalInfo: String? = nil,
        status: Int64? = nil,
        extraData: [String: JSONValue] = [:],
        extra: [String: JSONValue] = [:]
    ) -> JSONValue {
        let data = merge(
            [
                "environment": .string(environment.rawValue),
                "appAppleId": appAppleId.map { .integer($0) },
                "bundleId": .string(bundleId),
                "bundleVersion": .string(bundleVersion),
                "signedTransactionInfo": signedTransactionInfo.map { .string($0) },
                "signedRenewalInfo": signedRenewalInfo.map { .string($0) },
                "status": status.map { .integer($0) },
            ], extraData)
        return merge(
            [
                "notificationType": .string(type.rawValue),
                "subtype": subtype.map { .string($0.rawValue) },
                "notificationUUID": .string(notificationUUID),
                "version": .string("2.0"),
                "signedDate": .integer(signedDate),
                "data": data,
            ], extra)
    }

    /// A RENEWAL_EXTENSION / SUMMARY notification payload (`summary` instead of `data`).
    public static func summaryNotification(
        environment: AppStoreVerification.Environment = .sandbox,
        bundleId: String = TestPayloads.bundleId,
        appAppleId: Int64? = TestPayloads.appAppleId,
        signedDate: Int64 = TestPayloads.nowMillis(),
        productId: String = "com.example.fleet.premium.monthly",
        succeededCount: Int64 = 120, failedCount: Int64 = 2
    ) -> JSONValue {
        merge(
            [
                "notificationType": .string(NotificationTypeV2.renewalExtension.rawValue),
                "subtype": .string(Subtype.summary.rawValue),
                "notificationUUID": .string(UUID().uuidString.lowercased()),
                "version": .string("2.0"),
                "signedDate": .integer(signedDate),
                "summary": merge(
                    [
                        "environment": .string(environment.rawValue),
                        "appAppleId": appAppleId.map { .integer($0) },
                        "bundleId": .string(bundleId),
                        "productId": .string(productId),
                        "requestIdentifier": .string(UUID().uuidString.lowercased()),
                        "storefrontCountryCodes": .array([.string("USA"), .string("JPN")]),
                        "succeededCount": .integer(succeededCount),
                        "failedCount": .integer(failedCount),
                    ], [:]),
            ], [:])
    }

    /// A RESCIND_CONSENT notification payload (`appData` with a nested signed AppTransaction).
    public static func rescindConsentNotification(
        signedAppTransactionInfo: String,
        environment: AppStoreVerification.Environment = .sandbox,
        bundleId: String = TestPayloads.bundleId,
        appAppleId: Int64? = TestPayloads.appAppleId,
        signedDate: Int64 = TestPayloads.nowMillis()
    ) -> JSONValue {
        merge(
            [
                "notificationType": .string(NotificationTypeV2.rescindConsent.rawValue),
                "notificationUUID": .string(UUID().uuidString.lowercased()),
                "version": .string("2.0"),
                "signedDate": .integer(signedDate),
                "appData": merge(
                    [
                        "environment": .string(environment.rawValue),
                        "appAppleId": appAppleId.map { .integer($0) },
                        "bundleId": .string(bundleId),
                        "signedAppTransactionInfo": .string(signedAppTransactionInfo),
                    ], [:]),
            ], [:])
    }

    /// An EXTERNAL_PURCHASE_TOKEN / UNREPORTED notification payload.
    public static func externalPurchaseTokenNotification(
        sandbox: Bool = true,
        bundleId: String = TestPayloads.bundleId,
        appAppleId: Int64? = TestPayloads.appAppleId,
        signedDate: Int64 = TestPayloads.nowMillis()
    ) -> JSONValue {
        merge(
            [
                "notificationType": .string(NotificationTypeV2.externalPurchaseToken.rawValue),
                "subtype": .string(Subtype.unreported.rawValue),
                "notificationUUID": .string(UUID().uuidString.lowercased()),
                "version": .string("2.0"),
                "signedDate": .integer(signedDate),
                "externalPurchaseToken": merge(
                    [
                        "externalPurchaseId": .string((sandbox ? "SANDBOX_" : "") + UUID().uuidString.lowercased()),
                        "tokenCreationDate": .integer(signedDate - 86_400_000),
                        "appAppleId": appAppleId.map { .integer($0) },
                        "bundleId": .string(bundleId),
                    ], [:]),
            ], [:])
    }
}
