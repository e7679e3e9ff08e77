import EntitlementDomain
import FleetDevStack
import FleetKafka
import FleetTestSupport
import Foundation
import PostgresNIO
import Synchronization
import Testing

@testable import FleetSink

/// The built `fleet` executable next to the test bundle (`make test` builds it first with `swift build --build-tests`).
/// Per subscriber, events in signing order on one key (one partition): the final state does not depend on batching.
func orderedStream(subscribers: Int) -> [EntitlementEvent] {
    var out: [EntitlementEvent] = []
    for s in 0..<subscribers {
        let otx = "k-otx-\(s)"
        let t0 = baseTime + Int64(s) * 10
        out.append(makeEvent("k\(s)-buy", kind: "SUBSCRIPTION_STARTED", effect: .grant, signed: t0, subject: otx,
            transactionId: otx, originalTransactionId: otx, validFrom: t0, validUntil: t0 + 30 * day,
            notificationType: "SUBSCRIBED", subtype: "INITIAL_BUY"))
        out.append(makeEvent("k\(s)-renew", kind: "SUBSCRIPTION_RENEWED", effect: .extend, signed: t0 + 30 * day,
            subject: otx, transactionId: "\(otx)-r", originalTransactionId: otx, validUntil: t0 + 60 * day,
            notificationType: "DID_RENEW"))
        if s % 2 == 0 {
            out.append(makeEvent("k\(s)-refund", kind: "REFUNDED", effect: .revoke, signed: t0 + 31 * day, subject: otx,
                transactionId: "\(otx)-r", originalTransactionId: otx, validUntil: t0 + 60 * day,
                revocationDate: t0 + 31 * day, notificationType: "REFUND"))
        }
        out.append(makeEvent("k\(s)-gems", kind: "ONE_TIME_PURCHASED", effect: .grant, signed: t0 + 32 * day,
            subject: otx, product: "gems", productType: "Consumable", entitlement: nil, transactionId: "\(otx)-g",
            originalTransactionId: otx, units: 50, notificationType: "ONE_TIME_CHARGE"))
    }
    return out
}

/// Table contents without the one wall-clock column (notifications.applied_at), rows in byte order whatever the
/// database's collation.
func stateDump(_ c: PostgresConnection) async throws -> [String: String] {
    var result: [String: String] = [:]
    for table in dumpedTables where table != "schema_migrations" {
        let rows = try await c.query(PostgresQuery(unsafeSQL: """
            SELECT coalesce(string_agg(r, E'\\n' ORDER BY r COLLATE "C"), '') FROM (SELECT (to_jsonb(t) - 'applied_at')::text AS r FROM \(table) t) s
            """), logger: testLogger)
        for try await text in rows.decode(String.self) { result[table] = text }
    }
    return result
}

func produce(_ events: [EntitlementEvent], to topic: String, bootstrap: String) async throws {
    let producer = try KafkaProducer(configuration: KafkaConfiguration(bootstrapServers: bootstrap, clientId: "test"))
    for e in events {
        _ = try await producer.send(OutgoingMessage(
            topic: topic, key: Array((e.originalTransactionId ?? e.eventId).utf8), value: encode(e),
            headers: [KafkaHeader(key: "event-kind", string: e.kind), KafkaHeader(key: "event-id", string: e.eventId)]))
    }
    producer.close(timeout: .seconds(5))
}

func startSink(bootstrap: String, topic: String, rejected: String, url: String, writers: Int = 1) throws -> Process {
    let process = Process()
    process.executableURL = try FleetBinary.require()
    process.arguments = [
        "sink", "--bootstrap-servers", bootstrap, "--group", "sink-kill-test", "--result-topic", topic,
        "--rejected-topic", rejected, "--database-url", url, "--max-batch-size", "40", "--writers", String(writers),
    ]
    var environment = ProcessInfo.processInfo.environment
    environment["FLEET_LOG_LEVEL"] = "warning"
    process.environment = environment
    process.standardOutput = FileHandle.nullDevice
    process.standardError = FileHandle.standardError
    try process.run()
    return process
}

@Suite("fleet sink end to end: Kafka (embedded) -> PostgreSQL", .serialized)
struct KafkaSinkTests {
    /// With one writer, and with two (two group members in one process, each its own database connection).
    @Test("SIGKILL mid-batch, restart: no event missing, none applied twice", arguments: [1, 2])
    func killAndRestart(writers: Int) async throws {
        let url = try await TestPostgres.shared.freshDatabase()
        let reference = try await TestPostgres.shared.freshDatabase()
        let cluster = try EmbeddedKafkaCluster(brokers: 1)
        defer { cluster.shutdown() }
        try cluster.createTopic("results", partitions: 3)
        try cluster.createTopic("sink-rejected", partitions: 1)
        let stream = orderedStream(subscribers: 400)
        var input = stream
        // Two redeliveries inside the stream and one undecodable record.
        input.insert(stream[5], at: 300)
        input.insert(stream[700], at: 900)
        try await produce(input, to: "results", bootstrap: cluster.bootstrapServers)
        let producer = try KafkaProducer(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers))
        _ = try await producer.send(OutgoingMessage(topic: "results", key: nil, value: Array("garbage".utf8)))
        producer.close(timeout: .seconds(5))

        func count() async throws -> Int64 {
            try await withConnection(url) { try await scalar($0, "SELECT count(*) FROM entitlement_events", as: Int64.self) }
        }
        let first = try startSink(
            bootstrap: cluster.bootstrapServers, topic: "results", rejected: "sink-rejected", url: url, writers: writers)
        try await waitUntil(timeout: .seconds(180)) { try await count() >= 300 }
        kill(first.processIdentifier, SIGKILL)
        first.waitUntilExit()
        #expect(first.terminationReason == .uncaughtSignal)
        let atKill = try await count()
        #expect(atKill < Int64(stream.count), "the sink finished before it could be killed; the test proves nothing")

        let second = try startSink(
            bootstrap: cluster.bootstrapServers, topic: "results", rejected: "sink-rejected", url: url, writers: writers)
        defer { if second.isRunning { kill(second.processIdentifier, SIGKILL) } }
        try await waitUntil(timeout: .seconds(180)) { try await count() == Int64(stream.count) }
        // SIGTERM: graceful stop with exit status 0.
        kill(second.processIdentifier, SIGTERM)
        second.waitUntilExit()
        #expect(second.terminationReason == .exit && second.terminationStatus == 0)

        // The same stream applied directly in one go gives the same state: nothing missing, nothing applied twice.
        try await withConnection(reference) { c in _ = try await EventApplier().apply(stream, connection: c, logger: testLogger) }
        let got = try await withConnection(url) { try await stateDump($0) }
        let want = try await withConnection(reference) { try await stateDump($0) }
        for table in want.keys.sorted() { #expect(got[table] == want[table], "\(table) differs after kill + restart") }
        try await onDatabase(url) { (c: PostgresConnection) async throws in
            #expect(try await scalar(c, "SELECT count(*) FROM consumable_ledger WHERE entry = 'credit'", as: Int64.self) == 400)
            #expect(try await scalar(c, "SELECT count(*) FROM entitlements WHERE active", as: Int64.self) == 200)
        }
        // The undecodable record went to the sink-rejected topic with its reason and coordinates.
        let consumer = try KafkaConsumer(
            configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers), groupId: "check", topics: ["sink-rejected"])
        var rejected: [KafkaMessage] = []
        let deadline = ContinuousClock.now + .seconds(30)
        while rejected.isEmpty && ContinuousClock.now < deadline {
            rejected += try await consumer.nextBatch(maxMessages: 10, timeout: .milliseconds(500))
        }
        await consumer.close(deadline: .seconds(5))
        #expect(rejected.count >= 1)
        if let r = rejected.first {
            #expect(r.value == Array("garbage".utf8))
            #expect(r.header("reason").map { String(decoding: $0, as: UTF8.self) } == "undecodable")
            #expect(r.header("source-topic").map { String(decoding: $0, as: UTF8.self) } == "results")
            #expect(r.header("source-offset") != nil && r.header("source-partition") != nil && r.header("detail") != nil)
        }
    }
}
