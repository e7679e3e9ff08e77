import AppStoreVerification
import EntitlementDomain
import FleetDemo
import FleetKafka
import FleetSink
import FleetTestPKI
import Foundation
import Logging
import PostgresNIO

/// `fleet bench pipeline`: the demo stack without the display, on a fixed load.
/// Phase 1 (throughput): a burst of notifications, timed from the first publish until every one is a row in PostgreSQL.
/// Phase 2 (latency): a steady rate (half the target by default), end-to-end latency of sampled notifications
/// (published -> its `notifications` row visible in PostgreSQL).
public struct PipelineBenchmark: Sendable {
    public struct Result: Sendable, Codable {
        public var events_per_s: Double
        public var p50_ms: Double
        public var p99_ms: Double
        public var verify_notifications_per_s_single_thread: Double
        public var burst_notifications: Int
        public var latency_rate_per_s: Int
        public var latency_samples: Int
        /// Where the latency goes, p50/p99 of each stage of the sampled notifications (wall clock, ms):
        /// published -> verified by a worker (`received_at`), verified -> the sink's transaction began (`applied_at`),
        /// that transaction began -> its row seen by the 10 ms poller (batch write, commit, poll interval).
        public var stages_ms: [String: Double] = [:]
        /// The machine's idle share during each phase (`/proc/stat`, all cores; nil where unreadable): near 0, the
        /// phase measured what the machine can do, and the latency phase's queues grow with whatever arrives.
        public var burst_idle_pct: Double?
        public var latency_idle_pct: Double?
        /// The issue's targets, filled in by `fleet bench pipeline` (>= 4,000/s; p99 < 300 ms at 2,000/s).
        public var checks: [String: Bool] = [:]
    }

    public var executable: String
    public var workers = 2
    public var sinkWriters = 1
    public var burst = 30_000
    public var latencyRate = 2000
    public var latencySeconds = 10
    public var verifyReference: Double

    public init(executable: String, verifyReference: Double) {
        self.executable = executable
        self.verifyReference = verifyReference
    }

    public func run(logger: Logger = Logger(label: "fleet.bench.pipeline")) async throws -> Result {
        var options = DemoRunner.Options(executable: executable)
        options.quiet = true
        options.responder = false  // the workers and the sink, as issue 16 measures them
        options.workers = workers
        options.sinkWriters = sinkWriters
        options.threadsPerWorker = max(1, ProcessInfo.processInfo.activeProcessorCount / workers)
        let stack = DemoRunner(options: options, logger: logger)
        do {
            try await stack.start()
            guard let cluster = stack.cluster, let pg = stack.postgres, let pki = stack.pki else { throw DemoError("stack did not start") }
            let db = try await PostgresConnection.connect(configuration: try DatabaseURL(pg.url).connectionConfiguration(), id: 7, logger: logger)
            defer { Task { try? await db.close() } }
            // Batched like the workers' output in the demo stack (DemoRunner.mockLingerMilliseconds).
            let producer = try KafkaProducer(configuration: KafkaConfiguration(
                bootstrapServers: cluster.bootstrapServers, clientId: "bench-pipeline", lingerMilliseconds: DemoRunner.mockLingerMilliseconds))
            defer { producer.close() }

            // Phase 1: throughput.
            let burstInputs = Self.notifications(pki: pki, count: burst, subscribers: 3000, seed: 1)
            print("bench pipeline: \(burstInputs.count) notifications generated; burst phase...")
            // The burst runs as fast as the workers absorb it, never further ahead than the mock cluster retains.
            let budget = BacklogGate.budget(messageBytes: burstInputs.map(\.value.count).max() ?? 1)
            var gate = BacklogGate(bootstrapServers: cluster.bootstrapServers, group: DemoRunner.workerGroup, topic: FleetTopics.raw,
                                   partitions: options.partitions, perPartitionBudget: budget)
            let t0 = ContinuousClock.now
            let burstCPU = MachineCPU.sample()
            for (i, n) in burstInputs.enumerated() {
                try await gate.admit(published: i)
                try producer.enqueue(OutgoingMessage(topic: FleetTopics.raw, key: Array(n.key.utf8), value: n.value)) { _ in }
            }
            try await waitForRows(db, table: "notifications", atLeast: burstInputs.count, timeout: .seconds(600))
            let burstSeconds = (ContinuousClock.now - t0).seconds
            let burstIdle = MachineCPU.idlePercent(from: burstCPU, to: MachineCPU.sample())
            let eventsPerS = Double(burstInputs.count) / burstSeconds
            print("bench pipeline: burst of \(burstInputs.count) end to end in \(String(format: "%.2f", burstSeconds)) s = \(Int(eventsPerS))/s")

            // Phase 2: latency at a steady rate.
            let steady = Self.notifications(pki: pki, count: latencyRate * latencySeconds, subscribers: 3000, seed: 2)
            print("bench pipeline: latency phase at \(latencyRate)/s for \(latencySeconds) s...")
            let probes = ProbeSet()
            let interval = 1.0 / Double(latencyRate)
            let start = ContinuousClock.now
            let latencyCPU = MachineCPU.sample()
            let poller = Task { try await Self.pollProbes(db, probes: probes, logger: logger) }
            for (i, n) in steady.enumerated() {
                let due = start + .milliseconds(Int(Double(i) * interval * 1000))
                if due > .now { try await Task.sleep(until: due, clock: .continuous) }
                try await gate.admit(published: burstInputs.count + i)
                if i % 10 == 0 { probes.published(n.uuid, at: .now, wall: Date()) }
                try producer.enqueue(OutgoingMessage(topic: FleetTopics.raw, key: Array(n.key.utf8), value: n.value)) { _ in }
            }
            try await waitForRows(db, table: "notifications", atLeast: burstInputs.count + steady.count, timeout: .seconds(120))
            let latencyIdle = MachineCPU.idlePercent(from: latencyCPU, to: MachineCPU.sample())
            try await Task.sleep(for: .milliseconds(200))
            poller.cancel()
            let latencies = probes.latencies().sorted()
            guard !latencies.isEmpty else { throw DemoError("no latency samples were observed") }
            func pct(_ p: Double) -> Double { Self.percentile(latencies, p) }
            var stages: [String: Double] = [:]
            for (name, values) in probes.stages() where !values.isEmpty {
                let sorted = values.sorted()
                for (label, p) in [("p50", 0.5), ("p99", 0.99)] { stages["\(name)_\(label)"] = (Self.percentile(sorted, p) * 10).rounded() / 10 }
            }
            await stack.stop()
            stack.removeWorkDirectory()  // kept when the run failed (the error names it)
            return Result(
                events_per_s: eventsPerS.rounded(), p50_ms: (pct(0.50) * 10).rounded() / 10, p99_ms: (pct(0.99) * 10).rounded() / 10,
                verify_notifications_per_s_single_thread: verifyReference.rounded(), burst_notifications: burstInputs.count,
                latency_rate_per_s: latencyRate, latency_samples: latencies.count, stages_ms: stages,
                burst_idle_pct: burstIdle, latency_idle_pct: latencyIdle)
        } catch {
            await stack.stop()
            FileHandle.standardError.write(Data("bench pipeline: the processes' logs are kept in \(stack.directory)\n".utf8))
            throw error
        }
    }

    struct Note { var uuid: String; var key: String; var value: [UInt8] }

    /// The `p` quantile of sorted, non-empty values.
    static func percentile(_ sorted: [Double], _ p: Double) -> Double { sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))] }

    /// Renewal notifications (outer + nested transaction + renewal info), distinct UUIDs, increasing signedDates.
    static func notifications(pki: TestPKI, count: Int, subscribers: Int, seed: Int) -> [Note] {
        let now = TestPayloads.nowMillis()
        var out: [Note] = []
        out.reserveCapacity(count)
        for i in 0..<count {
            let original = String(3_000_000_000_000_000 + seed * 10_000_000 + i % subscribers)
            let signed = now - Int64(count - i) * 10
            let t = TestPayloads.transaction(transactionId: String(4_000_000_000_000_000 + seed * 10_000_000 + i), originalTransactionId: original,
                                             purchaseDate: signed - 1000, signedDate: signed)
            let r = TestPayloads.renewalInfo(originalTransactionId: original, signedDate: signed)
            let uuid = UUID().uuidString.lowercased()
            out.append(Note(uuid: uuid, key: original, value: Array(pki.signNotification(
                type: .didRenew, transaction: t, renewal: r, signedDate: signed, notificationUUID: uuid).utf8)))
        }
        return out
    }

    private func waitForRows(_ db: PostgresConnection, table: String, atLeast n: Int, timeout: Duration) async throws {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            for try await row in try await db.query(PostgresQuery(unsafeSQL: "SELECT count(*) FROM \(table)"), logger: Logger(label: "bench")) {
                if try row.decode(Int64.self) >= n { return }
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw DemoError("fewer than \(n) rows in \(table) after \(timeout)")
    }

    static func pollProbes(_ db: PostgresConnection, probes: ProbeSet, logger: Logger) async throws {
        while !Task.isCancelled {
            let outstanding = probes.outstanding()
            if !outstanding.isEmpty {
                let rows = try await db.query("""
                    SELECT notification_uuid, (extract(epoch FROM received_at) * 1000)::float8,
                        (extract(epoch FROM applied_at) * 1000)::float8
                    FROM notifications WHERE notification_uuid = ANY(\(outstanding))
                    """, logger: logger)
                let now = ContinuousClock.now, wall = Date()
                for try await (uuid, verified, began) in rows.decode((String, Double, Double).self) {
                    probes.seen(uuid, at: now, wall: wall, verifiedMs: verified, transactionBeganMs: began)
                }
            }
            try await Task.sleep(for: .milliseconds(10))
        }
    }
}

/// Publish and first-seen times of sampled notifications.
final class ProbeSet: Sendable {
    private struct State {
        var published: [String: (ContinuousClock.Instant, Double)] = [:]
        var latencies: [Double] = []
        var stages: [String: [Double]] = ["to_verified": [], "verified_to_sink_transaction": [], "sink_transaction_to_seen": []]
    }
    private let state = Mutex(State())

    func published(_ uuid: String, at t: ContinuousClock.Instant, wall: Date) {
        state.withLock { $0.published[uuid] = (t, wall.timeIntervalSince1970 * 1000) }
    }

    func outstanding() -> [String] { state.withLock { Array($0.published.keys) } }

    func seen(_ uuid: String, at t: ContinuousClock.Instant, wall: Date, verifiedMs: Double, transactionBeganMs: Double) {
        state.withLock { s in
            guard let (p, publishedMs) = s.published.removeValue(forKey: uuid) else { return }
            s.latencies.append((t - p).seconds * 1000)
            s.stages["to_verified", default: []].append(verifiedMs - publishedMs)
            s.stages["verified_to_sink_transaction", default: []].append(transactionBeganMs - verifiedMs)
            s.stages["sink_transaction_to_seen", default: []].append(wall.timeIntervalSince1970 * 1000 - transactionBeganMs)
        }
    }

    func latencies() -> [Double] { state.withLock { $0.latencies } }

    func stages() -> [String: [Double]] { state.withLock { $0.stages } }
}

import Synchronization
