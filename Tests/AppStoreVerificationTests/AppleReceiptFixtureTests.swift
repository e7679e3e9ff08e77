import AppStoreVerification
import Foundation
import Testing

/// The real App Store receipts in ../shared/fixtures/apple-receipts (not part of the repository; see its README).
enum AppleReceipts {
    static let directory: URL = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("../shared/fixtures/apple-receipts").standardizedFileURL
    static var available: Bool {
        FileManager.default.fileExists(atPath: directory.appendingPathComponent("AppleIncRootCertificate.cer").path)
    }

    static func text(_ name: String) throws -> String {
        try String(contentsOf: directory.appendingPathComponent(name), encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }

    static func der(_ name: String) throws -> [UInt8] {
        try #require(Base64.decodeStandard(try text(name)))
    }

    static func verifier(
        bundleId: String, environments: Set<AppStoreVerification.Environment>, appAppleId: Int64? = nil,
        allowUnsigned: Bool = false, cache: ChainCache? = ChainCache(capacity: 16)
    ) throws -> SignedDataVerifier {
        let root = try Data(contentsOf: directory.appendingPathComponent("AppleIncRootCertificate.cer"))
        let policy = try VerificationPolicy(
            rootDERs: [Array(root)], bundleId: bundleId, appAppleId: appAppleId, environments: environments,
            allowUnsignedEnvironments: allowUnsigned)
        return SignedDataVerifier(policy: policy, chainCache: cache)
    }

    struct Case: Sendable, CustomStringConvertible {
        var file: String
        var bundleId: String
        var environment: AppStoreVerification.Environment
        var appAppleId: Int64?
        var created: String
        var inAppCount: Int
        var description: String { file }
    }

    static let good: [Case] = [
        Case(file: "production-subscriptions.b64", bundleId: "org.getpure.pure-iphone", environment: .production,
             appAppleId: 690_661_663, created: "2024-02-23T17:27:16Z", inAppCount: 4),
        Case(file: "sandbox-sha1-many.b64", bundleId: "com.nutcall.alert", environment: .sandbox, appAppleId: nil,
             created: "2020-05-06T18:28:49Z", inAppCount: 187),
        Case(file: "sandbox-consumable.b64", bundleId: "com.mbaasy.ios.demo", environment: .sandbox, appAppleId: nil,
             created: "2015-08-13T07:50:46Z", inAppCount: 7),
    ]

    static func verifier(for c: Case) throws -> SignedDataVerifier {
        try verifier(bundleId: c.bundleId, environments: [c.environment], appAppleId: c.appAppleId)
    }

    static func millis(_ iso: String) -> Int64 {
        Int64(ISO8601DateFormatter().date(from: iso)!.timeIntervalSince1970 * 1000)
    }
}

@Suite(.enabled(if: AppleReceipts.available, "../shared/fixtures/apple-receipts is absent"))
struct AppleReceiptFixtures {
    @Test(arguments: AppleReceipts.good)
    func verifiesUnderItsOwnPolicy(_ c: AppleReceipts.Case) throws {
        let v = try AppleReceipts.verifier(for: c)
        let item = try v.verify(try AppleReceipts.text(c.file))
        #expect(item.kind == "appReceipt")
        guard case .appReceipt(let r) = item else { Issue.record("not an appReceipt"); return }
        #expect(r.payload.bundleId == c.bundleId)
        #expect(r.environment == c.environment)
        #expect(r.payload.receiptCreationDate == AppleReceipts.millis(c.created))
        #expect(r.payload.inApp.count == c.inAppCount)
        // The same receipt in Apple's verifyReceipt request body, extra keys ignored.
        let body = JSONValue.object([
            "receipt-data": .string(try AppleReceipts.text(c.file)), "password": "secret", "exclude-old-transactions": .bool(true),
        ]).serialized()
        #expect(try v.verify(body) == item)
    }

    @Test func productionSubscriptionsEntries() throws {
        let c = AppleReceipts.good[0]
        guard case .appReceipt(let r) = try AppleReceipts.verifier(for: c).verify(try AppleReceipts.text(c.file)) else {
            Issue.record("not an appReceipt"); return
        }
        #expect(r.payload.appAppleId == 690_661_663)
        #expect(Set(r.payload.inApp.compactMap(\.originalTransactionId)) == ["340001196262039"])
        #expect(r.payload.inApp.allSatisfy { $0.productType == 3 && $0.expiresDate != nil })
        #expect(Set(r.payload.inApp.compactMap(\.transactionId)).count == 4)
    }

    @Test func sandboxConsumableEntries() throws {
        let c = AppleReceipts.good[2]
        guard case .appReceipt(let r) = try AppleReceipts.verifier(for: c).verify(try AppleReceipts.text(c.file)) else {
            Issue.record("not an appReceipt"); return
        }
        let consumable = try #require(r.payload.inApp.first { $0.productType == 1 })
        #expect(consumable.productId == "consumable")
        #expect(consumable.transactionId == "1000000166865231")
        #expect(consumable.quantity == 1)
        #expect(r.payload.inApp.filter { $0.productType == 3 }.count == 6)
        #expect(r.payload.inApp.filter { $0.productType == 3 }.allSatisfy { $0.productId == "monthly" && $0.expiresDate != nil })
        // The rendered payload uses JWS names; absent fields are omitted.
        let json = JSONValue.appReceiptJSON(r)
        #expect(json["environment"]?.stringValue == "Sandbox")
        #expect(json["inApp"]?.arrayValue?.count == 7)
        #expect(json["inApp"]?.arrayValue?.first { $0["productId"]?.stringValue == "consumable" }?["expiresDate"] == nil)
    }

    @Test func chainCacheIsUsedOnTheSecondReceipt() throws {
        let c = AppleReceipts.good[2]
        let cache = ChainCache(capacity: 4)
        let v = try AppleReceipts.verifier(bundleId: c.bundleId, environments: [.sandbox], cache: cache)
        let receipt = try AppleReceipts.text(c.file)
        _ = try v.verify(receipt)
        let misses = cache.misses
        _ = try v.verify(receipt)
        #expect(cache.misses == misses)
        #expect(cache.hits >= 1)
    }

    @Test func xcodeReceiptIsRejected() throws {
        let v = try AppleReceipts.verifier(bundleId: "net.zachariadis.cyclemaps", environments: [.sandbox])
        // Xcode StoreKit-testing receipts are BER (indefinite lengths), not DER, and signed by a local certificate.
        let e = expectRejected(.malformedReceipt) { () throws(VerificationError) in _ = try v.verify(try! AppleReceipts.text("xcode.b64")) }
        #expect(e?.detail.contains("BER") == true)
    }

    @Test func notAReceiptIsRejected() throws {
        let v = try AppleReceipts.verifier(bundleId: "x", environments: [.sandbox])
        expectRejected(.malformedJWS) { () throws(VerificationError) in _ = try v.verify(try! AppleReceipts.text("not-a-receipt.txt")) }
        let body = JSONValue.object(["receipt-data": .string(try AppleReceipts.text("not-a-receipt.txt"))]).serialized()
        expectRejected(.malformedReceipt) { () throws(VerificationError) in _ = try v.verify(body) }
    }

    @Test func flippedContentByteIsInvalidSignature() throws {
        let c = AppleReceipts.good[2]
        let v = try AppleReceipts.verifier(for: c)
        var der = try AppleReceipts.der(c.file)
        // A byte of the bundle id string inside the signed content ("com.mbaasy.ios.demo" -> "com.mbaasy.ios.deme").
        let needle = Array("ios.demo".utf8)
        let at = try #require((0..<(der.count - needle.count)).first { Array(der[$0..<($0 + needle.count)]) == needle })
        der[at + needle.count - 1] ^= 0x0A
        expectRejected(.invalidSignature) { () throws(VerificationError) in
            _ = try v.verify(Base64.encodeStandard(der))
        }
    }

    @Test func policyMismatchesGiveTheirCodes() throws {
        let prod = AppleReceipts.good[0]
        let text = try AppleReceipts.text(prod.file)
        let wrongBundle = try AppleReceipts.verifier(bundleId: "com.other", environments: [.production], appAppleId: 690_661_663)
        expectRejected(.wrongBundleId) { () throws(VerificationError) in _ = try wrongBundle.verify(text) }
        let sandboxOnly = try AppleReceipts.verifier(bundleId: prod.bundleId, environments: [.sandbox])
        expectRejected(.wrongEnvironment) { () throws(VerificationError) in _ = try sandboxOnly.verify(text) }
        let wrongApp = try AppleReceipts.verifier(bundleId: prod.bundleId, environments: [.production], appAppleId: 1)
        expectRejected(.wrongAppAppleId) { () throws(VerificationError) in _ = try wrongApp.verify(text) }
        let sandbox = AppleReceipts.good[2]
        let prodOnly = try AppleReceipts.verifier(bundleId: sandbox.bundleId, environments: [.production], appAppleId: 1)
        expectRejected(.wrongEnvironment) { () throws(VerificationError) in _ = try prodOnly.verify(try! AppleReceipts.text(sandbox.file)) }
    }

    @Test func validationAtNowIsOutsideTheExpiredChain() throws {
        let c = AppleReceipts.good[2]
        let root = try Data(contentsOf: AppleReceipts.directory.appendingPathComponent("AppleIncRootCertificate.cer"))
        let policy = try VerificationPolicy(
            rootDERs: [Array(root)], bundleId: c.bundleId, environments: [.sandbox], validationTime: .now)
        let v = SignedDataVerifier(policy: policy)
        expectRejected(.certificateNotValidAtTime) { () throws(VerificationError) in _ = try v.verify(try! AppleReceipts.text(c.file)) }
    }

    @Test func truncationsNeverCrash() throws {
        let c = AppleReceipts.good[2]
        let v = try AppleReceipts.verifier(for: c)
        let der = try AppleReceipts.der(c.file)
        var verdicts = Set<String>()
        for n in stride(from: 0, to: der.count, by: 7) {
            do {
                _ = try v.verify(Base64.encodeStandard(der[0..<n]))
                Issue.record("a truncation to \(n) bytes verified")
            } catch {
                verdicts.insert(error.reason.rawValue)
            }
        }
        #expect(verdicts.isSubset(of: ["MALFORMED_RECEIPT", "MALFORMED_JWS", "INVALID_SIGNATURE", "UNTRUSTED_CHAIN"]))
        #expect(verdicts.contains("MALFORMED_RECEIPT"))
    }

    @Test func randomMutationsNeverCrash() throws {
        let c = AppleReceipts.good[2]
        let v = try AppleReceipts.verifier(for: c)
        let der = try AppleReceipts.der(c.file)
        var rng = SplitMix(seed: 15)
        for _ in 0..<400 {
            var d = der
            for _ in 0..<(1 + Int(rng.next() % 4)) {
                d[Int(rng.next() % UInt64(d.count))] = UInt8(truncatingIfNeeded: rng.next())
            }
            if d == der { continue }
            do {
                _ = try v.verify(Base64.encodeStandard(d))
                // A mutation of an unsigned part (e.g. an unused certificate byte) may still verify: allowed only
                // when the signed content is untouched.
            } catch {
                #expect(!error.detail.isEmpty)
            }
        }
        for n in [1, 5, 100, 5000] {
            let garbage = (0..<n).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
            do { _ = try v.verify("MI" + Base64.encodeStandard(garbage)) } catch { #expect(!error.detail.isEmpty) }
            do { _ = try v.verify(Base64.encodeStandard([0x30, 0x82] + garbage)) } catch { #expect(!error.detail.isEmpty) }
        }
    }

    @Test func transactionReceiptHasItsOwnCode() throws {
        let v = try AppleReceipts.verifier(bundleId: "com.mbaasy.ios.demo", environments: [.sandbox])
        let e = expectRejected(.legacyTransactionReceiptUnsupported) { () throws(VerificationError) in
            _ = try v.verify(try! AppleReceipts.text("sk1-transaction-receipt.b64"))
        }
        #expect(e?.detail.contains("Apple iTunes Store Certification Authority") == true)
    }
}

/// openssl as an independent peer: its `cms -verify` verdict on every fixture must agree with ours.
@Suite(.enabled(if: AppleReceipts.available && OpenSSL.path != nil, "fixtures or openssl absent"))
struct OpenSSLPeerAgreement {
    @Test(arguments: ["production-subscriptions.b64", "sandbox-sha1-many.b64", "sandbox-consumable.b64", "xcode.b64", "not-a-receipt.txt"])
    func verdictsAgree(_ file: String) throws {
        let tmp = FileManager.default.temporaryDirectory.appendingPathComponent("receipt-peer-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: tmp, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: tmp) }
        let text = try AppleReceipts.text(file)
        let der = Base64.decodeStandard(text) ?? Array(text.utf8)
        try Data(der).write(to: tmp.appendingPathComponent("r.der"))
        try Data(contentsOf: AppleReceipts.directory.appendingPathComponent("AppleIncRootCertificate.cer"))
            .write(to: tmp.appendingPathComponent("root.cer"))
        // Ours, under the receipt's own bundle id and environment (policy checks are not openssl's business).
        let ours: Bool
        if let c = AppleReceipts.good.first(where: { $0.file == file }) {
            ours = (try? AppleReceipts.verifier(for: c).verify(text)) != nil
        } else {
            ours = (try? AppleReceipts.verifier(bundleId: "net.zachariadis.cyclemaps", environments: [.sandbox]).verify(text)) != nil
        }
        // openssl at the receipt creation date (our validation time).
        let at = AppleReceipts.good.first(where: { $0.file == file }).map { AppleReceipts.millis($0.created) / 1000 }
        _ = try OpenSSL.run(["x509", "-inform", "DER", "-in", "root.cer", "-out", "root.pem"], in: tmp)
        var args = ["cms", "-verify", "-inform", "DER", "-in", "r.der", "-CAfile", "root.pem", "-purpose", "any", "-out", "/dev/null"]
        if let at { args += ["-attime", String(at)] }
        let theirs = try OpenSSL.run(args, in: tmp) == 0
        #expect(ours == theirs, "ours: \(ours), openssl: \(theirs)")
    }
}

enum OpenSSL {
    static let path: String? = ["/usr/bin/openssl", "/usr/local/bin/openssl"].first { FileManager.default.isExecutableFile(atPath: $0) }

    static func run(_ args: [String], in dir: URL) throws -> Int32 {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: path!)
        p.arguments = args
        p.currentDirectoryURL = dir
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        try p.run()
        p.waitUntilExit()
        return p.terminationStatus
    }
}

struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

extension JSONValue {
    static func appReceiptJSON(_ r: VerifiedAppReceipt) -> JSONValue { VerifiedItem.appReceipt(r).renderedJSON }
}
