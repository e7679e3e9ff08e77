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
    func receiptEvents(_ receipt: AppReceipt, source: EventSource, verifiedAt: Int64) throws(DomainRejection) -> [EntitlementEvent] {
        let created = receipt.receiptCreationDate ?? 0
        var events: [EntitlementEvent] = []
        for entry in receipt.inApp {
            let product = entry.productId.flatMap { catalogue[$0] }
            let txn = Self.transactionShape(entry, receipt: receipt, created: created, catalogueType: product?.kind.productType)
            if product == nil && entry.type == nil {
                if let productId = entry.productId, requireKnownProducts {
                    throw DomainRejection(reason: .unknownProduct, detail: "productId \(productId) is not in the product catalogue")
                }
                var e = EntitlementEvent(
                    eventId: "", kind: "RECEIPT_ENTRY_OBSERVED", effect: .info, reason: "receipt_unknown_product_type",
                    environment: receipt.environment.rawValue, bundleId: receipt.bundleId, appAppleId: receipt.appAppleId,
                    subject: entry.originalTransactionId ?? entry.transactionId,
                    productId: entry.productId, transactionId: entry.transactionId,
                    originalTransactionId: entry.originalTransactionId,
                    signedDate: created, verifiedAt: verifiedAt, source: source, transaction: txn.raw)
                e.quantity = entry.quantity.map { Int($0) }
                events.append(finish(e, key: "receipt:\(entry.transactionId ?? "")"))
                continue
            }
            for var e in try clientTransactionEvents(txn, source: source, verifiedAt: verifiedAt) {
                e.appAppleId = receipt.appAppleId
                events.append(e)
            }
        }
        return events
    }

    /// An in-app entry as a JWS transaction (Apple's JWS names and product type spellings): `cancellationDate` is
    /// its `revocationDate`, the receipt creation date its `signedDate`, the catalogue's type wins over field 1707.
    static func transactionShape(
        _ entry: AppReceiptInApp, receipt: AppReceipt, created: Int64, catalogueType: ProductType? = nil
    ) -> JWSTransactionDecodedPayload {
        var t: [String: JSONValue] = [:]
        func put(_ key: String, _ value: String?) { if let value { t[key] = .string(value) } }
        func put(_ key: String, _ value: Int64?) { if let value { t[key] = .integer(value) } }
        put("transactionId", entry.transactionId)
        put("originalTransactionId", entry.originalTransactionId)
        put("productId", entry.productId)
        put("quantity", entry.quantity)
        put("purchaseDate", entry.purchaseDate)
        put("originalPurchaseDate", entry.originalPurchaseDate)
        put("expiresDate", entry.expiresDate)
        put("promotionalOfferId", entry.promotionalOfferId)
        put("webOrderLineItemId", entry.webOrderLineItemId.map { String($0) })
        put("revocationDate", entry.cancellationDate)
        put("type", (catalogueType ?? entry.type)?.rawValue)
        put("environment", receipt.environment.rawValue)
        put("bundleId", receipt.bundleId)
        t["signedDate"] = .integer(created)
        return JWSTransactionDecodedPayload(raw: .object(t))
    }
}
