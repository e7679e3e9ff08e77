import Foundation

// Request and response bodies of the App Store Server API, field names as Apple documents them. Signed documents
// (`signedPayload`, `signedTransactionInfo`, ...) stay opaque strings: the workers verify them, the client never does.

/// Get Notification History: the request body.
public struct NotificationHistoryRequest: Codable, Sendable, Equatable {
    public var startDate: Int64
    public var endDate: Int64
    public var notificationType: String?
    public var notificationSubtype: String?
    public var onlyFailures: Bool?
    public var transactionId: String?

    public init(startDate: Int64, endDate: Int64, notificationType: String? = nil, notificationSubtype: String? = nil,
                onlyFailures: Bool? = nil, transactionId: String? = nil) {
        self.startDate = startDate
        self.endDate = endDate
        self.notificationType = notificationType
        self.notificationSubtype = notificationSubtype
        self.onlyFailures = onlyFailures
        self.transactionId = transactionId
    }
}

public struct SendAttempt: Codable, Sendable, Equatable {
    public var attemptDate: Int64?
    public var sendAttemptResult: String?

    public init(attemptDate: Int64? = nil, sendAttemptResult: String? = nil) {
        self.attemptDate = attemptDate
        self.sendAttemptResult = sendAttemptResult
    }
}

public struct NotificationHistoryItem: Codable, Sendable, Equatable {
    public var signedPayload: String
    public var sendAttemptResults: [SendAttempt]?

    public init(signedPayload: String, sendAttemptResults: [SendAttempt]? = nil) {
        self.signedPayload = signedPayload
        self.sendAttemptResults = sendAttemptResults
    }
}

public struct NotificationHistoryResponse: Codable, Sendable, Equatable {
    public var notificationHistory: [NotificationHistoryItem]
    public var hasMore: Bool
    public var paginationToken: String?

    public init(notificationHistory: [NotificationHistoryItem], hasMore: Bool, paginationToken: String? = nil) {
        self.notificationHistory = notificationHistory
        self.hasMore = hasMore
        self.paginationToken = paginationToken
    }
}

/// Get Transaction History v2: query parameters.
public struct TransactionHistoryQuery: Sendable, Equatable {
    public enum Sort: String, Sendable { case ascending = "ASCENDING", descending = "DESCENDING" }
    public var sort: Sort?
    public var startDate: Int64?
    public var endDate: Int64?
    public var productIds: [String]
    public var productTypes: [String]
    public var subscriptionGroupIdentifiers: [String]
    public var inAppOwnershipType: String?
    public var revoked: Bool?

    public init(sort: Sort? = .ascending, startDate: Int64? = nil, endDate: Int64? = nil, productIds: [String] = [],
                productTypes: [String] = [], subscriptionGroupIdentifiers: [String] = [], inAppOwnershipType: String? = nil,
                revoked: Bool? = nil) {
        self.sort = sort
        self.startDate = startDate
        self.endDate = endDate
        self.productIds = productIds
        self.productTypes = productTypes
        self.subscriptionGroupIdentifiers = subscriptionGroupIdentifiers
        self.inAppOwnershipType = inAppOwnershipType
        self.revoked = revoked
    }

    func items(revision: String?) -> [(String, String)] {
        var q: [(String, String)] = []
        if let revision { q.append(("revision", revision)) }
        if let sort { q.append(("sort", sort.rawValue)) }
        if let startDate { q.append(("startDate", String(startDate))) }
        if let endDate { q.append(("endDate", String(endDate))) }
        q += productIds.map { ("productId", $0) }
        q += productTypes.map { ("productType", $0) }
        q += subscriptionGroupIdentifiers.map { ("subscriptionGroupIdentifier", $0) }
        if let inAppOwnershipType { q.append(("inAppOwnershipType", inAppOwnershipType)) }
        if let revoked { q.append(("revoked", revoked ? "true" : "false")) }
        return q
    }
}

/// Transaction History v2 and Refund History pages.
public struct HistoryResponse: Codable, Sendable, Equatable {
    public var revision: String?
    public var hasMore: Bool
    public var bundleId: String?
    public var appAppleId: Int64?
    public var environment: String?
    public var signedTransactions: [String]

    public init(revision: String? = nil, hasMore: Bool, bundleId: String? = nil, appAppleId: Int64? = nil, environment: String? = nil, signedTransactions: [String]) {
        self.revision = revision
        self.hasMore = hasMore
        self.bundleId = bundleId
        self.appAppleId = appAppleId
        self.environment = environment
        self.signedTransactions = signedTransactions
    }
}

public struct TransactionInfoResponse: Codable, Sendable, Equatable {
    public var signedTransactionInfo: String

    public init(signedTransactionInfo: String) {
        self.signedTransactionInfo = signedTransactionInfo
    }
}

public struct LastTransactionsItem: Codable, Sendable, Equatable {
    public var status: Int?
    public var originalTransactionId: String?
    public var signedTransactionInfo: String?
    public var signedRenewalInfo: String?

    public init(status: Int? = nil, originalTransactionId: String? = nil, signedTransactionInfo: String? = nil, signedRenewalInfo: String? = nil) {
        self.status = status
        self.originalTransactionId = originalTransactionId
        self.signedTransactionInfo = signedTransactionInfo
        self.signedRenewalInfo = signedRenewalInfo
    }
}

public struct SubscriptionGroupStatus: Codable, Sendable, Equatable {
    public var subscriptionGroupIdentifier: String?
    public var lastTransactions: [LastTransactionsItem]

    public init(subscriptionGroupIdentifier: String? = nil, lastTransactions: [LastTransactionsItem]) {
        self.subscriptionGroupIdentifier = subscriptionGroupIdentifier
        self.lastTransactions = lastTransactions
    }
}

public struct StatusResponse: Codable, Sendable, Equatable {
    public var environment: String?
    public var bundleId: String?
    public var appAppleId: Int64?
    public var data: [SubscriptionGroupStatus]

    public init(environment: String? = nil, bundleId: String? = nil, appAppleId: Int64? = nil, data: [SubscriptionGroupStatus]) {
        self.environment = environment
        self.bundleId = bundleId
        self.appAppleId = appAppleId
        self.data = data
    }
}

public struct OrderLookupResponse: Codable, Sendable, Equatable {
    /// 0 valid, 1 invalid.
    public var status: Int
    public var signedTransactions: [String]

    public init(status: Int, signedTransactions: [String]) {
        self.status = status
        self.signedTransactions = signedTransactions
    }
}

public struct TestNotificationResponse: Codable, Sendable, Equatable {
    public var testNotificationToken: String

    public init(testNotificationToken: String) {
        self.testNotificationToken = testNotificationToken
    }
}

public struct TestNotificationStatusResponse: Codable, Sendable, Equatable {
    public var signedPayload: String
    public var sendAttemptResults: [SendAttempt]?

    public init(signedPayload: String, sendAttemptResults: [SendAttempt]? = nil) {
        self.signedPayload = signedPayload
        self.sendAttemptResults = sendAttemptResults
    }
}

/// Send Consumption Information (v2): the request body.
public struct ConsumptionRequest: Codable, Sendable, Equatable {
    public enum DeliveryStatus: String, Codable, Sendable, CaseIterable {
        case delivered = "DELIVERED"
        case undeliveredQualityIssue = "UNDELIVERED_QUALITY_ISSUE"
        case undeliveredWrongItem = "UNDELIVERED_WRONG_ITEM"
        case undeliveredServerOutage = "UNDELIVERED_SERVER_OUTAGE"
        case undeliveredOther = "UNDELIVERED_OTHER"
    }

    public enum RefundPreference: String, Codable, Sendable, CaseIterable {
        case decline = "DECLINE"
        case grantFull = "GRANT_FULL"
        case grantProrated = "GRANT_PRORATED"
    }

    public var customerConsented: Bool
    public var sampleContentProvided: Bool
    public var deliveryStatus: DeliveryStatus
    /// Thousandths of a percent, 0...100000.
    public var consumptionPercentage: Int?
    public var refundPreference: RefundPreference?

    public init(customerConsented: Bool, sampleContentProvided: Bool = false, deliveryStatus: DeliveryStatus,
                consumptionPercentage: Int? = nil, refundPreference: RefundPreference? = nil) {
        self.customerConsented = customerConsented
        self.sampleContentProvided = sampleContentProvided
        self.deliveryStatus = deliveryStatus
        self.consumptionPercentage = consumptionPercentage
        self.refundPreference = refundPreference
    }
}

/// Apple's error body.
public struct APIErrorBody: Codable, Sendable, Equatable {
    public var errorCode: Int
    public var errorMessage: String?
    public init(errorCode: Int, errorMessage: String?) {
        self.errorCode = errorCode
        self.errorMessage = errorMessage
    }
}

/// Reads the payload (middle segment) of a compact JWS without verifying it: only for keys, dedupe and routing.
public enum UnverifiedJWS {
    public static func payload(_ jws: String) -> [String: Any]? {
        let parts = jws.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let data = base64URLDecode(parts[1]) else { return nil }
        return (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
    }

    public static func string(_ jws: String, _ field: String) -> String? {
        switch payload(jws)?[field] {
        case let s as String where !s.isEmpty: return s
        case let n as NSNumber: return n.stringValue
        default: return nil
        }
    }
}
