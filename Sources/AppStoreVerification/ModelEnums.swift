// Apple's enumerations as open RawRepresentable structs: unknown values are kept as they are, never fatal.
// Names and values follow apple/app-store-server-library-swift (Models/).

/// `notificationType` of an App Store Server Notification V2.
public struct NotificationTypeV2: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public var description: String { rawValue }

    public static let subscribed = Self("SUBSCRIBED")
    public static let didChangeRenewalPref = Self("DID_CHANGE_RENEWAL_PREF")
    public static let didChangeRenewalStatus = Self("DID_CHANGE_RENEWAL_STATUS")
    public static let offerRedeemed = Self("OFFER_REDEEMED")
    public static let didRenew = Self("DID_RENEW")
    public static let expired = Self("EXPIRED")
    public static let didFailToRenew = Self("DID_FAIL_TO_RENEW")
    public static let gracePeriodExpired = Self("GRACE_PERIOD_EXPIRED")
    public static let priceIncrease = Self("PRICE_INCREASE")
    public static let refund = Self("REFUND")
    public static let refundDeclined = Self("REFUND_DECLINED")
    public static let consumptionRequest = Self("CONSUMPTION_REQUEST")
    public static let renewalExtended = Self("RENEWAL_EXTENDED")
    public static let revoke = Self("REVOKE")
    public static let test = Self("TEST")
    public static let renewalExtension = Self("RENEWAL_EXTENSION")
    public static let refundReversed = Self("REFUND_REVERSED")
    public static let externalPurchaseToken = Self("EXTERNAL_PURCHASE_TOKEN")
    public static let oneTimeCharge = Self("ONE_TIME_CHARGE")
    public static let rescindConsent = Self("RESCIND_CONSENT")
    public static let metadataUpdate = Self("METADATA_UPDATE")
    public static let migration = Self("MIGRATION")
    public static let priceChange = Self("PRICE_CHANGE")

    public static let allKnown: [NotificationTypeV2] = [
        .subscribed, .didChangeRenewalPref, .didChangeRenewalStatus, .offerRedeemed, .didRenew, .expired,
        .didFailToRenew, .gracePeriodExpired, .priceIncrease, .refund, .refundDeclined, .consumptionRequest,
        .renewalExtended, .revoke, .test, .renewalExtension, .refundReversed, .externalPurchaseToken,
        .oneTimeCharge, .rescindConsent, .metadataUpdate, .migration, .priceChange,
    ]
}

/// `subtype` of an App Store Server Notification V2.
public struct Subtype: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public var description: String { rawValue }

    public static let initialBuy = Self("INITIAL_BUY")
    public static let resubscribe = Self("RESUBSCRIBE")
    public static let downgrade = Self("DOWNGRADE")
    public static let upgrade = Self("UPGRADE")
    public static let autoRenewEnabled = Self("AUTO_RENEW_ENABLED")
    public static let autoRenewDisabled = Self("AUTO_RENEW_DISABLED")
    public static let voluntary = Self("VOLUNTARY")
    public static let billingRetry = Self("BILLING_RETRY")
    public static let priceIncrease = Self("PRICE_INCREASE")
    public static let gracePeriod = Self("GRACE_PERIOD")
    public static let pending = Self("PENDING")
    public static let accepted = Self("ACCEPTED")
    public static let billingRecovery = Self("BILLING_RECOVERY")
    public static let productNotForSale = Self("PRODUCT_NOT_FOR_SALE")
    public static let summary = Self("SUMMARY")
    public static let failure = Self("FAILURE")
    public static let unreported = Self("UNREPORTED")

    public static let allKnown: [Subtype] = [
        .initialBuy, .resubscribe, .downgrade, .upgrade, .autoRenewEnabled, .autoRenewDisabled, .voluntary,
        .billingRetry, .priceIncrease, .gracePeriod, .pending, .accepted, .billingRecovery, .productNotForSale,
        .summary, .failure, .unreported,
    ]
}

/// Transaction `type`.
public struct ProductType: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public var description: String { rawValue }

    public static let autoRenewable = Self("Auto-Renewable Subscription")
    public static let nonConsumable = Self("Non-Consumable")
    public static let consumable = Self("Consumable")
    public static let nonRenewing = Self("Non-Renewing Subscription")
}

public struct InAppOwnershipType: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public var description: String { rawValue }

    public static let familyShared = Self("FAMILY_SHARED")
    public static let purchased = Self("PURCHASED")
}

public struct RevocationType: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public var description: String { rawValue }

    public static let refundFull = Self("REFUND_FULL")
    public static let refundProrated = Self("REFUND_PRORATED")
    public static let familyRevoke = Self("FAMILY_REVOKE")
}

public struct RevocationReason: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int64
    public init(rawValue: Int64) { self.rawValue = rawValue }
    public init(_ rawValue: Int64) { self.rawValue = rawValue }
    public var description: String { String(rawValue) }

    public static let other = Self(0)
    public static let appIssue = Self(1)
}

public struct OfferType: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int64
    public init(rawValue: Int64) { self.rawValue = rawValue }
    public init(_ rawValue: Int64) { self.rawValue = rawValue }
    public var description: String { String(rawValue) }

    public static let introductoryOffer = Self(1)
    public static let promotionalOffer = Self(2)
    public static let subscriptionOfferCode = Self(3)
    public static let winBackOffer = Self(4)
}

public struct OfferDiscountType: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public var description: String { rawValue }

    public static let freeTrial = Self("FREE_TRIAL")
    public static let payAsYouGo = Self("PAY_AS_YOU_GO")
    public static let payUpFront = Self("PAY_UP_FRONT")
    public static let oneTime = Self("ONE_TIME")
}

public struct TransactionReason: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public var description: String { rawValue }

    public static let purchase = Self("PURCHASE")
    public static let renewal = Self("RENEWAL")
}

public struct ExpirationIntent: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int64
    public init(rawValue: Int64) { self.rawValue = rawValue }
    public init(_ rawValue: Int64) { self.rawValue = rawValue }
    public var description: String { String(rawValue) }

    public static let customerCancelled = Self(1)
    public static let billingError = Self(2)
    public static let customerDidNotConsentToPriceIncrease = Self(3)
    public static let productNotAvailable = Self(4)
    public static let other = Self(5)
}

public struct AutoRenewStatus: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int64
    public init(rawValue: Int64) { self.rawValue = rawValue }
    public init(_ rawValue: Int64) { self.rawValue = rawValue }
    public var description: String { String(rawValue) }

    public static let off = Self(0)
    public static let on = Self(1)
}

public struct PriceIncreaseStatus: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int64
    public init(rawValue: Int64) { self.rawValue = rawValue }
    public init(_ rawValue: Int64) { self.rawValue = rawValue }
    public var description: String { String(rawValue) }

    public static let customerHasNotResponded = Self(0)
    public static let customerConsentedOrWasNotifiedWithoutNeedingConsent = Self(1)
}

/// Subscription `status` in a notification's `data`.
public struct Status: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int64
    public init(rawValue: Int64) { self.rawValue = rawValue }
    public init(_ rawValue: Int64) { self.rawValue = rawValue }
    public var description: String { String(rawValue) }

    public static let active = Self(1)
    public static let expired = Self(2)
    public static let billingRetry = Self(3)
    public static let billingGracePeriod = Self(4)
    public static let revoked = Self(5)
}

public struct ConsumptionRequestReason: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public var description: String { rawValue }

    public static let unintendedPurchase = Self("UNINTENDED_PURCHASE")
    public static let fulfillmentIssue = Self("FULFILLMENT_ISSUE")
    public static let unsatisfiedWithPurchase = Self("UNSATISFIED_WITH_PURCHASE")
    public static let legal = Self("LEGAL")
    public static let other = Self("OTHER")
}

/// AppTransaction `originalPlatform`.
public struct PurchasePlatform: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public var description: String { rawValue }

    public static let iOS = Self("iOS")
    public static let macOS = Self("macOS")
    public static let tvOS = Self("tvOS")
    public static let visionOS = Self("visionOS")
}
