import AppStoreServerAPI
import Crypto
import EntitlementDomain
import FleetDevStack
import FleetKafka
import FleetResponder
import FleetSink
import FleetTestPKI
import FleetTestSupport
import Foundation
import Logging
import PostgresNIO
import Synchronization
import Testing

let logger: Logger = {
    var l = Logger(label: "fleet-responder-tests")
    l.logLevel = .warning
    return l
}()

struct MissingRow: Error { var uuid: String }

struct Harness {
    var server: AppleAPIStandIn
    var client: AppStoreServerAPIClient
    var history: StandInFixtures.History
    var url: String

    static func make(maxAttempts: Int = 4) async throws -> Harness {
        let key = P256.Signing.PrivateKey()
        let server = try await AppleAPIStandIn.start(expecting: .init(keyId: "K1", issuerId: "I1", bundleId: TestPayloads.bundleId, publicKey: key.publicKey))
        let h = StandInFixtures.subscriptionHistory(pki: try TestPKI(), count: 1)
        server.addHistory(originalTransactionId: h.originalTransactionId, transactionIds: h.transactionIds, signedTransactions: h.signedTransactions)
        let client = AppStoreServerAPIClient(
            credentials: APICredentials(keyId: "K1", issuerId: "I1", bundleId: TestPayloads.bundleId, privateKey: key),
            configuration: .init(baseURL: server.baseURL, retry: RetryPolicy(maxAttempts: maxAttempts, baseDelay: .milliseconds(10), maxDelay: .milliseconds(50))))
        return Harness(server: server, client: client, history: h, url: try await TestPostgres.shared.freshDatabase())
    }

    func claim(uuid: String = UUID().uuidString.lowercased(), requestedAt: Int64 = TestPayloads.nowMillis()) -> ConsumptionClaim {
        ConsumptionClaim(notificationUUID: uuid, environment: "Sandbox", transactionId: history.transactionIds[0],
                         originalTransactionId: history.originalTransactionId, subject: history.originalTransactionId, requestedAtMs: requestedAt)
    }

    func responder(bootstrap: String = "127.0.0.1:1", topic: String = "entitlements.verified", policy: ConsumptionPolicy = .init(),
                   onDatabaseReady: @escaping @Sendable (Bool) -> Void = { _ in }) throws -> ConsumptionResponder {
        ConsumptionResponder(
            configuration: ResponderConfiguration(kafka: KafkaConfiguration(bootstrapServers: bootstrap), group: "responder-\(UUID().uuidString.prefix(6))",
                                                  resultTopic: topic, databaseURL: try DatabaseURL(url), policy: policy,
                                                  retryInterval: .seconds(0), sweepInterval: .milliseconds(200),
                                                  initialBackoff: .milliseconds(50), maxBackoff: .milliseconds(500)),
            client: client, logger: logger, onDatabaseReady: onDatabaseReady)
    }

    /// A CONSUMPTION_REQUEST on the result topic, as the workers emit it.
    func request(_ uuid: String) -> EntitlementEvent {
        EntitlementEvent(
            eventId: String(uuid.filter(\.isHexDigit).prefix(32)), kind: "REFUND_REQUESTED", effect: .info, reason: "consumption_request",
            environment: "Sandbox", subject: history.originalTransactionId, transactionId: history.transactionIds[0],
            originalTransactionId: history.originalTransactionId,
            notification: EventNotification(uuid: uuid, type: "CONSUMPTION_REQUEST", subtype: nil, signedDate: TestPayloads.nowMillis()),
            signedDate: TestPayloads.nowMillis(), verifiedAt: TestPayloads.nowMillis(),
            source: EventSource(topic: "appstore.raw", partition: 0, offset: 1, inputKind: "notification"))
    }

    func waitForState(_ uuid: String, _ state: String, timeout: Duration = .seconds(90)) async throws {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if (try? await row(uuid).state) == state { return }
            try await Task.sleep(for: .milliseconds(200))
        }
    }

    func row(_ uuid: String) async throws -> (state: String, attempts: Int, status: Int?, consented: Bool?, delivery: String?) {
        try await withConnection(url) { c in
            let rows = try await c.query(
                "SELECT state, attempts, response_status, customer_consented, delivery_status FROM consumption_answers WHERE notification_uuid = \(uuid)",
                logger: logger).collect()
            guard let r = rows.first else { throw MissingRow(uuid: uuid) }
            let (s, a, st, c2, d) = try r.decode((String, Int, Int?, Bool?, String?).self)
            return (s, a, st, c2, d)
        }
    }
}

@Suite(.serialized)
struct ResponderTests {
    @Test func answersOnceRecordsTheAnswerAndNeverInventsConsent() async throws {
        let h = try await Harness.make()
        let responder = try h.responder(policy: ConsumptionPolicy(refundPreference: .decline))
        let c = h.claim()
        try await withConnection(h.url) { conn in
            let store = ConsumptionStore(connection: conn, logger: logger)
            let v1 = try await store.claim(c, window: .seconds(43_200))
            #expect(v1)
            let v2 = try await !store.claim(c, window: .seconds(43_200))
            #expect(v2, "a second claim of the same request is a no-op")
            let v3 = try await responder.sweep(store)
            #expect(v3 == 1)
            let v4 = try await responder.sweep(store)
            #expect(v4 == 0, "never sent twice")
        }
        let row = try await h.row(c.notificationUUID)
        #expect(row.state == "sent" && row.attempts == 1 && row.status == 202)
        #expect(row.consented == false, "no consent recorded: false, never invented")
        #expect(row.delivery == "UNDELIVERED_OTHER")
        let calls = h.server.consumptionCalls
        #expect(calls.count == 1)
        #expect(calls.first?.transactionId == h.history.transactionIds[0])
        #expect(calls.first?.body == ConsumptionRequest(customerConsented: false, deliveryStatus: .undeliveredOther, refundPreference: .decline))
        await h.server.stop()
    }

    @Test func consentDeliveryAndUsageComeFromTheDatabase() async throws {
        let h = try await Harness.make()
        let c = h.claim()
        try await withConnection(h.url) { conn in
            try await conn.query("INSERT INTO consumption_consent (subject, consented) VALUES (\(h.history.originalTransactionId), true)", logger: logger)
            try await conn.query(
                """
                INSERT INTO consumable_ledger (environment, transaction_id, entry, revocation_key, subject, amount, event_id, signed_date, signed_date_ms)
                VALUES ('Sandbox', \(c.transactionId), 'credit', '', \(c.subject), 100, 'e1', now(), 1)
                """, logger: logger)
            try await conn.query("INSERT INTO consumption_usage (environment, transaction_id, consumption_percentage) VALUES ('Sandbox', \(c.transactionId), 40000)",
                                 logger: logger)
            let store = ConsumptionStore(connection: conn, logger: logger)
            try await store.claim(c, window: .seconds(43_200))
            let sent = try await h.responder().sweep(store)
            #expect(sent == 1)
        }
        #expect(h.server.consumptionCalls.map(\.body) == [
            ConsumptionRequest(customerConsented: true, deliveryStatus: .delivered, consumptionPercentage: 40_000),
        ])
        await h.server.stop()
    }

    @Test func a503IsRetriedAndAnExpiredRequestIsNotSent() async throws {
        let h = try await Harness.make(maxAttempts: 2)
        let responder = try h.responder()
        let c = h.claim()
        let old = h.claim(requestedAt: TestPayloads.nowMillis() - 13 * 3_600_000)
        h.server.failNext(2, status: 503, pathPrefix: "/inApps/v2/transactions/consumption")
        try await withConnection(h.url) { conn in
            let store = ConsumptionStore(connection: conn, logger: logger)
            try await store.claim(c, window: .seconds(43_200))
            try await store.claim(old, window: .seconds(43_200))
            let v5 = try await responder.sweep(store)
            #expect(v5 == 0, "both attempts of the client got 503")
            let pending = try await h.row(c.notificationUUID)
            #expect(pending.state == "pending" && pending.status == nil && pending.attempts == 1)
            let v6 = try await responder.sweep(store)
            #expect(v6 == 1, "the next sweep sends it")
        }
        #expect(try await h.row(c.notificationUUID).state == "sent")
        #expect(try await h.row(c.notificationUUID).attempts == 2)
        #expect(try await h.row(old.notificationUUID).state == "expired")
        #expect(h.server.consumptionCalls.count == 1)
        #expect(h.server.requests.map(\.status) == [503, 503, 202])
        await h.server.stop()
    }

    @Test func theServiceReadsConsumptionRequestsFromTheResultTopic() async throws {
        let h = try await Harness.make()
        let cluster = try EmbeddedKafkaCluster(brokers: 1)
        defer { cluster.shutdown() }
        try cluster.createTopic("entitlements.verified", partitions: 2)
        let uuid = UUID().uuidString.lowercased()
        let event = EntitlementEvent(
            eventId: String(repeating: "a", count: 32), kind: "REFUND_REQUESTED", effect: .info, reason: "consumption_request",
            environment: "Sandbox", subject: h.history.originalTransactionId, transactionId: h.history.transactionIds[0],
            originalTransactionId: h.history.originalTransactionId,
            notification: EventNotification(uuid: uuid, type: "CONSUMPTION_REQUEST", subtype: nil, signedDate: TestPayloads.nowMillis()),
            signedDate: TestPayloads.nowMillis(), verifiedAt: TestPayloads.nowMillis(),
            source: EventSource(topic: "appstore.raw", partition: 0, offset: 1, inputKind: "notification"))
        let other = EntitlementEvent(
            eventId: String(repeating: "b", count: 32), kind: "SUBSCRIPTION_RENEWED", effect: .grant, environment: "Sandbox",
            signedDate: 1, verifiedAt: 1, source: EventSource(topic: "appstore.raw", partition: 0, offset: 2, inputKind: "notification"))
        let producer = try KafkaProducer(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers))
        for e in [event, other, event] {  // the same request delivered twice
            _ = try await producer.send(OutgoingMessage(topic: "entitlements.verified", key: Array(uuid.utf8), value: e.jsonBytes()))
        }
        _ = try await producer.send(OutgoingMessage(topic: "entitlements.verified", value: Array("not json".utf8)))
        producer.close()
        let responder = try h.responder(bootstrap: cluster.bootstrapServers)
        let task = Task { try await responder.run() }
        let deadline = ContinuousClock.now + .seconds(90)
        while ContinuousClock.now < deadline {
            if (try? await h.row(uuid).state) == "sent" { break }
            try await Task.sleep(for: .milliseconds(200))
        }
        try await Task.sleep(for: .seconds(1))
        task.cancel()
        _ = await task.result
        #expect(try await h.row(uuid).state == "sent")
        #expect(h.server.consumptionCalls.count == 1)
        let count = try await withConnection(h.url) { c in
            try await c.query("SELECT count(*) FROM consumption_answers", logger: logger).collect().first!.decode(Int.self)
        }
        #expect(count == 1)
        await h.server.stop()
    }

    @Test func theServiceRidesOutADatabaseOutageAndRecordsAnAnswerItCouldNotRecordThen() async throws {
        var h = try await Harness.make()
        // Its own server: stopping the shared one would disturb tests running in parallel.
        let own = try await ThrowawayPostgres(database: "responder")
        defer { own.destroy() }
        try await withConnection(own.url) { try await SinkSchema.migrate(connection: $0, logger: logger) }
        h.url = own.url
        let cluster = try EmbeddedKafkaCluster(brokers: 1)
        defer { cluster.shutdown() }
        try cluster.createTopic("entitlements.verified", partitions: 1)
        let producer = try KafkaProducer(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers))
        defer { producer.close() }
        func publish(_ uuid: String) async throws {
            _ = try await producer.send(OutgoingMessage(topic: "entitlements.verified", key: Array(uuid.utf8), value: h.request(uuid).jsonBytes()))
        }
        let readiness = Mutex<[Bool]>([])
        let responder = try h.responder(bootstrap: cluster.bootstrapServers, onDatabaseReady: { r in readiness.withLock { $0.append(r) } })
        let finished = Mutex(false)
        let task = Task {
            defer { finished.withLock { $0 = true } }
            try await responder.run()
        }
        defer { task.cancel() }
        let (a, b, c) = (UUID().uuidString.lowercased(), UUID().uuidString.lowercased(), UUID().uuidString.lowercased())
        try await publish(a)
        try await h.waitForState(a, "sent")
        #expect(try await h.row(a).state == "sent")

        // B reaches Apple, then the database stops before Apple's answer can be recorded.
        h.server.stallNext(1, for: .seconds(3))
        let arrived = h.server.arrivals
        try await publish(b)
        let deadline = ContinuousClock.now + .seconds(60)
        while h.server.arrivals == arrived && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        #expect(h.server.arrivals > arrived, "B's answer never reached the stand-in")
        try own.stop()
        // C arrives while the database is down.
        try await publish(c)
        let downUntil = ContinuousClock.now + .seconds(20)
        while readiness.withLock({ $0.last }) != false && ContinuousClock.now < downUntil { try await Task.sleep(for: .milliseconds(50)) }
        #expect(readiness.withLock { $0.last } == false, "not ready while the database is down")
        try await Task.sleep(for: .seconds(4))  // past the stall: Apple has answered B
        #expect(h.server.consumptionCalls.count == 2, "B was sent once; C waits for the database")
        try own.start()
        try await h.waitForState(b, "sent")
        try await h.waitForState(c, "sent")
        try await Task.sleep(for: .seconds(1))
        // The service rode it out: still running, ready again, every request answered exactly once and recorded.
        #expect(!finished.withLock { $0 }, "the responder ended during the outage")
        #expect(readiness.withLock { $0.last } == true, "ready again once the database is back")
        for uuid in [a, b, c] {
            let row = try await h.row(uuid)
            #expect(row.state == "sent" && row.attempts == 1 && row.status == 202, "\(uuid): \(row)")
        }
        #expect(h.server.consumptionCalls.count == 3, "each request sent exactly once")
        task.cancel()
        if case .failure(let error) = await task.result, !(error is CancellationError) {
            Issue.record("the responder failed: \(error)")
        }
        await h.server.stop()
    }
}
