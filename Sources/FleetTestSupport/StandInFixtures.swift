import AppStoreServerAPI
import AppStoreVerification
import Crypto
import Foundation
import FleetTestPKI

/// Signed documents for the stand-in, signed by the test PKI, and an API key pair as App Store Connect issues them.
public enum StandInFixtures {
    /// A fresh P-256 key; `pem` is the PKCS#8 PEM of a `.p8` file.
    public static func apiKey() -> (key: P256.Signing.PrivateKey, pem: String) {
        let key = P256.Signing.PrivateKey()
        return (key, key.pemRepresentation)
    }

    /// `pages` pages of `perPage` signed notifications (DID_RENEW with a nested signed transaction each).
    public static func notificationPages(pki: TestPKI, pages: Int, perPage: Int, bundleId: String = TestPayloads.bundleId) -> [[String]] {
        (0..<pages).map { _ in
            (0..<perPage).map { _ in
                let original = String(UInt64.random(in: 1_000_000_000_000_000..<1_999_999_999_999_999))
                return pki.signNotification(
                    type: .didRenew, transaction: TestPayloads.transaction(originalTransactionId: original, bundleId: bundleId),
                    renewal: TestPayloads.renewalInfo(originalTransactionId: original), bundleId: bundleId)
            }
        }
    }

    public struct History: Sendable {
        public var originalTransactionId: String
        public var transactionIds: [String]
        public var signedTransactions: [String]
        public var status: LastTransactionsItem
    }

    /// A monthly subscription renewed `count - 1` times: `count` signed transactions, oldest first, and its status.
    public static func subscriptionHistory(pki: TestPKI, count: Int, bundleId: String = TestPayloads.bundleId) -> History {
        let original = String(UInt64.random(in: 1_000_000_000_000_000..<1_999_999_999_999_999))
        let month: Int64 = 30 * 86_400_000
        let start = TestPayloads.nowMillis() - Int64(count) * month
        var ids: [String] = []
        var signed: [String] = []
        for i in 0..<count {
            let id = i == 0 ? original : String(UInt64.random(in: 2_000_000_000_000_000..<2_999_999_999_999_999))
            ids.append(id)
            signed.append(pki.sign(TestPayloads.transaction(
                transactionId: id, originalTransactionId: original, purchaseDate: start + Int64(i) * month,
                originalPurchaseDate: start, bundleId: bundleId, transactionReason: i == 0 ? .purchase : .renewal)))
        }
        let renewal = pki.sign(TestPayloads.renewalInfo(originalTransactionId: original))
        return History(originalTransactionId: original, transactionIds: ids, signedTransactions: signed,
                       status: LastTransactionsItem(status: 1, originalTransactionId: original, signedTransactionInfo: signed.last,
                                                    signedRenewalInfo: renewal))
    }
}
