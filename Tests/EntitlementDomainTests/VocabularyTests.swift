import AppStoreVerification
import Testing

@testable import EntitlementDomain

@Suite struct TopicAndHeaderVocabulary {
    @Test func defaultTopicsInFlowOrder() {
        #expect(FleetTopics.all == ["appstore.raw", "entitlements.verified", "appstore.rejected", "entitlements.sink-rejected"])
        #expect(Set(FleetTopics.all).count == 4)
    }

    @Test func rejectedRecordHeaders() {
        let headers = FleetHeaders.rejected(
            reason: "INVALID_SIGNATURE", detail: String(repeating: "x", count: 2500), sourceTopic: "raw",
            sourcePartition: 3, sourceOffset: 41) { (key: $0, value: $1) }
        #expect(headers.map(\.key) == ["reason", "detail", "source-topic", "source-partition", "source-offset"])
        #expect(headers.map(\.value) == ["INVALID_SIGNATURE", String(repeating: "x", count: 2000), "raw", "3", "41"])
    }

    @Test func resultRecordHeaders() {
        let e = EntitlementEvent(
            eventId: "id-1", kind: "REFUNDED", effect: .revoke, environment: "Sandbox", signedDate: 1, verifiedAt: 2,
            source: EventSource(topic: "raw", partition: 0, offset: 0, kind: .transaction))
        let headers = FleetHeaders.result(e) { (key: $0, value: $1) }
        #expect(headers.map(\.key) == ["event-kind", "event-id"])
        #expect(headers.map(\.value) == ["REFUNDED", "id-1"])
        #expect(FleetHeaders.deviceVerificationId == "device-verification-id")
    }
}

@Suite struct EventTypedAccessors {
    static func event(transaction: JSONValue?, productType: String?) -> EntitlementEvent {
        EntitlementEvent(
            eventId: "e", kind: "ONE_TIME_PURCHASED", effect: .grant, environment: "Sandbox", productType: productType,
            signedDate: 1, verifiedAt: 2, source: EventSource(topic: "raw", partition: 0, offset: 0, inputKind: "transaction"),
            transaction: transaction, renewalInfo: .object(["gracePeriodExpiresDate": .integer(9)]),
            appTransaction: .object(["appTransactionId": .string("app-1")]))
    }

    @Test func embeddedPayloadsReadTyped() {
        let e = Self.event(
            transaction: .object([
                "isUpgraded": .bool(true), "price": .integer(990), "currency": .string("JPY"), "expiresDate": .integer(7),
                "someFutureAppleField": .string("kept"),
            ]),
            productType: "Consumable")
        #expect(e.transactionPayload?.isUpgraded == true)
        #expect(e.transactionPayload?.price == 990 && e.transactionPayload?.currency == "JPY")
        #expect(e.transactionPayload?.expiresDate == 7)
        #expect(e.transactionPayload?.raw["someFutureAppleField"] == .string("kept"))
        #expect(e.renewalInfoPayload?.gracePeriodExpiresDate == 9)
        #expect(e.appTransactionPayload?.appTransactionId == "app-1")
        #expect(e.appleProductType == .consumable && e.isConsumable && !e.isAutoRenewable)
        #expect(e.source.kind == .transaction)
        #expect(EntitlementMapper.partitionKey(for: e) == "app-1")
    }

    @Test func absentPayloadsAndUnknownKinds() {
        let e = Self.event(transaction: nil, productType: ProductType.autoRenewable.rawValue)
        #expect(e.transactionPayload == nil)
        #expect(e.isAutoRenewable && !e.isConsumable)
        #expect(EventSource(topic: "t", partition: 0, offset: 0, inputKind: "somethingNew").kind == nil)
    }

    @Test func catalogueKindsAndApplesProductTypes() {
        for kind in ProductCatalogue.ProductKind.allCases {
            #expect(ProductCatalogue.ProductKind(productType: kind.productType) == kind)
        }
        #expect(ProductCatalogue.ProductKind(productType: ProductType("Some Future Type")) == nil)
    }
}
