import AppStoreVerification

// The verified entitlement event: what the workers put on the result topic and what the sink and dashboards read.
// JSON, `"schema": "entitlement-event/v1"`. Dates are milliseconds since the Unix epoch, as Apple sends them.
// The JSON Schema of this type is `config/entitlement-event.schema.json`; keep the two in step.

/// What an event does to an entitlement.
public enum EntitlementEffect: String, Codable, Sendable, CaseIterable {
    /// Start (or restart) an entitlement window; for consumables, credit `units`.
    case grant = "GRANT"
    /// Move `validUntil` later on an existing entitlement.
    case extend = "EXTEND"
    /// End the entitlement at `revocationDate` / `validUntil`; for consumables, debit `units`.
    case revoke = "REVOKE"
    /// Undo a previous REVOKE (refund reversed); for consumables, re-credit `units`.
    case restore = "RESTORE"
    /// No change of access today, a change of renewal state worth recording.
    case state = "STATE"
    /// Informational only; never changes access.
    case info = "INFO"
}

/// The notification an event was derived from.
public struct EventNotification: Codable, Sendable, Equatable, Hashable {
    public var uuid: String
    public var type: String
    public var subtype: String?
    public var signedDate: Int64
    public var version: String?

    public init(uuid: String, type: String, subtype: String?, signedDate: Int64, version: String? = nil) {
        self.uuid = uuid
        self.type = type
        self.subtype = subtype
        self.signedDate = signedDate
        self.version = version
    }
}

/// Where the input came from (Kafka coordinates and the kind of JWS that was verified).
public struct EventSource: Codable, Sendable, Equatable, Hashable {
    public var topic: String
    public var partition: Int32
    public var offset: Int64
    /// The raw value of a `VerifiedItem.Kind`: `notification`, `transaction`, `renewalInfo`, `appTransaction` or
    /// `appReceipt` (typed: `kind`).
    public var inputKind: String

    public init(topic: String, partition: Int32, offset: Int64, inputKind: String) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.inputKind = inputKind
    }
}

/// One verified entitlement event.
public struct EntitlementEvent: Codable, Sendable, Equatable {
    public static let schemaVersion = "entitlement-event/v1"

    public var schema: String
    /// Deterministic: hash of (kind, environment, key, effective time), so replaying an input gives the same id.
    public var eventId: String
    /// Our event kind, e.g. `SUBSCRIPTION_STARTED`, `REFUNDED`, `UNKNOWN_NOTIFICATION`.
    public var kind: String
    public var effect: EntitlementEffect
    /// A short machine reason, e.g. `initial_buy`, `voluntary`, `billing_retry_exhausted`.
    public var reason: String?
    public var environment: String
    public var bundleId: String?
    public var appAppleId: Int64?
    /// Who holds the entitlement: `appAccountToken` when the app set one, else `originalTransactionId`
    /// (AppTransaction: `appTransactionId`).
    public var subject: String?
    public var productId: String?
    /// Apple's product type, a `ProductType` raw value (typed: `appleProductType`).
    public var productType: String?
    public var transactionId: String?
    public var originalTransactionId: String?
    public var webOrderLineItemId: String?
    public var appAccountToken: String?
    /// `PURCHASED` or `FAMILY_SHARED`.
    public var ownershipType: String?
    public var quantity: Int?
    public var validFrom: Int64?
    public var validUntil: Int64?
    public var revocationDate: Int64?
    public var revocationReason: Int?
    public var revocationType: String?
    public var revocationPercentage: Int?
    public var notification: EventNotification?
    /// The ordering date: the notification's signedDate, else the verified JWS's own signedDate.
    public var signedDate: Int64
    public var verifiedAt: Int64
    public var source: EventSource
    /// Consumables: the units the purchase granted (catalogue units x quantity). A refund (REVOKE) debits
    /// `units x revocationPercentage / 100000` (all of them when no percentage is given); a reversal re-credits it.
    public var units: Int?
    /// Catalogue: the entitlement name this product unlocks (defaults to the productId when no catalogue is set).
    public var entitlement: String?
    /// The decoded, verified transaction (all of Apple's fields, unknown ones kept), when there is one.
    public var transaction: JSONValue?
    /// The decoded, verified renewal info, when there is one.
    public var renewalInfo: JSONValue?
    /// The decoded, verified AppTransaction (RESCIND_CONSENT, client AppTransaction), when there is one.
    public var appTransaction: JSONValue?
    /// Notification-level extras that are not a transaction: `summary`, `externalPurchaseToken`, `data.status`, ...
    public var details: JSONValue?

    public init(
        eventId: String, kind: String, effect: EntitlementEffect, reason: String? = nil, environment: String,
        bundleId: String? = nil, appAppleId: Int64? = nil, subject: String? = nil, productId: String? = nil,
        productType: String? = nil, transactionId: String? = nil, originalTransactionId: String? = nil,
        webOrderLineItemId: String? = nil, appAccountToken: String? = nil, ownershipType: String? = nil,
        quantity: Int? = nil, validFrom: Int64? = nil, validUntil: Int64? = nil, revocationDate: Int64? = nil,
        revocationReason: Int? = nil, revocationType: String? = nil, revocationPercentage: Int? = nil,
        notification: EventNotification? = nil, signedDate: Int64, verifiedAt: Int64, source: EventSource,
        units: Int? = nil, entitlement: String? = nil, transaction: JSONValue? = nil, renewalInfo: JSONValue? = nil,
        appTransaction: JSONValue? = nil, details: JSONValue? = nil
    ) {
        self.schema = Self.schemaVersion
        self.eventId = eventId
        self.kind = kind
        self.effect = effect
        self.reason = reason
        self.environment = environment
        self.bundleId = bundleId
        self.appAppleId = appAppleId
        self.subject = subject
        self.productId = productId
        self.productType = productType
        self.transactionId = transactionId
        self.originalTransactionId = originalTransactionId
        self.webOrderLineItemId = webOrderLineItemId
        self.appAccountToken = appAccountToken
        self.ownershipType = ownershipType
        self.quantity = quantity
        self.validFrom = validFrom
        self.validUntil = validUntil
        self.revocationDate = revocationDate
        self.revocationReason = revocationReason
        self.revocationType = revocationType
        self.revocationPercentage = revocationPercentage
        self.notification = notification
        self.signedDate = signedDate
        self.verifiedAt = verifiedAt
        self.source = source
        self.units = units
        self.entitlement = entitlement
        self.transaction = transaction
        self.renewalInfo = renewalInfo
        self.appTransaction = appTransaction
        self.details = details
    }
}
