import AppStoreVerification
import Foundation
import Testing

/// The five real Apple-signed JWS in ../shared/fixtures/apple-real (not part of the repository).
enum AppleReal {
    static let directory: URL = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("../shared/fixtures/apple-real").standardizedFileURL
    static var available: Bool {
        FileManager.default.fileExists(atPath: directory.appendingPathComponent("AppleRootCA-G3.cer").path)
    }
    static let bundleId = "com.loki-project.loki-messenger"

    static func jws(_ name: String) throws -> String {
        let s = try String(contentsOf: directory.appendingPathComponent(name), encoding: .utf8)
        return s.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    static func verifier(environments: Set<AppStoreVerification.Environment>, appAppleId: Int64? = nil, bundleId: String = bundleId) throws -> SignedDataVerifier {
        let root = try Data(contentsOf: directory.appendingPathComponent("AppleRootCA-G3.cer"))
        let policy = try VerificationPolicy(
            rootDERs: [Array(root)], bundleId: bundleId, appAppleId: appAppleId, environments: environments)
        return SignedDataVerifier(policy: policy)
    }
}

@Suite(.enabled(if: AppleReal.available, "../shared/fixtures/apple-real is absent"))
struct AppleRealFixtures {
    @Test(arguments: [("1.jws", "renewalInfo"), ("2.jws", "notification"), ("3.jws", "notification"), ("4.jws", "transaction"), ("5.jws", "renewalInfo")])
    func verifiesUnderSandbox(_ file: String, _ kind: String) throws {
        let v = try AppleReal.verifier(environments: [.sandbox])
        let item = try v.verify(try AppleReal.jws(file))
        #expect(item.kind == kind)
        #expect(item.environment == .sandbox)
    }

    @Test func notificationContentsAreDecoded() throws {
        let v = try AppleReal.verifier(environments: [.sandbox], appAppleId: 1_470_168_868)
        let n = try v.verifyNotification(try AppleReal.jws("3.jws"))
        #expect(n.payload.notificationType == .didRenew)
        #expect(n.payload.appAppleId == 1_470_168_868)
        #expect(n.transaction?.transactionId == "2000001024998954")
        #expect(n.transaction?.type == .autoRenewable)
        #expect(n.renewalInfo != nil)
        let t = try v.verifyTransaction(try AppleReal.jws("4.jws"))
        #expect(t.payload == n.transaction)
        let test = try v.verifyNotification(try AppleReal.jws("2.jws"))
        #expect(test.payload.notificationType == .test)
    }

    @Test(arguments: ["1.jws", "2.jws", "3.jws", "4.jws", "5.jws"])
    func aFlippedByteFails(_ file: String) throws {
        let v = try AppleReal.verifier(environments: [.sandbox])
        let jws = try AppleReal.jws(file)
        for segment in 0..<3 {
            let flipped = flipCharacter(jws, segment: segment)
            #expect(throws: VerificationError.self, "segment \(segment)") { try v.verify(flipped) }
        }
    }

    @Test(arguments: ["2.jws", "3.jws"])
    func failsUnderProduction(_ file: String) throws {
        let v = try AppleReal.verifier(environments: [.production], appAppleId: 1_470_168_868)
        expectRejected(.wrongEnvironment) { () throws(VerificationError) in _ = try v.verify(try! AppleReal.jws(file)) }
    }

    @Test func failsWithAnotherBundleId() throws {
        let v = try AppleReal.verifier(environments: [.sandbox], bundleId: "com.example.other")
        expectRejected(.wrongBundleId) { () throws(VerificationError) in _ = try v.verify(try! AppleReal.jws("3.jws")) }
        expectRejected(.wrongBundleId) { () throws(VerificationError) in _ = try v.verify(try! AppleReal.jws("4.jws")) }
    }

    @Test func leafExpiredAtNow() throws {
        // 1.jws's leaf expired 2023-09-24: valid at its signedDate, not now.
        let root = try Data(contentsOf: AppleReal.directory.appendingPathComponent("AppleRootCA-G3.cer"))
        let policy = try VerificationPolicy(
            rootDERs: [Array(root)], bundleId: AppleReal.bundleId, environments: [.sandbox], validationTime: .now)
        let v = SignedDataVerifier(policy: policy)
        expectRejected(.certificateNotValidAtTime) { () throws(VerificationError) in _ = try v.verify(try! AppleReal.jws("1.jws")) }
    }

    @Test func wwdrIsNotATrustAnchorByItself() throws {
        // Trusting only the intermediate must not work: the chain is anchored at a configured root.
        let wwdr = try Data(contentsOf: AppleReal.directory.appendingPathComponent("AppleWWDRCAG6.cer"))
        let policy = try VerificationPolicy(rootDERs: [Array(wwdr)], bundleId: AppleReal.bundleId, environments: [.sandbox])
        let v = SignedDataVerifier(policy: policy)
        expectRejected(.untrustedChain) { () throws(VerificationError) in _ = try v.verify(try! AppleReal.jws("4.jws")) }
    }
}
