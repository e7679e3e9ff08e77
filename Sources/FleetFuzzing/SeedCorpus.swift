import AppStoreVerification
import EntitlementDomain
import FleetTestPKI
import Foundation

/// The seed corpora of the fuzz targets: valid and invalid inputs made with the test PKI the way the tests make
/// theirs (never copies of the user's fixtures). Generated once and kept in Fuzz/corpus (small: a few KiB each),
/// with the roots they chain to in FuzzRoots+Generated.swift.
public enum SeedCorpus {
    public struct Seed: Sendable {
        public var target: FuzzTarget
        public var name: String
        public var bytes: [UInt8]
    }

    /// `make fuzz-seeds`: replaces Fuzz/corpus and FuzzRoots+Generated.swift under `repository` (then rebuild).
    public static func write(toRepository repository: URL) throws -> Int {
        let (source, seeds) = try generate()
        let corpus = repository.appendingPathComponent("Fuzz/corpus")
        try? FileManager.default.removeItem(at: corpus)
        for seed in seeds {
            let dir = corpus.appendingPathComponent(seed.target.rawValue)
            try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
            try Data(seed.bytes).write(to: dir.appendingPathComponent(seed.name))
        }
        try source.write(
            to: repository.appendingPathComponent("Sources/FleetFuzzing/FuzzRoots+Generated.swift"), atomically: true,
            encoding: .utf8)
        return seeds.count
    }

    /// New roots and the seeds signed under them.
    public static func generate() throws -> (rootsSource: String, seeds: [Seed]) {
        let pki = try TestPKI()
        let receiptPKI = try TestReceiptPKI()
        let t0 = FuzzRoots.signedDate
        var seeds: [Seed] = []
        func add(_ target: FuzzTarget, _ name: String, _ text: String) { seeds.append(Seed(target: target, name: name, bytes: Array(text.utf8))) }
        func add(_ target: FuzzTarget, _ name: String, _ bytes: [UInt8]) { seeds.append(Seed(target: target, name: name, bytes: bytes)) }

        // jws: every input form, valid ...
        let tx = TestPayloads.transaction(
            transactionId: "2000000000000001", purchaseDate: t0 - 3_600_000, expiresDate: t0 + 2_592_000_000, signedDate: t0)
        let txJWS = pki.sign(tx)
        add(.jws, "valid-transaction", txJWS)
        add(.jws, "valid-transaction-production", pki.sign(TestPayloads.transaction(
            productId: "com.example.fleet.tickets.10", transactionId: "2000000000000002", purchaseDate: t0 - 60_000,
            type: .consumable, environment: .production, signedDate: t0)))
        add(.jws, "valid-renewal-info", pki.sign(TestPayloads.renewalInfo(originalTransactionId: "2000000000000001", signedDate: t0)))
        add(.jws, "valid-app-transaction", pki.sign(TestPayloads.appTransaction(receiptCreationDate: t0, appTransactionId: "704289123456")))
        let notification = pki.signNotification(
            type: .didRenew, transaction: tx,
            renewal: TestPayloads.renewalInfo(originalTransactionId: "2000000000000001", signedDate: t0),
            signedDate: t0, notificationUUID: "0b8e1f0c-1111-4222-8333-444455556666")
        add(.jws, "valid-notification", notification)
        add(.jws, "valid-apple-body", "{\"signedPayload\":\"\(notification)\"}")
        add(.jws, "valid-summary", pki.sign(TestPayloads.summaryNotification(signedDate: t0)))
        let receipt = TestReceipt(creationDate: t0, inApp: [
            .init(productId: "com.example.fleet.tickets.10", transactionId: "1000000000000001", purchaseDate: t0 - 60_000),
            .init(productId: "com.example.fleet.premium.monthly", transactionId: "1000000000000002", purchaseDate: t0 - 120_000,
                  productType: 3, expiresDate: t0 + 2_592_000_000, webOrderLineItemId: 500000000000001),
        ])
        let receiptB64 = try receiptPKI.signBase64(receipt)
        add(.jws, "valid-receipt-line", receiptB64)
        add(.jws, "valid-receipt-body", "{\"receipt-data\":\"\(receiptB64)\",\"password\":\"x\",\"exclude-old-transactions\":true}")
        // ... and each kind of rejection.
        add(.jws, "alg-none", pki.sign(tx, header: .init(alg: "none")))
        add(.jws, "der-signature", pki.sign(tx, header: .init(derSignature: true)))
        add(.jws, "two-certificates", pki.sign(tx, header: .init(x5c: Array(pki.x5c.prefix(2)))))
        add(.jws, "crit-header", pki.sign(tx, header: .init(extra: ["crit": .array([.string("exp")])])))
        add(.jws, "wrong-bundle", pki.sign(TestPayloads.transaction(transactionId: "2000000000000003", purchaseDate: t0, bundleId: "com.other", signedDate: t0)))
        add(.jws, "xcode", pki.sign(TestPayloads.transaction(transactionId: "2000000000000004", purchaseDate: t0, environment: .xcode, signedDate: t0)))
        add(.jws, "forged-chain", try TestPKI.forged().sign(tx))
        var parts = txJWS.split(separator: ".").map(String.init)
        parts[1] = Base64.encodeURL(Array(tx.serialized().replacingOccurrences(of: "2000000000000001", with: "2000000000000009").utf8))
        add(.jws, "tampered-payload", parts.joined(separator: "."))
        add(.jws, "storekit1-transaction-receipt", Base64.encodeStandard(Array("{\n\t\"signature\" = \"AAAA\";\n\t\"purchase-info\" = \"BBBB\";\n}".utf8)))
        add(.jws, "not-json-body", "{\"signedPayload\":")

        // receipt: DER, the digests and signed attributes Apple uses, Production, Xcode, truncated.
        add(.receipt, "sha256", try receiptPKI.sign(receipt))
        add(.receipt, "sha1", try receiptPKI.sign(receipt, digest: .sha1))
        add(.receipt, "signed-attributes", try receiptPKI.sign(receipt, signedAttributes: true))
        var production = receipt
        production.receiptType = "Production"
        production.appAppleId = FuzzRoots.appAppleId
        add(.receipt, "production", try receiptPKI.sign(production))
        var xcode = receipt
        xcode.receiptType = "Xcode"
        add(.receipt, "xcode", try receiptPKI.sign(xcode))
        let full = try receiptPKI.sign(receipt)
        add(.receipt, "truncated", Array(full.prefix(full.count / 2)))

        // event: what the workers write for the valid seeds, and what the sink refuses.
        let policy = try VerificationPolicy(
            roots: [try TrustedRoot(der: pki.rootDER), try TrustedRoot(der: receiptPKI.rootDER)], bundleId: FuzzRoots.bundleId,
            appAppleId: FuzzRoots.appAppleId, environments: [.sandbox, .production])
        let verifier = SignedDataVerifier(policy: policy, chainCache: nil, now: { FuzzRoots.now })
        var eventJSON: [UInt8] = []
        for seed in seeds where seed.target == .jws && seed.name.hasPrefix("valid-") {
            let item = try verifier.verify(seed.bytes)
            let events = try EntitlementMapper().events(
                for: item, source: EventSource(topic: FleetTopics.raw, partition: 3, offset: 41, kind: item.itemKind),
                verifiedAt: FuzzRoots.now)
            for (i, e) in events.enumerated() {
                eventJSON = e.jsonBytes()
                add(.event, "\(seed.name)-\(i)", eventJSON)
            }
        }
        let eventText = String(decoding: eventJSON, as: UTF8.self)
        add(.event, "unsupported-schema", eventText.replacingOccurrences(of: "entitlement-event/v1", with: "entitlement-event/v2"))
        add(.event, "empty-event-id", eventText.replacingOccurrences(of: #""eventId":""#, with: #""eventId":"","x":""#))
        add(.event, "not-json", "{\"schema\":\"entitlement-event/v1\",")

        // catalogue: both layouts, YAML and JSON.
        add(.catalogue, "map", """
            products:
              com.example.fleet.premium.monthly: { type: auto-renewable, entitlement: premium }
              com.example.fleet.tickets.10: { type: consumable, units: 10, entitlement: tickets }
              com.example.fleet.pass.30d: { type: non-renewing, duration: P30D, entitlement: premium }
              com.example.fleet.lifetime: { type: Non-Consumable }
            """)
        add(.catalogue, "list-json", #"{"products":[{"productId":"a","type":"consumable","units":5},{"product-id":"b","type":"non-renewing","duration":"P1Y2M3W4DT5H6M7S"}]}"#)
        add(.catalogue, "bad-duration", "products:\n  p: {type: non-renewing, duration: P1X}\n")

        // config: the sections every service reads.
        add(.config, "full", """
            kafka:
              bootstrap-servers: kafka-0:9092,kafka-1:9092
              properties:
                security.protocol: SASL_SSL
                linger.ms: 5
            worker:
              input-topic: [appstore.raw, appstore.raw.replay]
              group: fleet-verifiers
              metrics-port: 9090
              threads: 4
              root-certificate: /etc/fleet/AppleRootCA-G3.cer
              bundle-id: com.example.app
              environment: Production, Sandbox
              app-apple-id: 1234567890
              require-known-products: yes
              validation-time: signed-date
            sink:
              max-batch-size: 2000
              writers: 2
            """)
        add(.config, "bad-values", "worker:\n  metrics-port: ninety\n  threads: 1e3\n  require-known-products: maybe\n  app-apple-id: x\n")

        // ingest: the bodies of both endpoints.
        add(.ingest, "notification", "{\"signedPayload\":\"\(notification)\",\"newAppleKey\":[1,{}]}")
        add(.ingest, "transaction", "{\"signedTransaction\":\"\(txJWS)\",\"deviceVerificationId\":\"d0c1\",\"appAccountToken\":\"7c3e8d7a-0000-4000-8000-000000000001\"}")
        add(.ingest, "receipt", "{\"receipt-data\":\"MIIB\",\"password\":\"secret\"}")
        add(.ingest, "ambiguous", "{\"signedTransaction\":\"a.b.c\",\"receipt-data\":\"MIIB\"}")
        add(.ingest, "wrong-types", "{\"signedPayload\":1,\"signedTransaction\":[],\"appAccountToken\":false}")

        // base64: both alphabets, padding, a certificate.
        for (i, s) in ["", "QQ", "QUI", "QUJD", "QQ==", "QUI=", "-_8", "+/8=", "QR", pki.x5c[0], String(txJWS.split(separator: ".")[2])].enumerated() {
            add(.base64, "s\(i)", s)
        }

        let roots = [pki.rootDER, receiptPKI.rootDER].map { "        \"\(Base64.encodeStandard($0))\"," }.joined(separator: "\n")
        let source = """
            // Generated by `make fuzz-seeds` with Fuzz/corpus (do not edit): the test roots the seeds chain to (JWS, receipts).
            extension FuzzRoots {
                static let rootsBase64: [String] = [
            \(roots)
                ]
            }

            """
        return (source, seeds)
    }
}
