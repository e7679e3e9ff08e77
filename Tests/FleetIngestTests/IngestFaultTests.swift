import FleetIngest
import FleetIngestClient
import FleetKafka
import FleetTestPKI
import FleetTestSupport
import Foundation
import Synchronization
import Testing

/// Faults: the broker down, too many requests, shutdown under load. The rule in all of them: no 200 without the
/// message on the topic; every 503 carries Retry-After.
@Suite("fleet ingest under faults", .serialized)
struct IngestFaultTests {
    static let path = "/apple/notifications"

    final class Tally: Sendable {
        let accepted = Mutex<[[UInt8]]>([])
        let unavailable = Atomic<Int>(0)
        let retryAfterMissing = Atomic<Int>(0)
        let other = Mutex<[String]>([])
    }

    /// Sends notifications from `threads` threads until `stop` is set; tallies the answers. With `transactions`, every
    /// second request is a signed transaction to `/v1/transactions` (answered by `TransactionFastPath`), tallied by the
    /// JWS it publishes.
    static func load(_ h: IngestHarness, threads: Int, stop: Flag, tally: Tally, transactions: Bool = false) async throws {
        let pki = IngestHarness.pki
        let sequence = Box()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<threads {
                group.addTask {
                    try await onThread {
                        var conn: HTTPConnection?
                        while !stop.isSet {
                            let n = sequence.value.add(1, ordering: .relaxed).oldValue
                            let (path, body, published): (String, [UInt8], [UInt8])
                            if transactions, n % 2 == 1 {
                                let jws = pki.sign(TestPayloads.transaction(transactionId: String(3_000_000_000_000_000 + n)))
                                (path, body, published) = ("/v1/transactions", Array("{\"signedTransaction\":\"\(jws)\"}".utf8), Array(jws.utf8))
                            } else {
                                let note = notificationBody(pki.signNotification(type: .didRenew))
                                (path, body, published) = (Self.path, note, note)
                            }
                            do {
                                if conn == nil || !conn!.isOpen { conn = try h.connect() }
                                let r = try conn!.postJSON(path, body)
                                switch r.status {
                                case 200: tally.accepted.withLock { $0.append(published) }
                                case 503:
                                    tally.unavailable.add(1, ordering: .relaxed)
                                    if r.header("Retry-After") == nil { tally.retryAfterMissing.add(1, ordering: .relaxed) }
                                default: tally.other.withLock { $0.append("\(r.status) \(r.text)") }
                                }
                            } catch {
                                // Connection refused or closed (shutdown): no answer means not accepted.
                                conn = nil
                                Thread.sleep(forTimeInterval: 0.05)
                            }
                        }
                    }
                }
            }
            try await group.waitForAll()
        }
    }

    @Test("broker down for seconds (notifications and transactions): 503 + Retry-After, never 200; every 200 is on the topic afterwards")
    func brokerDown() async throws {
        // 16 partitions: the mock keeps ~5 MiB a partition, and the loaders send as fast as the server answers (8,816
        // notifications acknowledged in one run, more than 3 partitions held: the oldest were deleted before the read).
        let h = try await IngestHarness(brokers: 1, partitions: 16) { $0.publishTimeout = .milliseconds(1500) }
        let stop = Flag()
        let tally = Tally()
        let loader = Task { try await Self.load(h, threads: 8, stop: stop, tally: tally, transactions: true) }
        // The fault starts once the load is flowing (on a loaded machine the first answers can take a while).
        let flowing = ContinuousClock.now + .seconds(60)
        while ContinuousClock.now < flowing, tally.accepted.withLock({ $0.count }) < 20 {
            try await Task.sleep(for: .milliseconds(100))
        }
        let beforeDown = tally.accepted.withLock { $0.count }
        try h.cluster.setBrokerDown(1)
        // Answers to requests sent while the broker is down: the broker stays down until some have timed out into
        // 503s (publish timeout 1.5 s; longer on a loaded machine).
        try await Task.sleep(for: .seconds(4))
        let outage = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < outage, tally.unavailable.load(ordering: .relaxed) == 0 {
            try await Task.sleep(for: .milliseconds(200))
        }
        let duringDown = tally.accepted.withLock { $0.count }
        let unavailableDuringDown = tally.unavailable.load(ordering: .relaxed)
        try h.cluster.setBrokerUp(1)
        // librdkafka reconnects with a backoff that grows to reconnect.backoff.max.ms (10 s): allow for it.
        let recovery = ContinuousClock.now + .seconds(40)
        while ContinuousClock.now < recovery, tally.accepted.withLock({ $0.count }) <= duringDown + 20 {
            try await Task.sleep(for: .milliseconds(250))
        }
        try await Task.sleep(for: .seconds(1))
        stop.set()
        try await loader.value
        let accepted = tally.accepted.withLock { $0 }
        #expect(beforeDown > 0, "nothing accepted before the fault")
        #expect(unavailableDuringDown > 0, "no 503 while the broker was down")
        #expect(tally.retryAfterMissing.load(ordering: .relaxed) == 0)
        #expect(tally.other.withLock { $0 }.isEmpty, "\(tally.other.withLock { $0.prefix(3) })")
        #expect(accepted.count > duringDown, "nothing accepted after the broker came back")
        // Every 200 is on the topic (503s may or may not be: the client retries those, duplicates are fine).
        let messages = try await h.read(atLeast: accepted.count, timeout: .seconds(90))
        let onTopic = Set(messages.map(\.value))
        // A partition read from an offset above 0 lost its oldest records to the mock's retention, not to the front door.
        let trimmed = Dictionary(grouping: messages, by: \.partition).filter { $0.value.map(\.offset).min() != 0 }.keys.sorted()
        #expect(trimmed.isEmpty, "the embedded cluster's retention (~5 MiB a partition) deleted records of partitions \(trimmed)")
        let missing = accepted.filter { !onTopic.contains($0) }.count
        #expect(missing == 0, "\(missing) of \(accepted.count) acknowledged notifications are not on the topic")
        print("broker-down: accepted \(accepted.count) (\(beforeDown) before, \(duringDown - beforeDown) around the fault), 503 \(tally.unavailable.load(ordering: .relaxed)), on topic \(messages.count)")
        await h.stop()
    }

    @Test("beyond the in-flight bound: 503 overloaded with Retry-After")
    func inFlightBound() async throws {
        let h = try await IngestHarness(brokers: 1) {
            $0.maxInFlight = 1
            $0.publishTimeout = .seconds(6)
        }
        try h.cluster.setBrokerDown(1)
        let pki = IngestHarness.pki
        let first = Task { try await onThread { try h.connect().postJSON(Self.path, notificationBody(pki.signNotification(type: .test))) } }
        try await Task.sleep(for: .seconds(1))
        let second = try await onThread { try h.connect().postJSON(Self.path, notificationBody(pki.signNotification(type: .test))) }
        #expect(second.status == 503)
        #expect(json(second)["error"] as? String == "overloaded")
        #expect(second.header("Retry-After") == "2")
        let firstResult = try await first.value
        #expect(firstResult.status == 503, "the held request cannot be stored while the broker is down")
        #expect(json(firstResult)["error"] as? String == "unavailable")
        try h.cluster.setBrokerUp(1)
        await h.stop()
    }

    @Test("graceful shutdown mid-load (notifications and transactions): in-flight requests finish, no 200 without its message on the topic")
    func shutdownMidLoad() async throws {
        let h = try await IngestHarness(brokers: 1, partitions: 16)  // room for 3 s of full-speed load (see brokerDown)
        let stop = Flag()
        let tally = Tally()
        let loader = Task { try await Self.load(h, threads: 8, stop: stop, tally: tally, transactions: true) }
        try await Task.sleep(for: .seconds(3))
        let ended = await h.stop()
        if case .failure(let e) = ended { Issue.record("the service ended with \(e)") }
        // After the stop nothing is accepted any more.
        let atStop = tally.accepted.withLock { $0.count }
        try await Task.sleep(for: .seconds(1))
        stop.set()
        try await loader.value
        let accepted = tally.accepted.withLock { $0 }
        #expect(accepted.count == atStop, "answers after the service stopped")
        #expect(accepted.count > 0)
        let messages = try await h.read(atLeast: accepted.count, timeout: .seconds(60))
        let onTopic = Set(messages.map(\.value))
        // A partition read from an offset above 0 lost its oldest records to the mock's retention, not to the front door.
        let trimmed = Dictionary(grouping: messages, by: \.partition).filter { $0.value.map(\.offset).min() != 0 }.keys.sorted()
        #expect(trimmed.isEmpty, "the embedded cluster's retention (~5 MiB a partition) deleted records of partitions \(trimmed)")
        let missing = accepted.filter { !onTopic.contains($0) }.count
        #expect(missing == 0, "\(missing) of \(accepted.count) acknowledged notifications are not on the topic")
        #expect(h.readiness.isReady == false)
    }
}
