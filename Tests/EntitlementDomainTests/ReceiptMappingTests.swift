import AppStoreVerification
import Foundation
import Testing

@testable import EntitlementDomain

// Legacy app receipts: one event per in-app entry, mapped like a StoreKit 2 transaction of the same product.

private let day: Int64 = 86_400_000
private let created: Int64 = 1_760_000_000_000
private let source = EventSource(topic: "appstore.raw", partition: 0, offset: 7, inputKind: "appReceipt")

private func entry(
    _ id: String, product: String, type: Int64?, quantity: Int64 = 1, expires: Int64? = nil, cancelled: Int64? = nil,
    original: String? = nil
) -> AppReceiptInApp {
    var e = AppReceiptInApp()
    e.transactionId = id
    e.originalTransactionId = original ?? id
    e.productId = product
    e.quantity = quantity
    e.purchaseDate = created - day
    e.originalPurchaseDate = created - day
    e.productType = type
    e.expiresDate = expires
    e.cancellationDate = cancelled
    return e
}

private func receipt(_ entries: [AppReceiptInApp]) -> VerifiedItem {
    var r = AppReceipt()
    r.receiptType = "ProductionSandbox"
    r.bundleId = "com.example.app"
    r.appAppleId = 0
    r.receiptCreationDate = created
    r.inApp = entries
    return .appReceipt(VerifiedAppReceipt(payload: r))
}

@Suite struct ReceiptMapping {
    @Test func oneEventPerEntryWithTheRightEffect() throws {
        let input = receipt([
            entry("1", product: "coins", type: 1, quantity: 3),
            entry("2", product: "unlock", type: 0),
            entry("3", product: "monthly", type: 3, expires: created + 10 * day, original: "3"),
            entry("4", product: "monthly", type: 3, expires: created - 20 * day, original: "3"),
            entry("5", product: "coins", type: 1, cancelled: created - 1000),
            entry("6", product: "mystery", type: nil),
        ])
        let events = try EntitlementMapper().events(for: input, source: source, verifiedAt: created + 5)
        #expect(events.count == 6)
        #expect(events.allSatisfy { $0.environment == "Sandbox" && $0.signedDate == created })
        #expect(events[0].kind == "ONE_TIME_PURCHASED" && events[0].effect == .grant && events[0].units == 3)
        #expect(events[0].productType == "Consumable" && events[0].transactionId == "1" && events[0].subject == "1")
        #expect(events[1].effect == .grant && events[1].productType == "Non-Consumable")
        #expect(events[2].kind == "SUBSCRIPTION_OBSERVED" && events[2].effect == .grant)
        #expect(events[2].validUntil == created + 10 * day)
        #expect(events[3].kind == "SUBSCRIPTION_OBSERVED" && events[3].effect == .info)
        #expect(events[4].kind == "REFUNDED" && events[4].effect == .revoke)
        #expect(events[5].kind == "RECEIPT_ENTRY_OBSERVED" && events[5].effect == .info && events[5].productId == "mystery")
        #expect(Set(events.map(\.eventId)).count == 6)
    }

    @Test func theCatalogueWinsOverField1707() throws {
        let catalogue = ProductCatalogue(products: [.init(productId: "gems", kind: .consumable, units: 50)])
        let input = receipt([entry("9", product: "gems", type: 0, quantity: 2), entry("10", product: "gems", type: nil)])
        let events = try EntitlementMapper(catalogue: catalogue).events(for: input, source: source, verifiedAt: created)
        #expect(events.map(\.units) == [100, 50])
        #expect(events.allSatisfy { $0.effect == .grant })
    }

    @Test func eventIdsAreDeterministicAndMatchTheSameReceipt() throws {
        let input = receipt([entry("1", product: "coins", type: 1)])
        let a = try EntitlementMapper().events(for: input, source: source, verifiedAt: created)
        let b = try EntitlementMapper().events(for: input, source: source, verifiedAt: created + 99_000)
        #expect(a.map(\.eventId) == b.map(\.eventId))
    }

    @Test func unknownProductsAreRefusedWhenRequired() {
        let input = receipt([entry("1", product: "nope", type: 1)])
        #expect(throws: DomainRejection.self) {
            try EntitlementMapper(requireKnownProducts: true).events(for: input, source: source, verifiedAt: created)
        }
    }
}
