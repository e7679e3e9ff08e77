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
///
/// A value type whose fields live in one shared, copy-on-write box: copying an event (into an array, a tuple, a
/// closure, a `for` loop's element) retains that one box instead of its ~30 strings and documents one by one, and a
/// change to a copy first gives the copy a box of its own. (Measured: the sink spent ~6.6 % of the machine copying
/// and destroying events field by field, `fleet bench sink` under `perf record -a -g`.) The JSON shape, Codable keys
/// and equality are the fields' own.
public struct EntitlementEvent: Codable, Sendable, Equatable {
    public static let schemaVersion = "entitlement-event/v1"

    /// The stored fields (the wire format's members).
    public struct Fields: Codable, Sendable, Equatable {
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
        public var transaction: EmbeddedDocument?
        /// The decoded, verified renewal info, when there is one.
        public var renewalInfo: EmbeddedDocument?
        /// The decoded, verified AppTransaction (RESCIND_CONSENT, client AppTransaction), when there is one.
        public var appTransaction: EmbeddedDocument?
        /// Notification-level extras that are not a transaction: `summary`, `externalPurchaseToken`, `data.status`, ...
        public var details: EmbeddedDocument?
    }

    /// Mutated only through `unique()`, i.e. only while this event is its sole owner: safe to share across tasks.
    @usableFromInline final class Storage: @unchecked Sendable {
        @usableFromInline var fields: Fields
        @usableFromInline init(_ fields: Fields) { self.fields = fields }
    }

    @usableFromInline var storage: Storage

    /// The box, made this event's own first when another event shares it.
    @inlinable mutating func unique() -> Storage {
        if !isKnownUniquelyReferenced(&storage) { storage = Storage(storage.fields) }
        return storage
    }

    public init(from decoder: any Decoder) throws { storage = Storage(try Fields(from: decoder)) }

    public func encode(to encoder: any Encoder) throws { try storage.fields.encode(to: encoder) }

    public static func == (lhs: EntitlementEvent, rhs: EntitlementEvent) -> Bool {
        lhs.storage === rhs.storage || lhs.storage.fields == rhs.storage.fields
    }

    public var schema: String {
        @inlinable get { storage.fields.schema }
        @inlinable set { unique().fields.schema = newValue }
    }
    /// Deterministic: hash of (kind, environment, key, effective time), so replaying an input gives the same id.
    public var eventId: String {
        @inlinable get { storage.fields.eventId }
        @inlinable set { unique().fields.eventId = newValue }
    }
    /// Our event kind, e.g. `SUBSCRIPTION_STARTED`, `REFUNDED`, `UNKNOWN_NOTIFICATION`.
    public var kind: String {
        @inlinable get { storage.fields.kind }
        @inlinable set { unique().fields.kind = newValue }
    }
    public var effect: EntitlementEffect {
        @inlinable get { storage.fields.effect }
        @inlinable set { unique().fields.effect = newValue }
    }
    /// A short machine reason, e.g. `initial_buy`, `voluntary`, `billing_retry_exhausted`.
    public var reason: String? {
        @inlinable get { storage.fields.reason }
        @inlinable set { unique().fields.reason = newValue }
    }
    public var environment: String {
        @inlinable get { storage.fields.environment }
        @inlinable set { unique().fields.environment = newValue }
    }
    public var bundleId: String? {
        @inlinable get { storage.fields.bundleId }
        @inlinable set { unique().fields.bundleId = newValue }
    }
    public var appAppleId: Int64? {
        @inlinable get { storage.fields.appAppleId }
        @inlinable set { unique().fields.appAppleId = newValue }
    }
    /// Who holds the entitlement: `appAccountToken` when the app set one, else `originalTransactionId`
    /// (AppTransaction: `appTransactionId`).
    public var subject: String? {
        @inlinable get { storage.fields.subject }
        @inlinable set { unique().fields.subject = newValue }
    }
    public var productId: String? {
        @inlinable get { storage.fields.productId }
        @inlinable set { unique().fields.productId = newValue }
    }
    /// Apple's product type, a `ProductType` raw value (typed: `appleProductType`).
    public var productType: String? {
        @inlinable get { storage.fields.productType }
        @inlinable set { unique().fields.productType = newValue }
    }
    public var transactionId: String? {
        @inlinable get { storage.fields.transactionId }
        @inlinable set { unique().fields.transactionId = newValue }
    }
    public var originalTransactionId: String? {
        @inlinable get { storage.fields.originalTransactionId }
        @inlinable set { unique().fields.originalTransactionId = newValue }
    }
    public var webOrderLineItemId: String? {
        @inlinable get { storage.fields.webOrderLineItemId }
        @inlinable set { unique().fields.webOrderLineItemId = newValue }
    }
    public var appAccountToken: String? {
        @inlinable get { storage.fields.appAccountToken }
        @inlinable set { unique().fields.appAccountToken = newValue }
    }
    /// `PURCHASED` or `FAMILY_SHARED`.
    public var ownershipType: String? {
        @inlinable get { storage.fields.ownershipType }
        @inlinable set { unique().fields.ownershipType = newValue }
    }
    public var quantity: Int? {
        @inlinable get { storage.fields.quantity }
        @inlinable set { unique().fields.quantity = newValue }
    }
    public var validFrom: Int64? {
        @inlinable get { storage.fields.validFrom }
        @inlinable set { unique().fields.validFrom = newValue }
    }
    public var validUntil: Int64? {
        @inlinable get { storage.fields.validUntil }
        @inlinable set { unique().fields.validUntil = newValue }
    }
    public var revocationDate: Int64? {
        @inlinable get { storage.fields.revocationDate }
        @inlinable set { unique().fields.revocationDate = newValue }
    }
    public var revocationReason: Int? {
        @inlinable get { storage.fields.revocationReason }
        @inlinable set { unique().fields.revocationReason = newValue }
    }
    public var revocationType: String? {
        @inlinable get { storage.fields.revocationType }
        @inlinable set { unique().fields.revocationType = newValue }
    }
    public var revocationPercentage: Int? {
        @inlinable get { storage.fields.revocationPercentage }
        @inlinable set { unique().fields.revocationPercentage = newValue }
    }
    public var notification: EventNotification? {
        @inlinable get { storage.fields.notification }
        @inlinable set { unique().fields.notification = newValue }
    }
    /// The ordering date: the notification's signedDate, else the verified JWS's own signedDate.
    public var signedDate: Int64 {
        @inlinable get { storage.fields.signedDate }
        @inlinable set { unique().fields.signedDate = newValue }
    }
    public var verifiedAt: Int64 {
        @inlinable get { storage.fields.verifiedAt }
        @inlinable set { unique().fields.verifiedAt = newValue }
    }
    public var source: EventSource {
        @inlinable get { storage.fields.source }
        @inlinable set { unique().fields.source = newValue }
    }
    /// Consumables: the units the purchase granted (catalogue units x quantity). A refund (REVOKE) debits
    /// `units x revocationPercentage / 100000` (all of them when no percentage is given); a reversal re-credits it.
    public var units: Int? {
        @inlinable get { storage.fields.units }
        @inlinable set { unique().fields.units = newValue }
    }
    /// Catalogue: the entitlement name this product unlocks (defaults to the productId when no catalogue is set).
    public var entitlement: String? {
        @inlinable get { storage.fields.entitlement }
        @inlinable set { unique().fields.entitlement = newValue }
    }
    /// The decoded, verified transaction (all of Apple's fields, unknown ones kept), when there is one.
    public var transaction: JSONValue? {
        @inlinable get { storage.fields.transaction?.value }
        @inlinable set { unique().fields.transaction = newValue.map(EmbeddedDocument.init) }
    }
    /// The decoded, verified renewal info, when there is one.
    public var renewalInfo: JSONValue? {
        @inlinable get { storage.fields.renewalInfo?.value }
        @inlinable set { unique().fields.renewalInfo = newValue.map(EmbeddedDocument.init) }
    }
    /// The decoded, verified AppTransaction (RESCIND_CONSENT, client AppTransaction), when there is one.
    public var appTransaction: JSONValue? {
        @inlinable get { storage.fields.appTransaction?.value }
        @inlinable set { unique().fields.appTransaction = newValue.map(EmbeddedDocument.init) }
    }
    /// Notification-level extras that are not a transaction: `summary`, `externalPurchaseToken`, `data.status`, ...
    public var details: JSONValue? {
        @inlinable get { storage.fields.details?.value }
        @inlinable set { unique().fields.details = newValue.map(EmbeddedDocument.init) }
    }

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
        storage = Storage(Fields(
            schema: Self.schemaVersion, eventId: eventId, kind: kind, effect: effect, reason: reason,
            environment: environment, bundleId: bundleId, appAppleId: appAppleId, subject: subject,
            productId: productId, productType: productType, transactionId: transactionId,
            originalTransactionId: originalTransactionId, webOrderLineItemId: webOrderLineItemId,
            appAccountToken: appAccountToken, ownershipType: ownershipType, quantity: quantity, validFrom: validFrom,
            validUntil: validUntil, revocationDate: revocationDate, revocationReason: revocationReason,
            revocationType: revocationType, revocationPercentage: revocationPercentage, notification: notification,
            signedDate: signedDate, verifiedAt: verifiedAt, source: source, units: units, entitlement: entitlement,
            transaction: transaction.map(EmbeddedDocument.init), renewalInfo: renewalInfo.map(EmbeddedDocument.init),
            appTransaction: appTransaction.map(EmbeddedDocument.init), details: details.map(EmbeddedDocument.init)))
    }
}

/// A document an event embeds (`transaction`, `renewalInfo`, `appTransaction`, `details`): parsed, or the JSON text
/// it arrived in, already checked, and parsed only when it is read. The sink's decoder keeps the text
/// (`decode(jsonBytes:keepingDocumentTexts:parsingDocuments:)`): the sink stores that text and reads a document only
/// where a rule needs it, so most documents are never built. Two are equal when their documents are; encoded as the
/// document.
public struct EmbeddedDocument: Sendable, Equatable, Codable {
    @usableFromInline enum Form: Sendable {
        case parsed(JSONValue)
        case text(String)
    }

    @usableFromInline let form: Form

    public init(_ value: JSONValue) { form = .parsed(value) }

    /// JSON text of an object that a strict parse has already accepted with nesting up to 64 (as the sink's decoder
    /// checks it); it is parsed again each time `value` is read.
    init(checkedText text: String) { form = .text(text) }

    /// The document.
    @inlinable public var value: JSONValue {
        switch form {
        case .parsed(let value): return value
        case .text(let text): return Self.parse(text)
        }
    }

    @usableFromInline static func parse(_ text: String) -> JSONValue {
        // Already checked: a failure here would be a bug in the check, not bad input.
        guard let value = try? JSONValue.parse(text, maxDepth: 64) else {
            preconditionFailure("a checked document text no longer parses")
        }
        return value
    }

    public static func == (a: EmbeddedDocument, b: EmbeddedDocument) -> Bool { a.value == b.value }

    public init(from decoder: any Decoder) throws { form = .parsed(try JSONValue(from: decoder)) }

    public func encode(to encoder: any Encoder) throws { try value.encode(to: encoder) }
}
