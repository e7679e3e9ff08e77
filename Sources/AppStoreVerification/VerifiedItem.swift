/// A verified transaction JWS.
public struct VerifiedTransaction: Sendable, Hashable {
    public let payload: JWSTransactionDecodedPayload
    public var environment: Environment { payload.environment ?? Environment("") }
    public init(payload: JWSTransactionDecodedPayload) { self.payload = payload }
}

/// A verified renewal-info JWS.
public struct VerifiedRenewalInfo: Sendable, Hashable {
    public let payload: JWSRenewalInfoDecodedPayload
    public var environment: Environment { payload.environment ?? Environment("") }
    public init(payload: JWSRenewalInfoDecodedPayload) { self.payload = payload }
}

/// A verified AppTransaction JWS.
public struct VerifiedAppTransaction: Sendable, Hashable {
    public let payload: AppTransaction
    public var environment: Environment { payload.receiptType ?? Environment("") }
    public init(payload: AppTransaction) { self.payload = payload }
}

/// A verified notification: the outer payload plus its nested JWS, each verified on its own.
public struct VerifiedNotification: Sendable, Hashable {
    public let payload: ResponseBodyV2DecodedPayload
    /// `data.signedTransactionInfo`, verified.
    public let transaction: JWSTransactionDecodedPayload?
    /// `data.signedRenewalInfo`, verified.
    public let renewalInfo: JWSRenewalInfoDecodedPayload?
    /// `appData.signedAppTransactionInfo`, verified.
    public let appTransaction: AppTransaction?

    public var environment: Environment { payload.environment ?? Environment("") }

    public init(
        payload: ResponseBodyV2DecodedPayload, transaction: JWSTransactionDecodedPayload?,
        renewalInfo: JWSRenewalInfoDecodedPayload?, appTransaction: AppTransaction?
    ) {
        self.payload = payload
        self.transaction = transaction
        self.renewalInfo = renewalInfo
        self.appTransaction = appTransaction
    }
}

/// Any verified input.
public enum VerifiedItem: Sendable, Hashable {
    case notification(VerifiedNotification)
    case transaction(VerifiedTransaction)
    case renewalInfo(VerifiedRenewalInfo)
    case appTransaction(VerifiedAppTransaction)
    /// A legacy PKCS#7 app receipt.
    case appReceipt(VerifiedAppReceipt)

    /// The kind of a verified input, the one vocabulary for it: the kind the verifier detects (or is asked for), the
    /// case the mapper maps, `fleet verify`'s `"kind"` and an event's `source.inputKind` (the raw values).
    public enum Kind: String, Sendable, Hashable, Codable, CaseIterable {
        case notification, transaction, renewalInfo, appTransaction
        /// A legacy PKCS#7 app receipt or StoreKit 1 transaction receipt: never the kind of a JWS.
        case appReceipt
    }

    public var itemKind: Kind {
        switch self {
        case .notification: return .notification
        case .transaction: return .transaction
        case .renewalInfo: return .renewalInfo
        case .appTransaction: return .appTransaction
        case .appReceipt: return .appReceipt
        }
    }

    /// `itemKind`'s name: `notification`, `transaction`, `renewalInfo`, `appTransaction` or `appReceipt`.
    public var kind: String { itemKind.rawValue }

    /// The verified transaction this item is or carries (a notification's `data.signedTransactionInfo`).
    public var transactionPayload: JWSTransactionDecodedPayload? {
        switch self {
        case .transaction(let t): return t.payload
        case .notification(let n): return n.transaction
        case .renewalInfo, .appTransaction, .appReceipt: return nil
        }
    }

    public var environment: Environment {
        switch self {
        case .notification(let n): return n.environment
        case .transaction(let t): return t.environment
        case .renewalInfo(let r): return r.environment
        case .appTransaction(let a): return a.environment
        case .appReceipt(let r): return r.environment
        }
    }

    /// The decoded payload as JSON, with nested JWS replaced by their decoded (verified) objects.
    public var renderedJSON: JSONValue {
        switch self {
        case .transaction(let t): return t.payload.raw
        case .renewalInfo(let r): return r.payload.raw
        case .appTransaction(let a): return a.payload.raw
        case .appReceipt(let r): return r.payload.json
        case .notification(let n):
            guard case .object(var outer) = n.payload.raw else { return n.payload.raw }
            if case .object(var data)? = outer["data"] {
                if let t = n.transaction { data["signedTransactionInfo"] = t.raw }
                if let r = n.renewalInfo { data["signedRenewalInfo"] = r.raw }
                outer["data"] = .object(data)
            }
            if case .object(var appData)? = outer["appData"], let a = n.appTransaction {
                appData["signedAppTransactionInfo"] = a.raw
                outer["appData"] = .object(appData)
            }
            return .object(outer)
        }
    }
}
