import AppStoreVerification

extension VerifiedInput {
    /// The mapper's view of an item verified by the core: every decoded JSON kept, nested JWS already verified.
    public init(_ item: VerifiedItem) {
        switch item {
        case .notification(let n):
            self.init(kind: .notification, payload: n.payload.raw, transaction: n.transaction?.raw,
                      renewalInfo: n.renewalInfo?.raw, appTransaction: n.appTransaction?.raw)
        case .transaction(let t):
            self.init(kind: .transaction, payload: t.payload.raw)
        case .renewalInfo(let r):
            self.init(kind: .renewalInfo, payload: r.payload.raw)
        case .appTransaction(let a):
            self.init(kind: .appTransaction, payload: a.payload.raw)
        case .appReceipt(let r):
            self.init(kind: .appReceipt, payload: r.payload.json)
        }
    }
}
