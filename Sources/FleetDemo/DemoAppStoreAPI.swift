import Crypto
import FleetDevStack
import Foundation

/// The App Store Server API that `fleet responder` answers in the demo and the chaos soak: a strict local stand-in
/// (`AppleAPIStandIn`, hosted in this process) and a fresh in-app purchase key whose public half the stand-in checks
/// every request's token against, written where the responder reads it.
struct DemoAppStoreAPI {
    let standIn: AppleAPIStandIn
    /// `fleet responder`'s API flags: base URL, key id, issuer id, key file, bundle id, environment.
    let responderArguments: [String]

    static func start(directory: String, bundleId: String, environment: String) async throws -> DemoAppStoreAPI {
        let key = P256.Signing.PrivateKey()
        let keyPath = directory + "/appstore-api-key.p8"
        guard FileManager.default.createFile(atPath: keyPath, contents: Data(key.pemRepresentation.utf8),
                                             attributes: [.posixPermissions: 0o600]) else {
            throw DemoError("cannot write \(keyPath)")
        }
        let expectation = AppleAPIStandIn.Expectation(
            keyId: "DEMOKEY001", issuerId: UUID().uuidString.lowercased(), bundleId: bundleId, publicKey: key.publicKey)
        let standIn = try await AppleAPIStandIn.start(expecting: expectation)
        return DemoAppStoreAPI(standIn: standIn, responderArguments: [
            "--api-base-url", standIn.baseURL, "--api-key-id", expectation.keyId, "--api-issuer-id", expectation.issuerId,
            "--api-private-key", keyPath, "--bundle-id", bundleId, "--environment", environment,
        ])
    }

    /// The App Store knows the purchases the apps made: it answers about them (and refuses unknown ids with 404).
    func know(_ traffic: DemoTraffic) {
        for (original, group) in Dictionary(grouping: traffic.storedTransactions, by: \.originalTransactionId) {
            standIn.addHistory(originalTransactionId: original, transactionIds: group.map(\.transactionId),
                               signedTransactions: group.map(\.signedTransaction))
        }
    }
}
