import AppStoreVerification
import EntitlementDomain
import Testing

@testable import FleetIngest

/// The 200 answer of `/v1/transactions` is written directly; it must be exactly the JSON object the API documents,
/// serialized with sorted keys as `JSONValue`'s writer does (the form it had when it was built as a value tree).
@Suite("ingest verified answer bytes")
struct IngestResponseBodyTests {
    static func reference(_ events: [EntitlementEvent], kind: VerifiedItem.Kind) -> [UInt8] {
        var ids: [String] = []
        for e in events { if let t = e.transactionId, !ids.contains(t) { ids.append(t) } }
        let list: [JSONValue] = events.map { e in
            .object([
                "kind": .string(e.kind), "effect": .string(e.effect.rawValue), "productId": e.productId.map(JSONValue.string) ?? .null,
                "entitlement": e.entitlement.map(JSONValue.string) ?? .null, "validUntil": e.validUntil.map(JSONValue.integer) ?? .null,
            ])
        }
        let object: JSONValue = .object([
            "verdict": .string("verified"), "kind": .string(kind.rawValue), "transactionIds": .array(ids.map(JSONValue.string)),
            "events": .array(list),
        ])
        return object.serializedBytes(sortedKeys: true) + [UInt8(ascii: "\n")]
    }

    static func event(_ kind: String, _ effect: EntitlementEffect, transactionId: String?, productId: String?,
                      entitlement: String?, validUntil: Int64?) -> EntitlementEvent {
        EntitlementEvent(
            eventId: "e", kind: kind, effect: effect, environment: "Sandbox", productId: productId, transactionId: transactionId,
            validUntil: validUntil, signedDate: 1, verifiedAt: 2,
            source: EventSource(topic: "t", partition: 0, offset: 0, inputKind: "transaction"), entitlement: entitlement)
    }

    @Test("the same bytes as the sorted value tree, for no events, several, repeated ids, nulls and escapes")
    func sameBytes() {
        let cases: [[EntitlementEvent]] = [
            [],
            [Self.event("PURCHASED", .grant, transactionId: "2000000000000042", productId: "com.example.coins", entitlement: "coins", validUntil: nil)],
            [
                Self.event("PURCHASED", .grant, transactionId: "1", productId: "p.\"quoted\"\\", entitlement: nil, validUntil: 1_760_259_200_000),
                Self.event("RENEWED", .extend, transactionId: "1", productId: nil, entitlement: "pro é \u{1}", validUntil: -5),
                Self.event("REFUNDED", .revoke, transactionId: nil, productId: "x", entitlement: "y", validUntil: 0),
                Self.event("OTHER", .info, transactionId: "2", productId: "x", entitlement: nil, validUntil: nil),
            ],
        ]
        for events in cases {
            for kind in VerifiedItem.Kind.allCases {
                #expect(IngestHandler.verifiedBody(events, kind: kind) == Self.reference(events, kind: kind))
            }
        }
    }
}
