import AppStoreVerification

extension EntitlementMapper {
    /// Legacy app receipts (the `appReceipt` payload of the verification core): one event per in-app entry, each
    /// mapped like a verified StoreKit 2 transaction of the same product (so the sink's ledger, keyed by environment
    /// + transactionId, credits a consumable once whether it arrives in a receipt, a JWS, or both):
    /// - product type: the catalogue wins, then field 1707 (0 non-consumable, 1 consumable, 2 non-renewing,
    ///   3 auto-renewable); with neither the entry is kept as an INFO event (`RECEIPT_ENTRY_OBSERVED`) with its
    ///   product id;
    /// - consumables and non-consumables GRANT, auto-renewable periods are observed with their expiry (GRANT while
    ///   unexpired at the receipt creation date, else INFO), a `cancellationDate` REVOKEs (REFUNDED);
    /// - `signedDate` = receipt creation date (ordering), subject = originalTransactionId.
    func receiptEvents(_ receipt: JSONValue, source: EventSource, verifiedAt: Int64) throws(DomainRejection) -> [EntitlementEvent] {
        let created = receipt["receiptCreationDate"]?.int64Value ?? 0
        let environment = receipt["environment"]?.stringValue ?? "Unknown"
        var events: [EntitlementEvent] = []
        for entry in receipt["inApp"]?.arrayValue ?? [] {
            let productId = entry["productId"]?.stringValue
            let product = productId.flatMap { catalogue[$0] }
            let known = product != nil
            let txn = Self.transactionShape(
                entry, receipt: receipt, created: created, catalogueType: product?.kind.appleProductType)
            if !known && txn["type"] == nil {
                if let productId, requireKnownProducts {
                    throw DomainRejection(reason: .unknownProduct, detail: "productId \(productId) is not in the product catalogue")
                }
                var e = EntitlementEvent(
                    eventId: "", kind: "RECEIPT_ENTRY_OBSERVED", effect: .info, reason: "receipt_unknown_product_type",
                    environment: environment, bundleId: receipt["bundleId"]?.stringValue,
                    appAppleId: receipt["appAppleId"]?.int64Value,
                    subject: txn["originalTransactionId"]?.stringValue ?? txn["transactionId"]?.stringValue,
                    productId: productId, transactionId: txn["transactionId"]?.stringValue,
                    originalTransactionId: txn["originalTransactionId"]?.stringValue,
                    signedDate: created, verifiedAt: verifiedAt, source: source, transaction: txn)
                e.quantity = txn["quantity"]?.int64Value.map { Int($0) }
                events.append(finish(e, key: "receipt:\(txn["transactionId"]?.stringValue ?? "")"))
                continue
            }
            for var e in try clientTransactionEvents(txn, source: source, verifiedAt: verifiedAt) {
                e.appAppleId = receipt["appAppleId"]?.int64Value
                events.append(e)
            }
        }
        return events
    }

    /// An in-app entry as a JWS-transaction-shaped object (Apple's JWS names and product type spellings).
    static func transactionShape(
        _ entry: JSONValue, receipt: JSONValue, created: Int64, catalogueType: String? = nil
    ) -> JSONValue {
        var t: [String: JSONValue] = [:]
        for key in ["transactionId", "originalTransactionId", "productId", "quantity", "purchaseDate",
                    "originalPurchaseDate", "expiresDate", "promotionalOfferId"] {
            if let v = entry[key] { t[key] = v }
        }
        if let v = entry["webOrderLineItemId"]?.int64Value { t["webOrderLineItemId"] = .string(String(v)) }
        if let v = entry["cancellationDate"] { t["revocationDate"] = v }
        switch entry["productType"]?.int64Value {
        case 0: t["type"] = .string("Non-Consumable")
        case 1: t["type"] = .string("Consumable")
        case 2: t["type"] = .string("Non-Renewing Subscription")
        case 3: t["type"] = .string("Auto-Renewable Subscription")
        default: break
        }
        if let catalogueType { t["type"] = .string(catalogueType) }
        if let env = receipt["environment"] { t["environment"] = env }
        if let b = receipt["bundleId"] { t["bundleId"] = b }
        t["signedDate"] = .integer(created)
        return .object(t)
    }
}
