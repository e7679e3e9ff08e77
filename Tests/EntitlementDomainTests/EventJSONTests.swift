import AppStoreVerification
import EntitlementDomain
import Foundation
import Testing

/// The hand-written event codec (`jsonBytes()` / `init(jsonBytes:)`, used by the workers and the sink) agrees with
/// the Codable one (what other consumers of the result topic use) in both directions.
@Suite("Entitlement event JSON codec")
struct EventJSONTests {
    static let full = EntitlementEvent(
        eventId: "e1", kind: "REFUNDED", effect: .revoke, reason: "refund", environment: "Sandbox",
        bundleId: "com.example.app", appAppleId: 1234567890, subject: "7c3e8d7a-0000-4000-8000-000000000001",
        productId: "com.example.pro.monthly", productType: "Auto-Renewable Subscription", transactionId: "2000000000000002",
        originalTransactionId: "2000000000000001", webOrderLineItemId: "500000000000002",
        appAccountToken: "7c3e8d7a-0000-4000-8000-000000000001", ownershipType: "PURCHASED", quantity: 2,
        validFrom: 1_760_000_000_000, validUntil: 1_760_259_200_000, revocationDate: 1_760_259_200_000,
        revocationReason: 0, revocationType: "REFUND_PRORATED", revocationPercentage: 50_000,
        notification: EventNotification(uuid: "0b8e1f0c", type: "REFUND", subtype: nil, signedDate: 1_760_259_201_000, version: "2.0"),
        signedDate: 1_760_259_201_000, verifiedAt: 1_760_259_201_350,
        source: EventSource(topic: "appstore.raw", partition: 2, offset: 41, inputKind: "notification"),
        units: 20, entitlement: "pro",
        transaction: .object(["transactionId": .string("2000000000000002"), "price": .integer(9990), "note": .string("quote \" and \\ and \u{1} and é")]),
        renewalInfo: .object(["autoRenewStatus": .integer(1), "list": .array([.bool(true), .null])]))

    @Test("fast encode -> fast decode and Codable decode give the same event")
    func fastEncode() throws {
        let bytes = Self.full.jsonBytes()
        #expect(try EntitlementEvent(jsonBytes: bytes) == Self.full)
        #expect(try JSONDecoder().decode(EntitlementEvent.self, from: Data(bytes)) == Self.full)
    }

    @Test("Codable encode -> fast decode gives the same event")
    func codableEncode() throws {
        let data = try JSONEncoder().encode(Self.full)
        #expect(try EntitlementEvent(jsonBytes: Array(data)) == Self.full)
    }

    @Test("the sink's texts-only decode: the documents checked, not built, the same refusals")
    func textsOnlyDecode() throws {
        let bytes = Self.full.jsonBytes()
        let (event, texts) = try EntitlementEvent.decode(jsonBytes: bytes, keepingDocumentTexts: true, parsingDocuments: false)
        #expect(event == Self.full)
        #expect(event.transaction == Self.full.transaction && event.renewalInfo == Self.full.renewalInfo)
        #expect(event.appTransaction == nil && event.details == nil)
        #expect(event.jsonBytes() == bytes, "encoded from the texts as from the documents")
        #expect(try JSONDecoder().decode(EntitlementEvent.self, from: JSONEncoder().encode(event)) == Self.full)
        #expect(try texts.transaction.map { try JSONValue.parse($0) } == Self.full.transaction)
        #expect(try texts.renewalInfo.map { try JSONValue.parse($0) } == Self.full.renewalInfo)
        #expect(texts.appTransaction == nil && texts.details == nil)
        // A document with a duplicate key, a bad escape or an unclosed array is refused exactly as when it is parsed.
        let wire = String(decoding: bytes, as: UTF8.self)
        for broken in [
            wire.replacingOccurrences(of: #""price":9990"#, with: #""price":9990,"price":1"#),
            wire.replacingOccurrences(of: #""price":9990"#, with: #""price":"\x""#),
            wire.replacingOccurrences(of: #""autoRenewStatus":1"#, with: #""autoRenewStatus":[1"#),
        ] {
            #expect(broken != wire)
            let parsed = EntitlementEvent.decodeForSink(Array(broken.utf8), keepingDocumentTexts: true)
            let textsOnly = EntitlementEvent.decodeForSink(Array(broken.utf8), keepingDocumentTexts: true, parsingDocuments: false)
            guard case .failure(let a) = parsed, case .failure(let b) = textsOnly else {
                Issue.record("accepted: \(broken)")
                continue
            }
            #expect(a == b)
        }
    }

    @Test("another schema version and non-events are refused with a reason")
    func refusals() {
        var other = Self.full
        other.schema = "entitlement-event/v2"
        #expect(throws: EntitlementEvent.DecodingError.self) { try EntitlementEvent(jsonBytes: other.jsonBytes()) }
        do {
            _ = try EntitlementEvent(jsonBytes: other.jsonBytes())
        } catch {
            #expect(error.reason.hasPrefix("unsupported schema"))
        }
        #expect(throws: EntitlementEvent.DecodingError.self) { try EntitlementEvent(jsonBytes: Array("[1,2]".utf8)) }
        #expect(throws: EntitlementEvent.DecodingError.self) { try EntitlementEvent(jsonBytes: Array("{\"schema\":".utf8)) }
    }

    @Test("an event is a value: a changed copy leaves the original (and every other copy) as it was")
    func valueSemantics() throws {
        let original = Self.full
        var copy = original
        let third = copy
        #expect(copy == original)
        copy.productId = "other"
        copy.notification?.type = "DID_RENEW"
        copy.transaction = nil
        #expect(original == Self.full && third == Self.full)
        #expect(original.productId == "com.example.pro.monthly" && original.notification?.type == "REFUND")
        #expect(original.transaction != nil)
        #expect(copy.productId == "other" && copy.notification?.type == "DID_RENEW" && copy.transaction == nil)
        #expect(copy != original)
        // Changed back field by field, the copy equals the original again (equality is by fields, not by identity).
        copy.productId = original.productId
        copy.notification = original.notification
        copy.transaction = original.transaction
        #expect(copy == original)
    }

    @Test("the Codable form is the flat wire format: the event's members, no wrapper")
    func codableShape() throws {
        let object = try JSONSerialization.jsonObject(with: try JSONEncoder().encode(Self.full)) as? [String: Any]
        let fast = try JSONSerialization.jsonObject(with: Data(Self.full.jsonBytes())) as? [String: Any]
        #expect(object.map { Set($0.keys) } == fast.map { Set($0.keys) })
        #expect(object?["eventId"] as? String == "e1" && object?["schema"] as? String == EntitlementEvent.schemaVersion)
    }
}
