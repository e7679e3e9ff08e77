import AppStoreVerification
import EntitlementDomain
import FleetDevStack
import FleetKafka
import FleetOperations
import FleetSink
import FleetTestPKI
import Foundation
import Logging
import PostgresNIO

/// Runs the whole fleet on embedded defaults, as separate processes like in production: librdkafka's mock cluster
/// (3 brokers) hosted here, a throwaway PostgreSQL, `fleet ingest`, N `fleet worker` processes, one `fleet sink` and
/// `fleet responder` (against a local stand-in for Apple's App Store Server API, hosted here too); then sends demo
/// traffic through the front door at a steady rate and reports what happened.
public final class DemoRunner: @unchecked Sendable {
    // Safety: mutable state is touched only from the single task that calls `run()`; children are stopped there too.

    public struct Options: Sendable {
        public var executable: String
        public var workers = 2
        public var threadsPerWorker = 1
        /// `fleet sink --writers` (the sink's default, one: on a 2-core machine shared by the whole stack a second
        /// writer raised `bench pipeline`'s p99 at 1,500/s from ~0.3 s to 0.7-3.6 s).
        public var sinkWriters = 1
        /// Partitions of the raw and result topics (the mock's retention is per partition, see `BacklogGate`).
        public var partitions = 16
        public var ratePerSecond = 1500
        public var traffic = DemoTraffic.Options()
        public var keepRunning = false
        /// Keep the work directory (every process's log, the products file, the test root) after a run that
        /// succeeded; after a failure it is always kept, and named in the error.
        public var keepLogs = false
        /// No live display (benchmarks); the summary is still returned.
        public var quiet = false
        public var drainTimeout: Duration = .seconds(120)
        /// Run `fleet responder` against a local App Store Server API stand-in (off in `bench pipeline`, which measures
        /// the workers and the sink alone).
        public var responder = true
        public init(executable: String) { self.executable = executable }
    }

    public struct Summary: Sendable, Codable {
        public var published = 0
        public var publishSeconds = 0.0
        public var totalSeconds = 0.0
        public var processedInputs = 0
        public var rejectedByReason: [String: Int] = [:]
        public var eventsWritten = 0
        public var eventsByKind: [String: Int] = [:]
        public var activeByEntitlement: [String: Int] = [:]
        public var ticketBalances: [String: Double] = [:]
        public var staleEvents = 0
        /// End-to-end latencies (published -> row in PostgreSQL), milliseconds, sampled per event.
        public var latencyMillis: [Double] = []
        /// `consumption_answers` rows by state (CONSUMPTION_REQUESTs the responder recorded).
        public var consumptionByState: [String: Int] = [:]
        /// Consumption Information requests the App Store API stand-in received.
        public var consumptionCalls = 0
        /// `ConsumptionVerdict` over the recorded requests: passed, and what it found.
        public var consumptionPassed = true
        public var consumptionDetail = ""
    }

    public static let workerGroup = "fleet-verifiers"
    public static let sinkGroup = "fleet-sink"
    public static let responderGroup = "fleet-responder"

    let options: Options
    let logger: Logger
    public private(set) var cluster: EmbeddedKafkaCluster?
    public private(set) var postgres: ThrowawayPostgres?
    var children: [(name: String, process: Process, port: Int)] = []
    public private(set) var directory = ""

    public init(options: Options, logger: Logger = Logger(label: "fleet.demo")) {
        self.options = options
        self.logger = logger
    }

    private func say(_ s: String) {
        guard !options.quiet else { return }
        print(s)
        fflush(nil)
    }

    // MARK: - Stack

    public func start() async throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("fleet-demo-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        say("== entitlement-fleet demo (work directory \(directory))")

        let cluster = try EmbeddedKafkaCluster(brokers: 3)
        self.cluster = cluster
        try cluster.createTopic(FleetTopics.raw, partitions: options.partitions)
        try cluster.createTopic(FleetTopics.result, partitions: options.partitions)
        try cluster.createTopic(FleetTopics.rejected, partitions: 3)
        try cluster.createTopic(FleetTopics.sinkRejected, partitions: 1)
        say("kafka      embedded cluster, 3 brokers: \(cluster.bootstrapServers)")

        let pg = try await ThrowawayPostgres(database: "fleet", logger: logger)
        postgres = pg
        say("postgres   throwaway server: \(pg.url)")
        try runToCompletion(["migrate", "--database-url", pg.url], name: "migrate")

        let pki = try TestPKI()
        let rootPath = directory + "/test-root.der"
        _ = FileManager.default.createFile(atPath: rootPath, contents: Data(TestPKI.der(pki.root)))
        let productsPath = directory + "/products.yaml"
        try DemoTraffic.catalogueYAML.write(toFile: productsPath, atomically: true, encoding: .utf8)
        self.pki = pki

        for i in 0..<options.workers {
            let port = Loopback.freePort()
            try spawn("worker-\(i + 1)", port: port, [
                "worker", "--bootstrap-servers", cluster.bootstrapServers, "--group", Self.workerGroup,
                "--input-topic", FleetTopics.raw, "--result-topic", FleetTopics.result, "--rejected-topic", FleetTopics.rejected,
                "--root-certificate", rootPath, "--bundle-id", options.traffic.bundleId,
                "--environment", options.traffic.environment.rawValue, "--app-apple-id", String(options.traffic.appAppleId),
                "--products", productsPath, "--metrics-port", String(port), "--threads", String(options.threadsPerWorker),
                "--shutdown-deadline-seconds", "10",
                // Commit stored offsets often so the publisher's backlog gate sees progress promptly (at 250 ms, with
                // the gate's own 100 ms wait, the burst's publisher stopped while the workers' partitions ran dry).
                "--kafka-property", "auto.commit.interval.ms=100",
            ] + Self.mockFetchProperties + Self.mockProducerProperties)
        }
        // The front door: demo traffic goes through `fleet ingest` over HTTP (DemoIngest.swift).
        let ingestMetricsPort = Loopback.freePort()
        ingestPort = Loopback.freePort()
        try spawn("ingest", port: ingestMetricsPort, DemoIngestFeeder.arguments(
            bootstrap: cluster.bootstrapServers, topic: FleetTopics.raw, port: ingestPort, metricsPort: ingestMetricsPort,
            verification: ["--root-certificate", rootPath, "--bundle-id", options.traffic.bundleId,
                           "--environment", options.traffic.environment.rawValue, "--app-apple-id", String(options.traffic.appAppleId),
                           "--products", productsPath]))
        let sinkPort = Loopback.freePort()
        try spawn("sink", port: sinkPort, [
            "sink", "--bootstrap-servers", cluster.bootstrapServers, "--group", Self.sinkGroup,
            "--result-topic", FleetTopics.result, "--rejected-topic", FleetTopics.sinkRejected,
            "--database-url", pg.url, "--metrics-port", String(sinkPort), "--shutdown-deadline-seconds", "10",
            "--writers", String(options.sinkWriters),
        ] + Self.mockFetchProperties)
        if options.responder {
            try await spawnResponder(bootstrap: cluster.bootstrapServers, databaseURL: pg.url)
        }
        if options.keepRunning {  // `fleet dashboard` on the result and rejected topics, live from the start
            let port = Loopback.freePort()
            dashboardPort = port
            try spawn("dashboard", port: port, [
                "dashboard", "--bootstrap-servers", cluster.bootstrapServers, "--result-topic", FleetTopics.result,
                "--rejected-topic", FleetTopics.rejected, "--port", String(port),
            ])
        }
        say("processes  fleet ingest (HTTP :\(ingestPort)) + \(options.workers) verifier worker(s) + 1 sink (\(options.sinkWriters) writer(s))\(options.responder ? " + 1 responder (App Store Server API stand-in at \(appleAPI?.standIn.baseURL ?? "?"))" : ""), logs in \(directory)/*.log; waiting for readiness...")
        try await waitReady(timeout: .seconds(90))
        say("ready      all processes report /readyz 200")
    }

    public private(set) var pki: TestPKI?
    var dashboardPort: Int?
    var ingestPort = 0
    /// The local stand-in for Apple's App Store Server API that `fleet responder` answers.
    var appleAPI: DemoAppStoreAPI?

    /// `fleet responder`, answering the local App Store Server API stand-in.
    private func spawnResponder(bootstrap: String, databaseURL: String) async throws {
        let api = try await DemoAppStoreAPI.start(
            directory: directory, bundleId: options.traffic.bundleId, environment: options.traffic.environment.rawValue)
        appleAPI = api
        let port = Loopback.freePort()
        try spawn("responder", port: port, [
            "responder", "--bootstrap-servers", bootstrap, "--group", Self.responderGroup, "--result-topic", FleetTopics.result,
            "--database-url", databaseURL, "--metrics-port", String(port), "--retry-interval-seconds", "1",
        ] + api.responderArguments + Self.mockFetchProperties)
    }

    /// librdkafka 2.0.2's mock broker answers an empty fetch only after the full `fetch.wait.max.ms` (500 ms by
    /// default), even when data arrives meanwhile (a real broker answers as soon as data is there). Every hop of the
    /// embedded pipeline would add up to half a second of latency; a short wait keeps the demo's latency honest.
    static let mockFetchProperties = ["--kafka-property", "fetch.wait.max.ms=10"]

    /// librdkafka 2.0.2's mock broker finds a fetch's message set by walking the partition's list of message sets from
    /// the oldest, and answers each fetch with one message set per partition. At a steady 2,000 notifications/s over
    /// 16 partitions, the default `linger.ms=5` makes nearly every message its own message set: the walk took ~8 % of
    /// the machine's CPU in `bench pipeline`'s latency phase (`perf`: 0x113f84 in librdkafka.so.1,
    /// `rd_kafka_mock_msgset_find`) and each consumer needed a fetch per message. Producers writing into the embedded
    /// cluster (the workers, the pipeline benchmark's publisher) batch for up to 20 ms instead: ~2.4 % in the same
    /// phase. A real broker has neither cost; `fleet worker` keeps librdkafka's default.
    public static let mockLingerMilliseconds = 20
    static let mockProducerProperties = ["--kafka-property", "linger.ms=\(mockLingerMilliseconds)"]

    public func stop() async {
        for c in children where c.process.isRunning { kill(c.process.processIdentifier, SIGTERM) }
        let deadline = ContinuousClock.now + .seconds(20)
        for c in children {
            while c.process.isRunning && ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(50)) }
            if c.process.isRunning { kill(c.process.processIdentifier, SIGKILL) }
        }
        children.removeAll()
        await appleAPI?.standIn.stop()
        appleAPI = nil
        postgres?.destroy()
        postgres = nil
        cluster?.shutdown()
        cluster = nil
    }

    /// Removes the work directory (the processes' logs): after a run that succeeded, once `stop()` returned.
    public func removeWorkDirectory() {
        guard !directory.isEmpty else { return }
        try? FileManager.default.removeItem(atPath: directory)
    }

    // MARK: - Traffic

    public func run() async throws -> Summary {
        let began = ContinuousClock.now
        try await start()
        var summary = Summary()
        do {
            guard let cluster, let pki, let pg = postgres else { throw DemoError("stack did not start") }
            say("traffic    generating \(options.traffic.subscribers) subscribers over \(options.traffic.months) months, \(options.traffic.ticketBuyers) ticket buyers...")
            let traffic = try DemoTraffic(pki: pki, options: options.traffic)
            appleAPI?.know(traffic)
            say("traffic    \(traffic.items.count) inputs (\(traffic.items.filter { $0.expectation != "valid" && $0.expectation != "replay" }.count) bad, \(traffic.items.filter { $0.expectation == "replay" }.count) replays); publishing at \(options.ratePerSecond)/s")
            let db = try await connect(pg.url)
            defer { Task { try? await db.close() } }
            let publishStart = ContinuousClock.now
            try await publish(traffic, cluster: cluster, db: db)
            summary.publishSeconds = (ContinuousClock.now - publishStart).seconds
            summary.published = traffic.items.count
            try await drain(expectedInputs: traffic.items.count, cluster: cluster, db: db)
            if options.responder { try await settleConsumption(cluster: cluster, db: db) }
            if !options.quiet { print("") }
            try await collect(into: &summary, cluster: cluster, db: db)
            if options.responder { try checkConsumption(summary) }
            summary.totalSeconds = (ContinuousClock.now - began).seconds
            printSummary(summary)
            if options.keepRunning {
                printKeepRunning(cluster: cluster, pg: pg)
                await waitForInterrupt()
            }
        } catch {
            await stop()
            throw error
        }
        await stop()
        if options.keepLogs {
            say("stopped    every process stopped cleanly; the throwaway database and cluster are gone; logs kept in \(directory)")
        } else {
            removeWorkDirectory()
            say("stopped    every process stopped cleanly; the throwaway database, the cluster and the logs are gone (--keep-logs keeps the logs).")
        }
        return summary
    }

    private func publish(_ traffic: DemoTraffic, cluster: EmbeddedKafkaCluster, db: PostgresConnection) async throws {
        let feeder = DemoIngestFeeder(port: ingestPort)
        let interval = 1.0 / Double(max(1, options.ratePerSecond))
        var gate = BacklogGate(
            bootstrapServers: cluster.bootstrapServers, group: Self.workerGroup, topic: FleetTopics.raw, partitions: options.partitions,
            perPartitionBudget: BacklogGate.budget(messageBytes: traffic.items.map(\.value.count).max() ?? 1))
        var start = ContinuousClock.now
        var lastDisplay = ContinuousClock.now
        for (i, item) in traffic.items.enumerated() {
            let due = start + .milliseconds(Int(Double(i) * interval * 1000))
            if due > .now { try await Task.sleep(until: due, clock: .continuous) }
            let waitStart = ContinuousClock.now
            try await gate.admit(published: i)
            // Time spent waiting for the workers shifts the schedule instead of causing a catch-up burst.
            start += ContinuousClock.now - waitStart
            try await feeder.submit(item.value)
            if ContinuousClock.now - lastDisplay > .milliseconds(500) {
                lastDisplay = .now
                await display(published: feeder.acknowledged.load(ordering: .relaxed), total: traffic.items.count, cluster: cluster, db: db)
            }
        }
        try await feeder.finish()
    }

    private func drain(expectedInputs: Int, cluster: EmbeddedKafkaCluster, db: PostgresConnection) async throws {
        let deadline = ContinuousClock.now + options.drainTimeout
        let admin = KafkaAdmin(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers, clientId: "fleet-demo-admin"))
        while ContinuousClock.now < deadline {
            await display(published: expectedInputs, total: expectedInputs, cluster: cluster, db: db)
            let raw = (try? await admin.consumerLag(groupId: Self.workerGroup, topics: [FleetTopics.raw])) ?? []
            let result = (try? await admin.consumerLag(groupId: Self.sinkGroup, topics: [FleetTopics.result])) ?? []
            let rawDone = !raw.isEmpty && raw.totalLag == 0 && raw.reduce(0, { $0 + $1.highWatermark }) >= Int64(expectedInputs)
            // The sink commits a batch's offsets only after its database transaction: no sink lag = all written.
            let produced = result.reduce(0) { $0 + $1.highWatermark }
            if rawDone && produced > 0 && result.totalLag == 0 {
                return
            }
            try await Task.sleep(for: .milliseconds(500))
        }
        throw DemoError("the pipeline did not drain within \(options.drainTimeout); see the logs in \(directory)")
    }

    /// Waits until the responder has read the whole result topic and settled every CONSUMPTION_REQUEST it recorded
    /// (answered, expired or failed: none pending or in flight).
    private func settleConsumption(cluster: EmbeddedKafkaCluster, db: PostgresConnection) async throws {
        let deadline = ContinuousClock.now + .seconds(60)
        let admin = KafkaAdmin(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers, clientId: "fleet-demo-admin"))
        while ContinuousClock.now < deadline {
            let lag = (try? await admin.consumerLag(groupId: Self.responderGroup, topics: [FleetTopics.result])) ?? []
            let open = try await count(db, "SELECT count(*) FROM consumption_answers WHERE state IN ('pending', 'sending')")
            if !lag.isEmpty && lag.totalLag == 0 && open == 0 { return }
            try await Task.sleep(for: .milliseconds(250))
        }
        throw DemoError("the responder did not settle every CONSUMPTION_REQUEST within 60 s; see \(directory)/responder.log")
    }

    /// The chaos soak's judgement, over the requests the responder recorded: each answered exactly once as the
    /// stand-in received it or expired unanswered, nothing else answered, none pending or refused.
    private func checkConsumption(_ s: Summary) throws {
        guard s.consumptionPassed else {
            throw DemoError("\(s.consumptionDetail); see \(directory)/responder.log")
        }
    }

    private func display(published: Int, total: Int, cluster: EmbeddedKafkaCluster, db: PostgresConnection) async {
        guard !options.quiet else { return }
        let admin = KafkaAdmin(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers, clientId: "fleet-demo-admin"))
        let raw = (try? await admin.consumerLag(groupId: Self.workerGroup, topics: [FleetTopics.raw])) ?? []
        let rejected = ((try? await admin.consumerLag(groupId: "fleet-demo-observer", topics: [FleetTopics.rejected])) ?? []).reduce(0) { $0 + $1.highWatermark }
        let processed = raw.reduce(Int64(0)) { $0 + ($1.committedOffset ?? 0) }
        let written = (try? await count(db, "SELECT count(*) FROM entitlement_events")) ?? 0
        let width = 24
        let filled = total == 0 ? 0 : min(width, published * width / total)
        let bar = String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled)
        let line = "[\(bar)] published \(published)/\(total)  verified \(max(0, processed - rejected))  rejected \(rejected)  events written \(written)  lag \(raw.totalLag)"
        print("\r" + line + "   ", terminator: "")
        fflush(nil)
    }

    // MARK: - Summary

    private func collect(into s: inout Summary, cluster: EmbeddedKafkaCluster, db: PostgresConnection) async throws {
        // Rejections by reason, from the rejected topic's headers.
        let consumer = try KafkaConsumer(
            configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers, clientId: "fleet-demo-summary"),
            groupId: "fleet-demo-summary-\(UUID().uuidString.prefix(6))", topics: [FleetTopics.rejected])
        let admin = KafkaAdmin(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers, clientId: "fleet-demo-admin"))
        let total = ((try? await admin.consumerLag(groupId: "fleet-demo-observer", topics: [FleetTopics.rejected])) ?? []).reduce(0) { $0 + $1.highWatermark }
        var seen = 0
        let deadline = ContinuousClock.now + .seconds(30)
        while seen < total && ContinuousClock.now < deadline {
            for m in try await consumer.nextBatch(maxMessages: 1000, timeout: .milliseconds(300)) {
                seen += 1
                let reason = m.headers.first { $0.key == FleetHeaders.reason }.map { String(decoding: $0.value, as: UTF8.self) } ?? "?"
                s.rejectedByReason[reason, default: 0] += 1
            }
        }
        _ = await consumer.close(deadline: .seconds(5))
        let raw = (try? await admin.consumerLag(groupId: Self.workerGroup, topics: [FleetTopics.raw])) ?? []
        s.processedInputs = Int(raw.reduce(Int64(0)) { $0 + ($1.committedOffset ?? 0) })
        s.eventsWritten = try await count(db, "SELECT count(*) FROM entitlement_events")
        s.staleEvents = try await count(db, "SELECT count(*) FROM entitlement_events WHERE status = 'stale'")
        for try await row in try await db.query("SELECT kind, count(*)::bigint FROM entitlement_events GROUP BY kind", logger: logger) {
            let (kind, n) = try row.decode((String, Int64).self)
            s.eventsByKind[kind] = Int(n)
        }
        for try await row in try await db.query("SELECT entitlement, count(*)::bigint FROM entitlements_current WHERE entitled_now GROUP BY entitlement", logger: logger) {
            let (name, n) = try row.decode((String, Int64).self)
            s.activeByEntitlement[name] = Int(n)
        }
        for try await row in try await db.query("SELECT product_id, sum(balance)::float8 FROM consumable_balances GROUP BY product_id", logger: logger) {
            let (product, balance) = try row.decode((String?, Double).self)
            s.ticketBalances[product ?? "?"] = balance
        }
        if options.responder {
            let rows = try await ConsumptionVerdict.rows(db, logger: logger)
            let calls = ConsumptionVerdict.answersByTransaction(appleAPI?.standIn.consumptionCalls ?? [])
            // No reference run here: what the responder recorded is what is judged (`fleet bench chaos` checks it
            // against the traffic too).
            let verdict = ConsumptionVerdict(expected: Set(rows.map(\.uuid)), rows: rows, calls: calls, responderKills: 0)
            s.consumptionByState = verdict.byState
            s.consumptionCalls = calls.values.reduce(0, +)
            s.consumptionPassed = verdict.passed
            s.consumptionDetail = verdict.detail
        }
    }

    private func printSummary(_ s: Summary) {
        guard !options.quiet else { return }
        let rejected = s.rejectedByReason.values.reduce(0, +)
        print("""

        == summary
        published      \(s.published) inputs in \(String(format: "%.1f", s.publishSeconds)) s (\(Int(Double(s.published) / max(0.001, s.publishSeconds)))/s)
        processed      \(s.processedInputs) inputs: \(s.processedInputs - rejected) verified, \(rejected) rejected
        """)
        for (reason, n) in s.rejectedByReason.sorted(by: { $0.value > $1.value }) {
            print("  rejected     \(pad(reason, 30)) \(n)")
        }
        print("events         \(s.eventsWritten) written to PostgreSQL (\(s.staleEvents) stale: older than what was already applied)")
        for (kind, n) in s.eventsByKind.sorted(by: { $0.value > $1.value }) {
            print("  \(pad(kind, 28)) \(n)")
        }
        print("active entitlements now")
        for (name, n) in s.activeByEntitlement.sorted(by: { $0.key < $1.key }) { print("  \(pad(name, 28)) \(n) subjects") }
        print("ticket balances (consumable ledger: credited once per transaction, refunds debited)")
        for (product, b) in s.ticketBalances.sorted(by: { $0.key < $1.key }) { print("  \(pad(product, 28)) \(Int(b)) units") }
        if options.responder {
            let requests = s.consumptionByState.values.reduce(0, +)
            print("consumption    \(requests) CONSUMPTION_REQUESTs recorded by fleet responder: \(s.consumptionByState["sent", default: 0]) answered once (Send Consumption Information, received by the App Store API stand-in: \(s.consumptionCalls)), \(s.consumptionByState["expired", default: 0]) expired (older than Apple's 12-hour window), \(s.consumptionByState["failed", default: 0]) refused")
        }
        print("total time     \(String(format: "%.1f", s.totalSeconds)) s")
    }

    private func printKeepRunning(cluster: EmbeddedKafkaCluster, pg: ThrowawayPostgres) {
        print("""

        == the stack keeps running (--keep-running)
        Kafka bootstrap servers:  \(cluster.bootstrapServers)
        PostgreSQL:               \(pg.url)
        Dashboard:                \(dashboardPort.map { "http://127.0.0.1:\($0)/" } ?? "-")
        Watch events:             \(options.executable) tail --bootstrap-servers \(cluster.bootstrapServers) --from-beginning
        Example queries (psql "\(pg.url)"):
          SELECT kind, effect, count(*) FROM entitlement_events GROUP BY 1, 2 ORDER BY 3 DESC;
          SELECT subject, entitlement, valid_until FROM entitlements_current WHERE entitled_now ORDER BY valid_until DESC LIMIT 10;
          SELECT subject, product_id, balance FROM consumable_balances ORDER BY balance DESC LIMIT 10;
          SELECT state, transaction_id, deadline_at, response_status FROM consumption_answers ORDER BY requested_at DESC;
        App Store API stand-in:   \(appleAPI?.standIn.baseURL ?? "-") (what fleet responder answers)
        Stop with Ctrl-C (SIGINT) or SIGTERM: every process stops cleanly.
        """)
        fflush(nil)
    }

    private func waitForInterrupt() async {
        let stream = AsyncStream<Int32> { continuation in
            for sig in [SIGINT, SIGTERM] {
                signal(sig, SIG_IGN)
                let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
                source.setEventHandler { continuation.yield(sig) }
                source.resume()
                Self.signalSources.append(source)
            }
        }
        for await _ in stream { break }
    }

    nonisolated(unsafe) static var signalSources: [any DispatchSourceSignal] = []

    // MARK: - Processes

    private func spawn(_ name: String, port: Int, _ arguments: [String]) throws {
        let p = try launch(name, arguments)
        children.append((name, p, port))
    }

    private func runToCompletion(_ arguments: [String], name: String) throws {
        let p = try launch(name, arguments)
        p.waitUntilExit()
        guard p.terminationStatus == 0 else {
            throw DemoError("fleet \(arguments[0]) failed (exit \(p.terminationStatus)); see \(directory)/\(name).log")
        }
    }

    /// Starts `fleet <arguments>` with stdout and stderr in `<directory>/<name>.log`, JSON logs, and no config file
    /// from the caller's environment (the demo passes every setting as a flag).
    private func launch(_ name: String, _ arguments: [String]) throws -> Process {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: options.executable)
        p.arguments = arguments
        let log = directory + "/\(name).log"
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: log))
        p.standardOutput = handle
        p.standardError = handle
        var env = ProcessInfo.processInfo.environment
        env["FLEET_CONFIG"] = nil
        env["FLEET_LOG_FORMAT"] = "json"
        p.environment = env
        try p.run()
        return p
    }

    private func waitReady(timeout: Duration) async throws {
        let deadline = ContinuousClock.now + timeout
        for c in children {
            while true {
                if !c.process.isRunning {
                    throw DemoError("\(c.name) exited with status \(c.process.terminationStatus); see \(directory)/\(c.name).log")
                }
                if HTTPProbe.get(port: c.port, path: "/readyz")?.status == 200 { break }
                if ContinuousClock.now > deadline { throw DemoError("\(c.name) not ready after \(timeout); see \(directory)/\(c.name).log") }
                try await Task.sleep(for: .milliseconds(200))
            }
        }
    }

    private func connect(_ url: String) async throws -> PostgresConnection {
        let config = try DatabaseURL(url).connectionConfiguration()
        return try await PostgresConnection.connect(configuration: config, id: 1, logger: logger)
    }

    private func count(_ db: PostgresConnection, _ sql: String) async throws -> Int {
        for try await row in try await db.query(PostgresQuery(unsafeSQL: sql), logger: logger) {
            return Int(try row.decode(Int64.self))
        }
        return 0
    }

    private func pad(_ s: String, _ n: Int) -> String { s.count >= n ? s : s + String(repeating: " ", count: n - s.count) }
}

public struct DemoError: Error, CustomStringConvertible {
    public var description: String
    public init(_ d: String) { description = d }
}

/// A thread-safe counter for delivery callbacks.
final class Counter: Sendable {
    private let v = Atomic<Int>(0)
    func add(_ n: Int) { v.add(n, ordering: .relaxed) }
    var value: Int { v.load(ordering: .relaxed) }
}

import Synchronization

extension Duration {
    var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
