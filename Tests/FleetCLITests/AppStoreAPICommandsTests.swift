import AppStoreServerAPI
import AppStoreVerification
import Crypto
import FleetDevStack
import FleetKafka
import FleetSink
import FleetTestPKI
import FleetTestSupport
import Foundation
import Testing

/// `fleet reconcile`, `fleet backfill` and `fleet test-notification` against the strict stand-in for Apple's API,
/// publishing into an embedded Kafka cluster, run through the built executable.
@Suite(.serialized)
struct AppStoreAPICommandsTests {
    static let pki = try! TestPKI()
    static let keyId = "2X9R4HXF34"
    static let issuerId = "57246542-96fe-1a63-e053-0824d011072a"
    static let bundleId = TestPayloads.bundleId

    struct Setup {
        var server: AppleAPIStandIn
        var cluster: EmbeddedKafkaCluster
        var keyPath: String
        var topic: String

        func args(_ command: String, keyPath: String? = nil) -> [String] {
            [command, "--api-base-url", server.baseURL, "--api-key-id", AppStoreAPICommandsTests.keyId,
             "--api-issuer-id", AppStoreAPICommandsTests.issuerId, "--api-private-key", keyPath ?? self.keyPath,
             "--bundle-id", AppStoreAPICommandsTests.bundleId, "--bootstrap-servers", cluster.bootstrapServers, "--topic", topic]
        }

        func stop() async {
            await server.stop()
            cluster.shutdown()
        }
    }

    static func setup() async throws -> Setup {
        let (key, pem) = StandInFixtures.apiKey()
        let server = try await AppleAPIStandIn.start(expecting: .init(keyId: keyId, issuerId: issuerId, bundleId: bundleId, publicKey: key.publicKey))
        let cluster = try EmbeddedKafkaCluster(brokers: 1)
        let topic = "appstore.raw.\(UUID().uuidString.prefix(6).lowercased())"
        try cluster.createTopic(topic, partitions: 3)
        return Setup(server: server, cluster: cluster, keyPath: try writeTemp(pem, name: "key.p8"), topic: topic)
    }

    static func writeTemp(_ text: String, name: String) throws -> String {
        let dir = try TemporaryFiles.directory("fleet-api")
        let path = dir.appendingPathComponent(name).path
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    /// Every message on `topic` (waits until `count` arrived or 60 s passed).
    static func consumeAll(_ setup: Setup, count: Int) async throws -> [KafkaMessage] {
        let consumer = try KafkaConsumer(configuration: KafkaConfiguration(bootstrapServers: setup.cluster.bootstrapServers),
                                         groupId: "check-\(UUID().uuidString.prefix(6))", topics: [setup.topic])
        var seen: [KafkaMessage] = []
        let deadline = ContinuousClock.now + .seconds(60)
        while seen.count < count, ContinuousClock.now < deadline {
            seen += try await consumer.nextBatch(maxMessages: 500, timeout: .milliseconds(500))
        }
        // A little longer, to catch duplicates.
        seen += try await consumer.nextBatch(maxMessages: 500, timeout: .seconds(1))
        _ = await consumer.close(deadline: .seconds(5))
        return seen
    }

    static func verifier() -> SignedDataVerifier { SignedDataVerifier(policy: try! pki.policy(), chainCache: ChainCache(capacity: 16)) }

    @Test func reconcileWithThreePagesAndA429PublishesEverythingExactly() async throws {
        let setup = try await Self.setup()
        let pages = StandInFixtures.notificationPages(pki: Self.pki, pages: 3, perPage: 5)
        setup.server.setNotificationHistory(pages: pages, throttlePage: 1, retryAfter: "1")
        let run = try await PipelineCommandsTests.fleet(
            setup.args("reconcile") + ["--since", "2026-06-01T00:00:00Z", "--until", "2026-06-02T00:00:00Z"], timeout: .seconds(120))
        let messages = try await Self.consumeAll(setup, count: 15)
        await setup.stop()
        #expect(run.status == 0, "stdout: \(run.stdout)\nstderr: \(run.stderr)")
        #expect(run.stdout.contains("reconcile: 3 page(s), 15 published, 0 skipped"), "\(run.stdout)")
        #expect(run.stderr.contains("retrying /inApps/v1/notifications/history"), "\(run.stderr)")
        let all = pages.flatMap { $0 }
        #expect(messages.count == all.count)
        #expect(Set(messages.map { String(decoding: $0.value, as: UTF8.self) }) == Set(all))
        for m in messages {
            let jws = String(decoding: m.value, as: UTF8.self)
            #expect(m.key.map { String(decoding: $0, as: UTF8.self) } == UnverifiedJWS.string(jws, "notificationUUID"))
            #expect(throws: Never.self) { try Self.verifier().verifyNotification(jws) }
        }
        let log = setup.server.requests
        #expect(log.allSatisfy { $0.tokenProblem == nil })
        #expect(log.map(\.status) == [200, 429, 200, 200], "the throttled page retried once")
        let body = try JSONDecoder().decode(NotificationHistoryRequest.self, from: Data(log[0].body.utf8))
        #expect(body.startDate == 1_780_272_000_000 && body.endDate == 1_780_358_400_000)
        #expect(!run.stderr.contains("PRIVATE KEY") && !run.stdout.contains("PRIVATE KEY"))
    }

    @Test func aWrongKeyGetsAClear401AndExitCode2() async throws {
        let setup = try await Self.setup()
        setup.server.setNotificationHistory(pages: [[]])
        let otherKey = try Self.writeTemp(P256.Signing.PrivateKey().pemRepresentation, name: "other.p8")
        let run = try await PipelineCommandsTests.fleet(
            setup.args("reconcile", keyPath: otherKey) + ["--since", "1780272000000"], timeout: .seconds(60))
        await setup.stop()
        #expect(run.status == 2, "stderr: \(run.stderr)")
        #expect(run.stderr.contains("refused the credentials (401)"))
        #expect(run.stderr.contains("key id '\(Self.keyId)'"))
        #expect(setup.server.requests.count == 1, "401 is not retried")
        #expect(!run.stderr.contains("PRIVATE KEY"))
        // A file that is not a key: a clear error, no crash, no key material.
        let notAKey = try Self.writeTemp("-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n", name: "bad.p8")
        let bad = try await PipelineCommandsTests.fleet(setup.args("reconcile", keyPath: notAKey) + ["--since", "1780272000000"], timeout: .seconds(60))
        #expect(bad.status != 0 && bad.status != 2)
        #expect(bad.stderr.contains("is not an ES256 (P-256) private key"), "\(bad.stderr)")
        #expect(!bad.stderr.contains("bm90IGEga2V5"))
    }

    @Test func backfillPublishesALongHistoryAndTheStatuses() async throws {
        let setup = try await Self.setup()
        let h = StandInFixtures.subscriptionHistory(pki: Self.pki, count: 45)
        setup.server.addHistory(originalTransactionId: h.originalTransactionId, transactionIds: h.transactionIds,
                                signedTransactions: h.signedTransactions, status: h.status)
        setup.server.failNext(1, status: 503, pathPrefix: "/inApps/v2/history")
        let run = try await PipelineCommandsTests.fleet(setup.args("backfill") + ["--transaction-id", h.transactionIds[44]], timeout: .seconds(120))
        let messages = try await Self.consumeAll(setup, count: 47)
        await setup.stop()
        #expect(run.status == 0, "stdout: \(run.stdout)\nstderr: \(run.stderr)")
        #expect(run.stdout.contains("3 history page(s), 45 transaction(s) and 2 status document(s) published, 0 not found"), "\(run.stdout)")
        let values = messages.map { String(decoding: $0.value, as: UTF8.self) }
        #expect(values.count == 47)
        #expect(Set(values) == Set(h.signedTransactions + [h.status.signedRenewalInfo!]))
        #expect(values.filter { $0 == h.signedTransactions[44] }.count == 2, "history and status both carry the latest")
        let verifier = Self.verifier()
        for v in values { #expect(throws: Never.self) { try verifier.verify(v) } }
        #expect(setup.server.requests.allSatisfy { $0.tokenProblem == nil })
        #expect(setup.server.requests.map(\.status) == [503, 200, 200, 200, 200])
    }

    @Test func backfillOfAnUnknownTransactionSaysSoAndFails() async throws {
        let setup = try await Self.setup()
        let run = try await PipelineCommandsTests.fleet(setup.args("backfill") + ["--transaction-id", "4242"], timeout: .seconds(60))
        await setup.stop()
        #expect(run.status == 1)
        #expect(run.stderr.contains("4242: not found"), "\(run.stderr)")
        #expect(run.stderr.contains("errorCode 4040010"))
    }

    @Test func testNotificationReportsTheOutcome() async throws {
        let setup = try await Self.setup()
        setup.server.setTestNotificationPayload(Self.pki.signNotification(type: .test))
        let run = try await PipelineCommandsTests.fleet(setup.args("test-notification") + ["--publish"], timeout: .seconds(60))
        let messages = try await Self.consumeAll(setup, count: 1)
        await setup.stop()
        #expect(run.status == 0, "stdout: \(run.stdout)\nstderr: \(run.stderr)")
        #expect(run.stdout.contains("send attempt") && run.stdout.contains("SUCCESS"))
        #expect(run.stdout.contains("outcome: delivered"))
        #expect(messages.count == 1)
    }

    /// What reconcile and backfill publish is what a worker accepts: every document verifies against the test
    /// PKI's root (no rejection) and gives at least one event.
    @Test func aWorkerVerifiesEverythingReconcileAndBackfillPublished() async throws {
        let setup = try await Self.setup()
        let pages = StandInFixtures.notificationPages(pki: Self.pki, pages: 3, perPage: 4)
        setup.server.setNotificationHistory(pages: pages, throttlePage: 2)
        let h = StandInFixtures.subscriptionHistory(pki: Self.pki, count: 45)
        setup.server.addHistory(originalTransactionId: h.originalTransactionId, transactionIds: h.transactionIds,
                                signedTransactions: h.signedTransactions, status: h.status)
        let reconcile = try await PipelineCommandsTests.fleet(setup.args("reconcile") + ["--since", "2d"], timeout: .seconds(120))
        #expect(reconcile.status == 0, "\(reconcile.stderr)")
        let backfill = try await PipelineCommandsTests.fleet(setup.args("backfill") + ["--transaction-id", h.originalTransactionId], timeout: .seconds(120))
        #expect(backfill.status == 0, "\(backfill.stderr)")
        let inputs = 12 + 45 + 2
        let result = "result.\(setup.topic)", rejected = "rejected.\(setup.topic)"
        try setup.cluster.createTopic(result, partitions: 1)
        try setup.cluster.createTopic(rejected, partitions: 1)
        let root = try Self.writeTemp("", name: "root.der")
        try Data(Self.pki.rootDER).write(to: URL(fileURLWithPath: root))
        let worker = Process()
        worker.executableURL = try #require(FleetBinary.url)
        worker.arguments = ["worker", "--bootstrap-servers", setup.cluster.bootstrapServers, "--input-topic", setup.topic,
                            "--result-topic", result, "--rejected-topic", rejected, "--root-certificate", root,
                            "--bundle-id", Self.bundleId, "--environment", "Sandbox", "--group", "w-\(UUID().uuidString.prefix(6))",
                            "--metrics-port", "0", "--threads", "1"]
        worker.standardOutput = FileHandle.nullDevice
        worker.standardError = FileHandle.nullDevice
        try worker.run()
        let consumer = try KafkaConsumer(configuration: KafkaConfiguration(bootstrapServers: setup.cluster.bootstrapServers),
                                         groupId: "check-\(UUID().uuidString.prefix(6))", topics: [result, rejected])
        var sources = Set<Int64>()
        var rejections = 0
        let deadline = ContinuousClock.now + .seconds(120)
        while sources.count < inputs, ContinuousClock.now < deadline {
            for m in try await consumer.nextBatch(maxMessages: 500, timeout: .milliseconds(500)) {
                if m.topic == rejected { rejections += 1; continue }
                let event = try JSONValue.parse(String(decoding: m.value, as: UTF8.self))
                if let p = event["source"]?["partition"]?.int64Value, let o = event["source"]?["offset"]?.int64Value {
                    sources.insert(p * 1_000_000 + o)
                }
            }
        }
        _ = await consumer.close(deadline: .seconds(5))
        worker.terminate()
        worker.waitUntilExit()
        await setup.stop()
        #expect(rejections == 0)
        #expect(sources.count == inputs, "every input gave at least one verified event")
    }

    /// Runs SQL with psql (the client that comes with the PostgreSQL server binaries).
    static func psql(_ server: ThrowawayPostgres, _ url: String, _ sql: String) throws {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: server.binDirectory + "/psql")
        if !FileManager.default.isExecutableFile(atPath: p.executableURL!.path) { p.executableURL = URL(fileURLWithPath: "/usr/bin/psql") }
        p.arguments = ["-q", "-v", "ON_ERROR_STOP=1", url, "-c", sql]
        p.standardOutput = FileHandle.nullDevice
        try p.run()
        p.waitUntilExit()
        #expect(p.terminationStatus == 0, "psql: \(sql)")
    }

    @Test func withTheSinkDatabaseReconcileSkipsStoredNotificationsAndBackfillWalksItsTransactions() async throws {
        let server = try await ThrowawayPostgres(database: "cli_api")
        defer { server.destroy() }
        let url = server.url
        let migrate = try await PipelineCommandsTests.fleet(["migrate", "--database-url", url], timeout: .seconds(120))
        #expect(migrate.status == 0, "\(migrate.stderr)")
        let setup = try await Self.setup()
        let pages = StandInFixtures.notificationPages(pki: Self.pki, pages: 2, perPage: 3)
        setup.server.setNotificationHistory(pages: pages)
        let storedUUID = try #require(UnverifiedJWS.string(pages[1][0], "notificationUUID"))
        try Self.psql(server, url, """
            INSERT INTO notifications (notification_uuid, environment, notification_type, signed_date, signed_date_ms, payload,
                source_topic, source_partition, source_offset, received_at, applied_at)
            VALUES ('\(storedUUID)', 'Sandbox', 'DID_RENEW', now(), 1, '{}', 'appstore.raw', 0, 0, now(), now())
            """)
        let reconcile = try await PipelineCommandsTests.fleet(
            setup.args("reconcile") + ["--since", "1d", "--database-url", url], timeout: .seconds(120))
        #expect(reconcile.status == 0, "\(reconcile.stderr)")
        #expect(reconcile.stdout.contains("2 page(s), 5 published, 1 skipped"), "\(reconcile.stdout)")

        let a = StandInFixtures.subscriptionHistory(pki: Self.pki, count: 3), b = StandInFixtures.subscriptionHistory(pki: Self.pki, count: 2)
        for h in [a, b] {
            setup.server.addHistory(originalTransactionId: h.originalTransactionId, transactionIds: h.transactionIds,
                                    signedTransactions: h.signedTransactions, status: h.status)
            try Self.psql(server, url, """
                INSERT INTO transactions (environment, transaction_id, signed_date_ms, signed_date, original_transaction_id, payload, event_id)
                VALUES ('Sandbox', '\(h.transactionIds.last!)', 1, now(), '\(h.originalTransactionId)', '{}', 'e-\(h.originalTransactionId)')
                """)
        }
        let backfill = try await PipelineCommandsTests.fleet(
            setup.args("backfill") + ["--from-database", "--database-url", url, "--requests-per-second", "20"], timeout: .seconds(120))
        let messages = try await Self.consumeAll(setup, count: 5 + 3 + 2 + 4)
        await setup.stop()
        #expect(backfill.status == 0, "\(backfill.stderr)")
        #expect(backfill.stderr.contains("2 originalTransactionId(s) from the database"))
        #expect(backfill.stdout.contains("2 id(s), 2 history page(s), 5 transaction(s) and 4 status document(s) published"), "\(backfill.stdout)")
        #expect(messages.count == 5 + 5 + 4)
        #expect(!messages.contains { String(decoding: $0.value, as: UTF8.self) == pages[1][0] }, "the stored one was skipped")
    }

    @Test func missingSettingsAreNamed() async throws {
        let run = try await PipelineCommandsTests.fleet(["reconcile", "--since", "2026-06-01T00:00:00Z"], timeout: .seconds(30))
        #expect(run.status != 0)
        #expect(run.stderr.contains("--api-key-id") || run.stderr.contains("FLEET_API_KEY_ID"), "\(run.stderr)")
        let help = try await PipelineCommandsTests.fleet(["reconcile", "--help"], timeout: .seconds(30))
        for flag in ["--api-base-url", "--api-key-id", "--api-issuer-id", "--api-private-key", "--bundle-id", "--environment",
                     "--bootstrap-servers", "--topic", "--since", "--until", "--only-failures", "--database-url"] {
            #expect(help.stdout.contains(flag), "\(flag) in --help")
        }
    }
}
