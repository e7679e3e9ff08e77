import AppStoreVerification
import EntitlementDomain
import FleetDevStack
import FleetKafka
import FleetTestPKI
import FleetTestSupport
import Foundation
import PostgresNIO
import Testing

@testable import FleetSink

/// Replay protection across input forms: `fleet worker` -> Kafka (embedded) -> `fleet sink` -> PostgreSQL.
@Suite("receipts end to end: worker + sink, replay protection", .serialized)
struct ReceiptPipelineTests {
    @Test("a consumable receipt three times plus a JWS of the same purchase credit the ledger once")
    func receiptAndJWSCreditOnce() async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        let cluster = try EmbeddedKafkaCluster(brokers: 1)
        defer { cluster.shutdown() }
        for t in ["raw", "results", "rejected", "sink-rejected"] { try cluster.createTopic(t, partitions: 1) }

        let jwsPKI = try TestPKI()
        let receiptPKI = try TestReceiptPKI()
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("receipt-e2e-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let jwsRoot = dir.appendingPathComponent("jws-root.der")
        let receiptRoot = dir.appendingPathComponent("receipt-root.der")
        try Data(TestPKI.der(jwsPKI.root)).write(to: jwsRoot)
        try Data(receiptPKI.rootDER).write(to: receiptRoot)

        let t0 = Int64(Date().timeIntervalSince1970 * 1000) - 3_600_000
        let txId = "3000000000000042"
        let receipt = TestReceipt(
            receiptType: "ProductionSandbox", creationDate: t0,
            inApp: [TestReceipt.InApp(productId: "com.example.coins", transactionId: txId, purchaseDate: t0 - 60_000, quantity: 2, productType: 1)])
        let receiptText = try receiptPKI.signBase64(receipt)
        let jws = jwsPKI.sign(TestPayloads.transaction(
            productId: "com.example.coins", transactionId: txId, purchaseDate: t0 - 60_000, type: .consumable,
            environment: .sandbox, signedDate: t0 + 5_000, quantity: 2))
        let body = JSONValue.object(["receipt-data": .string(receiptText), "password": "shared-secret"]).serialized()

        let producer = try KafkaProducer(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers))
        for value in [receiptText, body, receiptText, jws] {
            _ = try await producer.send(OutgoingMessage(topic: "raw", key: nil, value: Array(value.utf8)))
        }
        producer.close(timeout: .seconds(5))

        let worker = Process()
        worker.executableURL = try FleetBinary.require()
        worker.arguments = [
            "worker", "--bootstrap-servers", cluster.bootstrapServers, "--group", "receipt-e2e", "--input-topic", "raw",
            "--result-topic", "results", "--rejected-topic", "rejected", "--root-certificate", jwsRoot.path,
            "--root-certificate", receiptRoot.path, "--bundle-id", TestPayloads.bundleId, "--environment", "Sandbox",
            "--metrics-port", "0", "--log-level", "warning", "--log-format", "text",
        ]
        worker.standardOutput = FileHandle.nullDevice
        worker.standardError = FileHandle.standardError
        try worker.run()
        defer { if worker.isRunning { kill(worker.processIdentifier, SIGTERM); worker.waitUntilExit() } }
        let sink = try startSink(bootstrap: cluster.bootstrapServers, topic: "results", rejected: "sink-rejected", url: url)
        defer { if sink.isRunning { kill(sink.processIdentifier, SIGTERM); sink.waitUntilExit() } }

        // The receipt's event (the same eventId three times) and the JWS's event: two distinct events.
        try await waitUntil(timeout: .seconds(180)) {
            try await withConnection(url) {
                try await scalar($0, "SELECT count(*) FROM entitlement_events", as: Int64.self) >= 2
            }
        }
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            #expect(try await scalar(c, "SELECT count(*) FROM entitlement_events", as: Int64.self) == 2)
            #expect(try await scalar(c, "SELECT count(*) FROM consumable_ledger WHERE entry = 'credit'", as: Int64.self) == 1)
            #expect(try await scalar(
                c, "SELECT count(*) FROM consumable_ledger WHERE entry = 'credit' AND transaction_id = '\(txId)' AND environment = 'Sandbox'",
                as: Int64.self) == 1)
        }
    }
}
