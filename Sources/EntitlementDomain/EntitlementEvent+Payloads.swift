import AppStoreVerification

// Typed views of what an event embeds, through the core's models: readers (the sink, the rules, the dashboard) use
// these, never Apple's field names. The embedded JSON stays as the worker wrote it (unknown fields kept).

extension EntitlementEvent {
    /// The verified transaction (`transaction`), typed.
    public var transactionPayload: JWSTransactionDecodedPayload? { transaction.map(JWSTransactionDecodedPayload.init(raw:)) }

    /// The verified renewal info (`renewalInfo`), typed.
    public var renewalInfoPayload: JWSRenewalInfoDecodedPayload? { renewalInfo.map(JWSRenewalInfoDecodedPayload.init(raw:)) }

    /// The verified AppTransaction (`appTransaction`), typed.
    public var appTransactionPayload: AppTransaction? { appTransaction.map(AppTransaction.init(raw:)) }

    /// `productType`, typed.
    public var appleProductType: ProductType? { productType.map(ProductType.init(rawValue:)) }

    public var isConsumable: Bool { appleProductType == .consumable }

    public var isAutoRenewable: Bool { appleProductType == .autoRenewable }
}

extension EventSource {
    /// The kind of the verified input; nil for a name this build does not know.
    public var kind: VerifiedItem.Kind? { VerifiedItem.Kind(rawValue: inputKind) }

    public init(topic: String, partition: Int32, offset: Int64, kind: VerifiedItem.Kind) {
        self.init(topic: topic, partition: partition, offset: offset, inputKind: kind.rawValue)
    }
}
