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

    /// A record of many keys, at the top level or in an embedded document, costs the sink time in proportion to its
    /// size: duplicate keys are looked for in a set, not by comparing each key with every one before it (which took
    /// 81 s for a document of 20,000 keys in a debug build). The time limit is what fails if that ever comes back:
    /// this takes well under a second here.
    @Test("a record of many keys is decoded in linear time, and a duplicate among them is still found",
          .timeLimit(.minutes(1)))
    func manyKeys() throws {
        let keys = 60_000
        var bytes = Self.full.jsonBytes()
        bytes.removeLast()  // the closing brace
        var extra = ",\"details\":{"
        for k in 0..<keys { extra += "\"d\(k)\":\(k)," }
        // An escaped key switches the duplicate check from bytes to decoded strings midway.
        extra += "\"\\u0041\":1,"
        for k in 0..<keys { extra += "\"e\(k)\":\(k)," }
        extra += "\"z\":0}"
        for k in 0..<keys { extra += ",\"u\(k)\":\(k)" }
        let record = bytes + Array(extra.utf8) + [UInt8(ascii: "}")]
        let decoded = try EntitlementEvent.decodeForSink(record, keepingDocumentTexts: true, parsingDocuments: false).get()
        #expect(decoded.event.eventId == Self.full.eventId)
        #expect(decoded.documents.details?.utf8.count ?? 0 > keys * 8)

        // The same, with a duplicate at the very end of the document (after the switch to decoded strings: "A"), and
        // with one among the top-level keys no reader names.
        let documentDuplicate = Array(String(decoding: record, as: UTF8.self).replacingOccurrences(of: "\"z\":0}", with: "\"A\":0}").utf8)
        let topDuplicate = record.dropLast() + Array(",\"u7\":1}".utf8)
        for (bad, key) in [(documentDuplicate, "A"), (Array(topDuplicate), "u7")] {
            guard case .failure(let failure) = EntitlementEvent.decodeForSink(bad, keepingDocumentTexts: true, parsingDocuments: false) else {
                Issue.record("a duplicate key \(key) was accepted")
                continue
            }
            #expect(failure.reason == "undecodable")
            #expect(failure.detail.contains("duplicate key \"\(key)\""), "\(failure.detail)")
            // Full parsing finds the same duplicate at the same offset.
            #expect(throws: (any Error).self) { try JSONValue.parse(bytes: bad, maxDepth: 64) }
            if case .failure(let parsed) = Result(catching: { () throws(JSONParseError) in try JSONValue.parse(bytes: bad, maxDepth: 64) }) {
                #expect(failure.detail == "not JSON: \(parsed)")
            }
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
