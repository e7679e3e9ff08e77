import AppStoreVerification
import EntitlementDomain
import Foundation

let day: Int64 = 86_400_000
let baseTime: Int64 = 1_763_900_000_000  // 2025-11-23T12:13:20Z

func event(
    _ id: String, kind: String = "SUBSCRIPTION_STARTED", effect: EntitlementEffect = .grant, signed: Int64 = baseTime,
    verifiedAt: Int64? = nil, subject: String? = "otx-1", product: String = "com.example.premium.monthly",
    productType: String = "Auto-Renewable Subscription", entitlement: String? = "premium", transactionId: String? = "tx-1",
    originalTransactionId: String? = "otx-1", environment: String = "Production", validUntil: Int64? = nil,
    price: Int64? = nil, currency: String = "USD", units: Int? = nil, revocationPercentage: Int? = nil,
    expiresDate: Int64? = nil
) -> EntitlementEvent {
    var t: [String: JSONValue] = [:]
    if let transactionId { t["transactionId"] = .string(transactionId) }
    if let price { t["price"] = .integer(price); t["currency"] = .string(currency) }
    if let expiresDate { t["expiresDate"] = .integer(expiresDate) }
    return EntitlementEvent(
        eventId: id, kind: kind, effect: effect, environment: environment, subject: subject, productId: product,
        productType: productType, transactionId: transactionId, originalTransactionId: originalTransactionId,
        validFrom: signed, validUntil: validUntil, revocationPercentage: revocationPercentage, signedDate: signed,
        verifiedAt: verifiedAt ?? signed, source: EventSource(topic: "appstore.raw", partition: 0, offset: 0, inputKind: "notification"),
        units: units, entitlement: entitlement, transaction: t.isEmpty ? nil : .object(t))
}

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}
