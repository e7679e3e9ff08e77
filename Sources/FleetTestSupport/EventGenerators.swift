import AppStoreVerification
import EntitlementDomain
import Foundation

/// Entitlement events shaped like what the workers emit, for the sink's, the dashboard's and the responder's tests.
/// The times are fixed (`baseTime`, 2025-10-09) so that runs compare byte for byte.
public let baseTime: Int64 = 1_760_000_000_000
public let day: Int64 = 86_400_000

/// A subscription / one-time event shaped like what the workers emit.
public func makeEvent(
    _ id: String, kind: String, effect: EntitlementEffect, signed: Int64, subject: String? = "otx-1",
    product: String = "com.example.premium.monthly", productType: String = ProductType.autoRenewable.rawValue,
    entitlement: String? = "premium", transactionId: String? = "tx-1", originalTransactionId: String? = "otx-1",
    environment: String = "Sandbox", validFrom: Int64? = nil, validUntil: Int64? = nil,
    revocationDate: Int64? = nil, revocationPercentage: Int? = nil, units: Int? = nil, quantity: Int? = 1,
    notificationType: String? = nil, subtype: String? = nil, uuid: String? = nil, offset: Int64 = 0
) -> EntitlementEvent {
    var transaction: JSONValue? = nil
    if let transactionId {
        var o: [String: JSONValue] = [
            "transactionId": .string(transactionId), "productId": .string(product), "type": .string(productType),
            "signedDate": .integer(signed), "environment": .string(environment), "inAppOwnershipType": .string("PURCHASED"),
            "purchaseDate": .integer(validFrom ?? signed), "bundleId": .string("com.example.app"),
        ]
        if let originalTransactionId { o["originalTransactionId"] = .string(originalTransactionId) }
        if let quantity { o["quantity"] = .integer(Int64(quantity)) }
        if let validUntil { o["expiresDate"] = .integer(validUntil) }
        if let revocationDate {
            o["revocationDate"] = .integer(revocationDate)
            o["revocationReason"] = .integer(1)
        }
        if let revocationPercentage { o["revocationPercentage"] = .integer(Int64(revocationPercentage)) }
        transaction = .object(o)
    }
    let notification = notificationType.map {
        EventNotification(uuid: uuid ?? "n-\(id)", type: $0, subtype: subtype, signedDate: signed, version: "2.0")
    }
    return EntitlementEvent(
        eventId: id, kind: kind, effect: effect, reason: subtype?.lowercased(), environment: environment,
        bundleId: "com.example.app", appAppleId: 1234, subject: subject, productId: product, productType: productType,
        transactionId: transactionId, originalTransactionId: originalTransactionId,
        quantity: quantity, validFrom: validFrom, validUntil: validUntil, revocationDate: revocationDate,
        revocationReason: revocationDate == nil ? nil : 1, revocationType: revocationDate == nil ? nil : "REFUND_FULL",
        revocationPercentage: revocationPercentage, notification: notification, signedDate: signed,
        verifiedAt: signed + 1_000, source: EventSource(topic: FleetTopics.raw, partition: 0, offset: offset, kind: .notification),
        units: units, entitlement: entitlement, transaction: transaction)
}

public func encode(_ event: EntitlementEvent) -> [UInt8] {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys]
    return Array((try? encoder.encode(event)) ?? Data())
}

/// A mixed stream over several subjects: subscriptions with renewals, refunds, reversals, state changes,
/// consumables (including repeats), and a TEST notification. Delivered in a shuffled order.
public func mixedStream(subjects: Int = 6) -> [EntitlementEvent] {
    var events: [EntitlementEvent] = []
    for s in 0..<subjects {
        let otx = "otx-\(s)"
        let t0 = baseTime + Int64(s) * 1000
        events.append(makeEvent("e\(s)-buy", kind: "SUBSCRIPTION_STARTED", effect: .grant, signed: t0, subject: otx,
            transactionId: otx, originalTransactionId: otx, validFrom: t0, validUntil: t0 + 30 * day,
            notificationType: "SUBSCRIBED", subtype: "INITIAL_BUY"))
        events.append(makeEvent("e\(s)-renew", kind: "SUBSCRIPTION_RENEWED", effect: .extend, signed: t0 + 30 * day,
            subject: otx, transactionId: "\(otx)-r1", originalTransactionId: otx, validFrom: t0 + 30 * day,
            validUntil: t0 + 60 * day, notificationType: "DID_RENEW"))
        events.append(makeEvent("e\(s)-autorenew-off", kind: "AUTO_RENEW_DISABLED", effect: .state, signed: t0 + 31 * day,
            subject: otx, transactionId: "\(otx)-r1", originalTransactionId: otx, validUntil: t0 + 60 * day,
            notificationType: "DID_CHANGE_RENEWAL_STATUS", subtype: "AUTO_RENEW_DISABLED"))
        if s % 2 == 0 {
            events.append(makeEvent("e\(s)-refund", kind: "REFUNDED", effect: .revoke, signed: t0 + 35 * day,
                subject: otx, transactionId: "\(otx)-r1", originalTransactionId: otx, validUntil: t0 + 60 * day,
                revocationDate: t0 + 35 * day, notificationType: "REFUND"))
        }
        if s % 4 == 0 {
            events.append(makeEvent("e\(s)-reversed", kind: "REFUND_REVERSED", effect: .restore, signed: t0 + 40 * day,
                subject: otx, transactionId: "\(otx)-r1", originalTransactionId: otx, validUntil: t0 + 60 * day,
                notificationType: "REFUND_REVERSED"))
        }
        // Consumables: a purchase delivered three times (notification + two client JWS), one refunded.
        let ctx = "c-\(s)"
        for copy in 0..<3 {
            events.append(makeEvent("e\(s)-gems-\(copy)", kind: "ONE_TIME_PURCHASED", effect: .grant, signed: t0 + 2 * day,
                subject: "user-\(s)", product: "com.example.gems100", productType: ProductType.consumable.rawValue, entitlement: nil,
                transactionId: ctx, originalTransactionId: ctx, units: 100,
                notificationType: copy == 0 ? "ONE_TIME_CHARGE" : nil))
        }
        if s % 3 == 0 {
            events.append(makeEvent("e\(s)-gems-refund", kind: "REFUNDED", effect: .revoke, signed: t0 + 3 * day,
                subject: "user-\(s)", product: "com.example.gems100", productType: ProductType.consumable.rawValue, entitlement: nil,
                transactionId: ctx, originalTransactionId: ctx, revocationDate: t0 + 3 * day, revocationPercentage: 50_000,
                units: 100, notificationType: "REFUND"))
        }
    }
    events.append(makeEvent("test-1", kind: "TEST_RECEIVED", effect: .info, signed: baseTime, subject: nil,
        transactionId: nil, originalTransactionId: nil, notificationType: "TEST"))
    var generator = SplitMix(seed: 42)
    return events.shuffled(using: &generator)
}

public struct SplitMix: RandomNumberGenerator {
    public var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

public func chunks<T>(_ items: [T], of size: Int) -> [[T]] {
    stride(from: 0, to: items.count, by: size).map { Array(items[$0..<min($0 + size, items.count)]) }
}

