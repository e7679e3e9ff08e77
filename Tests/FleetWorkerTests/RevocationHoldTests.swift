import AppStoreVerification
import FleetDevStack
import FleetKafka
import FleetOperations
import FleetRevocation
import FleetTestPKI
import FleetTestSupport
import Foundation
import Logging
import Testing

@testable import FleetWorker

/// `--revocation-check hard` through a worker: while the OCSP responder is down the worker holds its inputs (nothing
/// rejected, nothing emitted, readiness not ready); once a real responder (`openssl ocsp`) answers, every input is
/// verified, with one OCSP request for the leaf.
@Suite(.serialized)
struct RevocationHoldTests {
    @Test func hardModeHoldsInputsWhileTheResponderIsDownAndVerifiesThemWhenItIsBack() async throws {
        let port = try OCSPTestResponder.freePort()
        var o = TestPKI.Options()
        o.leafOCSPURL = "http://127.0.0.1:\(port)"
        let pki = try TestPKI(options: o)
        let cluster = try EmbeddedKafkaCluster(brokers: 1)
        defer { cluster.shutdown() }
        try cluster.createTopic("raw", partitions: 2)
        try cluster.createTopic("result", partitions: 2)
        try cluster.createTopic("rejected", partitions: 1)
        let t0 = TestPayloads.nowMillis() - 86_400_000
        let values = (0..<30).map { i in
            (value: Array(pki.sign(TestPayloads.transaction(transactionId: String(70_000 + i), purchaseDate: t0, signedDate: t0 + Int64(i))).utf8),
             headers: [KafkaHeader]())
        }
        _ = try await publish(cluster.bootstrapServers, topic: "raw", partitions: 2, values: values)

        // While the responder is down a fetch is refused at once, so this bound only matters once it is back: a
        // fetch that reaches it must not time out on a loaded machine, or a second request follows the first (seen in
        // a fresh-clone `make test` on 2 cores: 2 requests instead of 1, the test itself taking 131 s).
        let fetcher = OCSPHTTPFetcher(timeout: .seconds(10))
        let cache = RevocationCache(
            settings: RevocationSettings(mode: .hard, failureRetryMillis: 100),
            fetch: { await fetcher.fetch(request: $0, uri: $1) })
        let readiness = Readiness()
        var kafka = KafkaConfiguration(bootstrapServers: cluster.bootstrapServers, clientId: "worker-test", sessionTimeoutMilliseconds: 6000, heartbeatIntervalMilliseconds: 500)
        kafka.stallTimeoutSeconds = 1  // a deliberate hold is not a stall: no stall may be declared while it lasts
        let config = WorkerConfiguration(
            kafka: kafka,
            group: "verifiers", inputTopics: ["raw"], resultTopic: "result", rejectedTopic: "rejected",
            policy: try pki.policy(environments: [.sandbox]), threads: 2, maxBatch: 16,
            revocation: RevocationChecker(cache: cache), revocationRetriesBeforeNotReady: 2)
        let worker = try VerifierWorker(configuration: config, readiness: readiness, logger: Logger(label: "revocation-hold"))
        let task = Task { try await worker.run() }
        defer { task.cancel() }

        // The responder is down: the worker retries until it reports not ready; nothing leaves it meanwhile.
        // Generous: in a full `make test` on 2 cores the group's first assignment alone once took over 60 s here.
        let deadline = ContinuousClock.now + .seconds(180)
        while !readiness.failing.contains("revocation-status") && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(readiness.failing.contains("revocation-status"))
        #expect(cache.fetches >= 2)
        #expect(worker.statistics.inputs == 0)
        // Held past twice the stall timeout: no stall declared for this group (so it stays live).
        try await Task.sleep(for: .seconds(3))
        #expect(!ConsumerStalls.all.contains { $0.group == "verifiers" }, "\(ConsumerStalls.all)")

        let responder = try OCSPTestResponder(
            issuer: pki.intermediate, signer: pki.intermediate, signerKeyPEM: pki.intermediateKey.pemRepresentation,
            statuses: [(pki.leaf, .good)], port: port)
        defer { responder.stop() }
        let events = try await readTopic(cluster.bootstrapServers, "result", atLeast: values.count)
        let stats = worker.statistics
        task.cancel()
        _ = try? await task.value
        #expect(events.count == values.count)
        #expect(stats.verified == values.count && stats.rejected == 0)
        #expect(responder.requestCount == 1)
        #expect(!readiness.failing.contains("revocation-status"))
    }
}
