import AppStoreVerification
import FleetTestSupport
import Foundation
import FleetTestPKI
import Testing

/// `fleet verify` end to end through the built executable.
@Suite(.serialized) struct FleetVerifyEndToEnd {
    let pki: TestPKI
    let dir: URL
    let t0: Int64 = 1_748_736_000_000

    init() throws {
        pki = try TestPKI()
        dir = try TemporaryFiles.directory("fleet-verify")
        try Data(pki.rootDER).write(to: dir.appendingPathComponent("root.der"))
        try Data(pki.rootPEM.utf8).write(to: dir.appendingPathComponent("root.pem"))
    }

    func path(_ name: String) -> String { dir.appendingPathComponent(name).path }

    @Test func mixedInputsGiveOneVerdictPerLineInOrder() throws {
        let tx = TestPayloads.transaction(transactionId: "1000000000000001", purchaseDate: t0 - 1000, signedDate: t0)
        let renewal = TestPayloads.renewalInfo(originalTransactionId: "1000000000000001", signedDate: t0)
        let note = pki.signNotification(type: .didRenew, transaction: tx, renewal: renewal, signedDate: t0)
        let forged = try TestPKI.forged().sign(tx)
        let lines = [
            pki.sign(tx),
            JSONValue.object(["signedPayload": .string(note)]).serialized(),
            "this is not a JWS",
            "",
            "MIIT" + Base64.encodeStandard([UInt8](repeating: 7, count: 300)),
            forged,
            pki.sign(TestPayloads.transaction(purchaseDate: t0, bundleId: "com.other", signedDate: t0)),
            pki.sign(TestPayloads.appTransaction(receiptCreationDate: t0)),
        ]
        try Data((lines.joined(separator: "\n") + "\n").utf8).write(to: dir.appendingPathComponent("in.txt"))
        let r = try FleetBinary.run([
            "verify", "--root-certificate", path("root.der"), "--bundle-id", TestPayloads.bundleId,
            "--environment", "Sandbox", path("in.txt"),
        ])
        #expect(r.status == 0, "stderr: \(r.stderr)")
        let out = r.lines
        #expect(out.count == 7)
        guard out.count == 7 else { return }
        #expect(out[0]["verdict"] == "verified")
        #expect(out[0]["kind"] == "transaction")
        #expect(out[0]["payload"]?["transactionId"] == "1000000000000001")
        #expect(out[1]["verdict"] == "verified")
        #expect(out[1]["kind"] == "notification")
        #expect(out[1]["payload"]?["data"]?["signedTransactionInfo"]?["transactionId"] == "1000000000000001")
        #expect(out[1]["payload"]?["data"]?["signedRenewalInfo"]?["originalTransactionId"] == "1000000000000001")
        #expect(out[2]["verdict"] == "rejected")
        #expect(out[2]["reason"] == "MALFORMED_JWS")
        #expect(out[2]["detail"]?.stringValue?.isEmpty == false)
        #expect(out[3]["reason"] == "MALFORMED_RECEIPT")
        #expect(out[4]["reason"] == "UNTRUSTED_CHAIN")
        #expect(out[5]["reason"] == "WRONG_BUNDLE_ID")
        #expect(out[6]["kind"] == "appTransaction")
    }

    @Test func legacyReceiptsVerifyWithTheirPayload() throws {
        let receiptPKI = try TestReceiptPKI()
        try Data(receiptPKI.rootDER).write(to: dir.appendingPathComponent("receipt-root.der"))
        let receipt = TestReceipt(
            receiptType: "ProductionSandbox", applicationVersion: "1.9", creationDate: t0,
            inApp: [TestReceipt.InApp(productId: "com.example.coins", transactionId: "1000000000000777", purchaseDate: t0 - 5000, quantity: 3)])
        let b64 = try receiptPKI.signBase64(receipt)
        let lines = [b64, JSONValue.object(["receipt-data": .string(b64), "password": "pw"]).serialized(), pki.sign(TestPayloads.transaction(purchaseDate: t0, signedDate: t0))]
        try Data((lines.joined(separator: "\n") + "\n").utf8).write(to: dir.appendingPathComponent("receipts.txt"))
        let r = try FleetBinary.run([
            "verify", "--root-certificate", path("receipt-root.der"), "--root-certificate", path("root.der"),
            "--bundle-id", TestPayloads.bundleId, "--environment", "Sandbox", path("receipts.txt"),
        ])
        #expect(r.status == 0, "stderr: \(r.stderr)")
        let out = r.lines
        #expect(out.count == 3)
        guard out.count == 3 else { return }
        for o in out[0..<2] {
            #expect(o["verdict"] == "verified")
            #expect(o["kind"] == "appReceipt")
            #expect(o["payload"]?["environment"] == "Sandbox")
            #expect(o["payload"]?["applicationVersion"] == "1.9")
            #expect(o["payload"]?["receiptCreationDate"]?.int64Value == t0)
            let entry = o["payload"]?["inApp"]?.arrayValue?.first
            #expect(entry?["transactionId"] == "1000000000000777")
            #expect(entry?["quantity"]?.int64Value == 3)
            #expect(entry?["productType"]?.int64Value == 1)
            #expect(entry?["purchaseDate"]?.int64Value == t0 - 5000)
        }
        #expect(out[2]["kind"] == "transaction")
        #expect(!r.stdout.contains("pw\""), "the verifyReceipt password is never echoed")
    }

    @Test func readsStdinAndPEMRoots() throws {
        let jws = pki.sign(TestPayloads.transaction(purchaseDate: t0, signedDate: t0))
        let r = try FleetBinary.run(
            ["verify", "--root-certificate", path("root.pem"), "--bundle-id", TestPayloads.bundleId, "--environment", "Sandbox", "-"],
            stdin: jws + "\n" + jws + "\n")
        #expect(r.status == 0, "stderr: \(r.stderr)")
        #expect(r.lines.map { $0["verdict"] } == ["verified", "verified"])
    }

    @Test func productionWithoutAppAppleIdIsAUsageError() throws {
        let r = try FleetBinary.run([
            "verify", "--root-certificate", path("root.der"), "--bundle-id", "x", "--environment", "Production",
        ], stdin: "")
        #expect(r.status == 2)
        #expect(r.stderr.contains("appAppleId") || r.stderr.contains("app-apple-id"))
        #expect(r.stdout.isEmpty)
    }

    @Test func unreadableRootIsAUsageError() throws {
        let r = try FleetBinary.run([
            "verify", "--root-certificate", path("missing.der"), "--bundle-id", "x", "--environment", "Sandbox",
        ], stdin: "")
        #expect(r.status == 2)
        #expect(r.stderr.contains("missing.der"))
        let garbage = path("garbage.der")
        try Data("not a certificate".utf8).write(to: URL(fileURLWithPath: garbage))
        let r2 = try FleetBinary.run([
            "verify", "--root-certificate", garbage, "--bundle-id", "x", "--environment", "Sandbox",
        ], stdin: "")
        #expect(r2.status == 2)
    }

    @Test func missingArgumentsAreAUsageError() throws {
        let r = try FleetBinary.run(["verify", "--environment", "Sandbox"], stdin: "")
        #expect(r.status == 2)
        #expect(r.stderr.contains("--bundle-id"))
        let r2 = try FleetBinary.run(["verify", "--root-certificate", path("root.der"), "--bundle-id", "x", "--environment", "Staging"], stdin: "")
        #expect(r2.status == 2)
    }
}
