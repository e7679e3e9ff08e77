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
import Synchronization

/// `fleet bench chaos`: the whole fleet (embedded 3-broker cluster, N `fleet worker` processes, `fleet sink`,
/// `fleet responder` answering a local App Store Server API stand-in, a throwaway PostgreSQL reached by the sink and
/// the responder through a `StallableProxy`) under steady demo traffic, while a seeded controller injects faults at
/// random intervals: SIGKILL + restart of a worker, the sink or the responder, a broker down and up, a PostgreSQL
/// restart, a stall of the database connections, the App Store Server API answering 503 for a few seconds. After the traffic and the faults, it waits until every lag is 0 and
/// checks that nothing was lost, nothing applied twice, no offset was reset and no CONSUMPTION_REQUEST was answered
/// twice or left unanswered without a kill to explain it (`ChaosChecks`).
public final class ChaosSoak: @unchecked Sendable {
    // Safety: the mutable state is used by `run()`'s task and the controller task it awaits; the publisher task only
    // touches `deliveries` (a Mutex) and `publishing` (an Atomic).

    public struct Options: Sendable {
        public var executable: String
        /// How long traffic flows and faults are injected.
        public var minutes = 5.0
        public var seed: UInt64 = 1
        /// Partitions of the raw and result topics.
        public var partitions = 16
        public var workers = 2
        /// Inputs per second (the traffic is generated to last `minutes` at this rate).
        public var rate = 40
        /// Seconds between two faults (uniform in this range).
        public var faultGap: ClosedRange<Double> = 3...8
        /// Longest stall of the sink's database connection, seconds (from 3 s; the sink's batch timeout is 30 s, so
        /// a longer stall exercises its time-out-and-reconnect path).
        public var maxStall = 8.0
        public var drainTimeout: Duration = .seconds(600)
        /// Keep the work directory (logs) even when every check passed.
        public var keepLogs = false
        public init(executable: String) { self.executable = executable }
    }

    public struct Report: Sendable, Codable {
        public var passed = false
        public var seed: UInt64 = 0
        public var minutes = 0.0
        public var partitions = 0
        public var workers = 0
        public var inputs = 0
        public var delivered = 0
        public var expected_verified_inputs = 0
        public var expected_rejected_inputs = 0
        public var expected_events = 0
        public var events_in_database = 0
        public var faults: [String: Int] = [:]
        public var faults_total = 0
        /// CONSUMPTION_REQUESTs recorded by the responder, by final state (`sent`, `expired`, ...).
        public var consumption: [String: Int] = [:]
        /// Consumption Information requests the App Store API stand-in received.
        public var consumption_calls = 0
        /// Consumption Information requests the stand-in refused (503 or 429, injected): each was answered again later.
        public var consumption_refusals = 0
        /// Of those, the ones refused inside an `api_down` window (the others: the two refused at the start).
        public var consumption_refusals_in_api_down = 0
        public var unexpected_exits = 0
        /// Children restarted because `/healthz` failed (a consumer stall outlasting twice its timeout).
        public var liveness_restarts = 0
        /// `consumer_stalled` error lines in the process logs (reported, not a failed check: the fleet said so loudly).
        public var consumer_stalls = 0
        /// From the end of the traffic and the last fault until every lag was 0.
        public var seconds_to_lag_zero: Double?
        public var total_seconds = 0.0
        public var checks: [String: Bool] = [:]
        public var directory = ""
    }

    enum Fault: String, CaseIterable {
        case killWorker = "kill_worker", killSink = "kill_sink", brokerDown = "broker_down"
        case restartPostgres = "restart_postgres", stallSink = "stall_sink_db", killResponder = "kill_responder"
        case appStoreAPIDown = "api_down"
    }

    let options: Options
    let logger: Logger
    var directory = ""
    var cluster: EmbeddedKafkaCluster?
    var postgres: ThrowawayPostgres?
    var proxy: StallableProxy?
    var workers: [ChaosChild] = []
    var sink: ChaosChild?
    var responder: ChaosChild?
    /// The App Store Server API stand-in the responder answers.
    var appleAPI: DemoAppStoreAPI?
    var report = Report()
    var trafficOptions = DemoTraffic.Options()
    let began = ContinuousClock.now
    /// Delivery report (partition, offset) of every published input, by index.
    let deliveries = Mutex<[Int: (Int32, Int64)]>([:])
    let publishing = Atomic<Bool>(true)
    var rng: ChaosRandom

    public init(options: Options, logger: Logger = Logger(label: "fleet.chaos")) {
        self.options = options
        self.logger = logger
        rng = ChaosRandom(state: options.seed &* 0x2545_F491_4F6C_DD1D &+ 7)
    }

    func say(_ s: String) {
        print(s)
        fflush(nil)
    }

    var clock: String { String(format: "t+%6.1fs", (ContinuousClock.now - began).seconds) }

    // MARK: - Run

    public func run() async throws -> Report {
        report.seed = options.seed
        report.minutes = options.minutes
        report.partitions = options.partitions
        report.workers = options.workers
        installInterruptHandler()
        do {
            let (traffic, pki) = try await start()
            try await soak(traffic)
            let checks = ChaosChecks(soak: self, traffic: traffic, pki: pki)
            try await checks.run()
        } catch {
            say("chaos      aborted: \(error)")
            report.checks["completed"] = false
        }
        report.passed = !report.checks.isEmpty && report.checks.values.allSatisfy { $0 }
        await stop()
        report.total_seconds = ((ContinuousClock.now - began).seconds * 10).rounded() / 10
        report.directory = directory
        if report.passed && !options.keepLogs {
            try? FileManager.default.removeItem(atPath: directory)
            report.directory = ""
        } else {
            say("logs       \(directory)")
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        say(String(decoding: try encoder.encode(report), as: UTF8.self))
        return report
    }

    // MARK: - Stack

    private func start() async throws -> (DemoTraffic, TestPKI) {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("fleet-chaos-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        say("== fleet bench chaos: seed \(options.seed), \(options.minutes) min, \(options.workers) workers, \(options.partitions) partitions (work directory \(directory))")

        let pki = try TestPKI()
        var trafficOptions = DemoTraffic.Options()
        trafficOptions.seed = options.seed
        // About 9 inputs per subscriber over six months, 3.5 per ticket buyer: sized to last `minutes` at `rate`.
        let target = max(100, Int(options.minutes * 60 * Double(options.rate)))
        trafficOptions.subscribers = max(10, target * 7 / 100)
        trafficOptions.ticketBuyers = max(5, target * 8 / 100)
        // The answerable CONSUMPTION_REQUESTs come throughout the soak, not in its last seconds, so `api_down` meets some.
        trafficOptions.spreadRecentRequests = true
        trafficOptions.recentRequests = max(4, trafficOptions.ticketBuyers / 5)
        let traffic = try DemoTraffic(pki: pki, options: trafficOptions)
        self.trafficOptions = trafficOptions
        report.inputs = traffic.items.count
        say("traffic    \(traffic.items.count) inputs (\(trafficOptions.subscribers) subscribers over 6 months, \(trafficOptions.ticketBuyers) ticket buyers, \(traffic.items.filter { $0.expectation != "valid" && $0.expectation != "replay" }.count) bad, \(traffic.items.filter { $0.expectation == "replay" }.count) replays)")

        let cluster = try EmbeddedKafkaCluster(brokers: 3)
        self.cluster = cluster
        try cluster.createTopic(FleetTopics.raw, partitions: options.partitions)
        try cluster.createTopic(FleetTopics.result, partitions: options.partitions)
        try cluster.createTopic(FleetTopics.rejected, partitions: 3)
        try cluster.createTopic(FleetTopics.sinkRejected, partitions: 1)
        say("kafka      embedded cluster, 3 brokers: \(cluster.bootstrapServers)")

        let pg = try await ThrowawayPostgres(database: "fleet", logger: logger)
        postgres = pg
        let calmURL = try await pg.createDatabase("fleet_calm", logger: logger)
        let proxy = try StallableProxy(upstreamPort: pg.port)
        self.proxy = proxy
        let proxiedURL = "postgres://\(pg.superuser)@127.0.0.1:\(proxy.port)/\(pg.database)"
        say("postgres   throwaway server \(pg.url) (the sink and the responder go through a stallable proxy on port \(proxy.port)); calm reference database fleet_calm")
        for (name, url) in [("migrate", pg.url), ("migrate-calm", calmURL)] {
            let m = ChaosChild(name: name, executable: options.executable, directory: directory) { _ in ["migrate", "--database-url", url] }
            try m.start()
            while m.isRunning { try await Task.sleep(for: .milliseconds(50)) }
            guard m.process?.terminationStatus == 0 else { throw DemoError("fleet migrate failed; see \(directory)/\(name).1.log") }
        }

        let rootPath = directory + "/test-root.der"
        _ = FileManager.default.createFile(atPath: rootPath, contents: Data(TestPKI.der(pki.root)))
        let productsPath = directory + "/products.yaml"
        try DemoTraffic.catalogueYAML.write(toFile: productsPath, atomically: true, encoding: .utf8)
        let bootstrap = cluster.bootstrapServers
        // A SIGKILLed member holds its partitions until its session times out: a short session keeps the soak moving.
        // A consumer stall (messages waiting, none delivered) is reported after 20 s and fails /healthz 40 s later;
        // the controller then restarts the process, as Kubernetes' liveness probe would.
        let common = ["--kafka-property", "session.timeout.ms=6000", "--kafka-property", "fetch.wait.max.ms=10",
                      "--shutdown-deadline-seconds", "10", "--stall-timeout-seconds", "20"]
        let t = trafficOptions
        for i in 0..<options.workers {
            workers.append(ChaosChild(name: "worker-\(i + 1)", executable: options.executable, directory: directory) { port in
                ["worker", "--bootstrap-servers", bootstrap, "--group", DemoRunner.workerGroup,
                 "--input-topic", FleetTopics.raw, "--result-topic", FleetTopics.result,
                 "--rejected-topic", FleetTopics.rejected, "--root-certificate", rootPath, "--bundle-id", t.bundleId,
                 "--environment", t.environment.rawValue, "--app-apple-id", String(t.appAppleId), "--products", productsPath,
                 "--metrics-port", String(port), "--threads", "1", "--kafka-property", "auto.commit.interval.ms=250"] + common
            })
        }
        sink = ChaosChild(name: "sink", executable: options.executable, directory: directory) { port in
            ["sink", "--bootstrap-servers", bootstrap, "--group", DemoRunner.sinkGroup, "--result-topic", FleetTopics.result,
             "--rejected-topic", FleetTopics.sinkRejected, "--database-url", proxiedURL, "--metrics-port", String(port)] + common
        }
        let api = try await DemoAppStoreAPI.start(directory: directory, bundleId: t.bundleId, environment: t.environment.rawValue)
        api.know(traffic)
        appleAPI = api
        responder = ChaosChild(name: "responder", executable: options.executable, directory: directory) { port in
            ["responder", "--bootstrap-servers", bootstrap, "--group", DemoRunner.responderGroup, "--result-topic", FleetTopics.result,
             "--database-url", proxiedURL, "--metrics-port", String(port), "--retry-interval-seconds", "1",
             "--kafka-property", "session.timeout.ms=6000", "--kafka-property", "fetch.wait.max.ms=10"] + api.responderArguments
        }
        for child in allChildren { try child.start() }
        let deadline = ContinuousClock.now + .seconds(120)
        for child in allChildren {
            while !child.isReady {
                guard child.isRunning else { throw DemoError("\(child.name) exited at start; see \(directory)/\(child.name).1.log") }
                guard ContinuousClock.now < deadline else { throw DemoError("\(child.name) not ready after 120 s") }
                try await Task.sleep(for: .milliseconds(200))
            }
        }
        say("processes  \(options.workers) workers + 1 sink + 1 responder ready (App Store Server API stand-in at \(api.standIn.baseURL); logs: \(directory)/<name>.<incarnation>.log)")
        return (traffic, pki)
    }

    var allChildren: [ChaosChild] { workers + [sink, responder].compactMap { $0 } }

    private var signalSources: [any DispatchSourceSignal] = []

    /// Ctrl-C or SIGTERM: kill every child, remove the throwaway database and exit 130, leaving nothing running.
    private func installInterruptHandler() {
        for sig in [SIGINT, SIGTERM] {
            signal(sig, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
            source.setEventHandler { [self] in
                say("chaos      interrupted: killing every process (logs: \(directory))")
                for child in allChildren where child.isRunning { kill(child.pid, SIGKILL) }
                proxy?.shutdown()
                postgres?.destroy()
                exit(130)
            }
            source.resume()
            signalSources.append(source)
        }
    }

    private func stop() async {
        for child in allChildren { await child.stop() }
        proxy?.shutdown()
        await appleAPI?.standIn.stop()
        appleAPI = nil
        postgres?.destroy()
        postgres = nil
        cluster?.shutdown()
        cluster = nil
    }

    // MARK: - Traffic and faults

    private func soak(_ traffic: DemoTraffic) async throws {
        guard let cluster else { throw DemoError("no cluster") }
        let window = Duration.milliseconds(Int(options.minutes * 60_000))
        say("chaos      traffic and faults for \(options.minutes) min (a fault every \(options.faultGap.lowerBound)-\(options.faultGap.upperBound) s, seed \(options.seed))")
        let soakStart = ContinuousClock.now
        // The first two answers are refused (503), so the responder's retry path runs in every soak.
        appleAPI?.standIn.failNext(2, status: 503, pathPrefix: AppleAPIStandIn.consumptionPathPrefix)
        let publisher = Task { try await self.publish(traffic, bootstrap: cluster.bootstrapServers, over: window) }
        var round: [Fault] = []
        while ContinuousClock.now - soakStart < window || publishing.load(ordering: .acquiring) {
            try await Task.sleep(for: .milliseconds(Int(rng.uniform(options.faultGap) * 1000)))
            try await restartUnexpectedExits()
            if !(ContinuousClock.now - soakStart < window || publishing.load(ordering: .acquiring)) { break }
            if round.isEmpty { round = rng.shuffled(Fault.allCases) }
            try await inject(round.removeFirst(), cluster: cluster)
        }
        report.delivered = try await publisher.value
        try await restartUnexpectedExits()
        let healed = ContinuousClock.now
        say("chaos      \(report.faults_total) faults injected; traffic done (\(report.delivered) of \(report.inputs) delivered); waiting for every lag to reach 0...")
        let drained = await drain(cluster: cluster)
        report.checks["lag_zero"] = drained
        if drained {
            let s = ((ContinuousClock.now - healed).seconds * 10).rounded() / 10
            report.seconds_to_lag_zero = s
            say("check      PASS  lag 0: workers, sink and responder at lag 0, \(s) s after the last fault")
        } else {
            say("check      FAIL  lag 0: not reached within \(options.drainTimeout)")
        }
    }

    private func inject(_ fault: Fault, cluster: EmbeddedKafkaCluster) async throws {
        report.faults[fault.rawValue, default: 0] += 1
        report.faults_total += 1
        let at = clock
        switch fault {
        case .killWorker, .killSink, .killResponder:
            let pickedWorker = workers[rng.pick(workers.count)]  // drawn for every kill: the seed's sequence stays as it was
            let target: ChaosChild? = switch fault {
            case .killSink: sink
            case .killResponder: responder
            default: pickedWorker
            }
            guard let child = target else { return }
            let pid = child.pid
            await child.kill9()
            let down = rng.uniform(0.5...3)
            try await Task.sleep(for: .milliseconds(Int(down * 1000)))
            let newPid = try child.start()
            say("fault      \(at)  kill -9 \(child.name) (pid \(pid)); restarted after \(String(format: "%.1f", down)) s as pid \(newPid)")
        case .brokerDown:
            let id = Int32(1 + rng.pick(cluster.brokerCount))
            let down = rng.uniform(2...6)
            try cluster.setBrokerDown(id)
            try await Task.sleep(for: .milliseconds(Int(down * 1000)))
            try cluster.setBrokerUp(id)
            say("fault      \(at)  broker \(id) down for \(String(format: "%.1f", down)) s, then up")
        case .restartPostgres:
            guard let pg = postgres else { return }
            let down = rng.uniform(1...3)
            try await offloaded { try pg.stop() }
            try await Task.sleep(for: .milliseconds(Int(down * 1000)))
            try await offloaded { try pg.start() }
            say("fault      \(at)  PostgreSQL stopped (fast shutdown), down \(String(format: "%.1f", down)) s, restarted")
        case .appStoreAPIDown:
            guard let api = appleAPI else { return }
            let down = rng.uniform(2...6)
            let refusedBefore = api.standIn.consumptionRefusals
            api.standIn.down(for: .milliseconds(Int(down * 1000)))
            try await Task.sleep(for: .milliseconds(Int(down * 1000)))
            let refused = api.standIn.consumptionRefusals - refusedBefore
            report.consumption_refusals_in_api_down += refused
            say("fault      \(at)  App Store Server API answered 503 to everything for \(String(format: "%.1f", down)) s (\(refused) consumption answer(s) refused)")
        case .stallSink:
            guard let proxy else { return }
            let stall = rng.uniform(3...max(3, options.maxStall))
            proxy.pause()
            try await Task.sleep(for: .milliseconds(Int(stall * 1000)))
            let held = proxy.openConnections
            proxy.resume()
            say("fault      \(at)  database connections (sink, responder) stalled for \(String(format: "%.1f", stall)) s (\(held) connection(s) held through the proxy)")
        }
    }

    /// A process that died without being killed is reported and started again.
    /// Restarts children that exited by themselves, and (like a liveness probe) children whose `/healthz` answers
    /// 503: a consumer stalled far past its timeout.
    private func restartUnexpectedExits() async throws {
        for child in allChildren where !child.isRunning {
            report.unexpected_exits += 1
            let status = child.process?.terminationStatus ?? -1
            let pid = try child.start()
            say("note       \(clock)  \(child.name) exited by itself (status \(status)); restarted as pid \(pid)")
        }
        for child in allChildren where child.isRunning {
            guard let probe = HTTPProbe.get(port: child.port, path: "/healthz"), probe.status == 503 else { continue }
            report.liveness_restarts += 1
            let old = child.pid
            kill(old, SIGKILL)
            await child.waitStopped()
            let pid = try child.start()
            say("note       \(clock)  \(child.name) not live (\(probe.body.split(separator: "\n").prefix(2).joined(separator: "; "))): killed pid \(old), restarted as pid \(pid)")
        }
    }

    /// Publishes every input at a steady rate spread over `window`, keeping the unconsumed backlog of the raw and
    /// result topics under the mock cluster's retention (`BacklogGate.budget`): the publisher waits while the
    /// workers or the sink are behind, as it would on a real topic with a retention limit.
    private func publish(_ traffic: DemoTraffic, bootstrap: String, over window: Duration) async throws -> Int {
        defer { publishing.store(false, ordering: .releasing) }
        let producer = try KafkaProducer(configuration: KafkaConfiguration(bootstrapServers: bootstrap, clientId: "fleet-chaos"))
        let admin = KafkaAdmin(configuration: KafkaConfiguration(bootstrapServers: bootstrap, clientId: "fleet-chaos-gate"))
        let budget = Int64(BacklogGate.budget(messageBytes: traffic.items.map(\.value.count).max() ?? 1))
        let failed = Counter()
        let interval = window.seconds / Double(max(1, traffic.items.count))
        var start = ContinuousClock.now
        for (i, item) in traffic.items.enumerated() {
            let due = start + .milliseconds(Int(Double(i) * interval * 1000))
            if due > .now { try await Task.sleep(until: due, clock: .continuous) }
            // Time spent waiting for room shifts the schedule instead of causing a catch-up burst.
            if i % 25 == 0 { start += try await waitForRoom(admin, published: i, budget: budget) }
            let message = OutgoingMessage(topic: FleetTopics.raw, key: item.key.map { Array($0.utf8) }, value: item.value)
            try producer.enqueue(message) { [self] result in
                switch result {
                case .success(let r): deliveries.withLock { $0[i] = (r.partition, r.offset) }
                case .failure: failed.add(1)
                }
            }
        }
        _ = await producer.flush(deadline: .seconds(300))
        await producer.close(deadline: .seconds(10))
        if failed.value > 0 { say("traffic    \(failed.value) inputs could not be delivered to Kafka") }
        return deliveries.withLock { $0.count }
    }

    /// Returns how long it waited beyond the first look (zero when there was room).
    private func waitForRoom(_ admin: KafkaAdmin, published: Int, budget: Int64) async throws -> Duration {
        let deadline = ContinuousClock.now + .seconds(300)
        var firstRefusal: ContinuousClock.Instant?
        while ContinuousClock.now < deadline {
            let undelivered = Int64(published - deliveries.withLock { $0.count })
            if let raw = try? await admin.consumerLag(groupId: DemoRunner.workerGroup, topics: [FleetTopics.raw]),
               let result = try? await admin.consumerLag(groupId: DemoRunner.sinkGroup, topics: [FleetTopics.result]),
               (raw.map(\.lag).max() ?? 0) + undelivered < budget, (result.map(\.lag).max() ?? 0) < budget {
                return firstRefusal.map { ContinuousClock.now - $0 } ?? .zero
            }
            if firstRefusal == nil { firstRefusal = .now }
            try await Task.sleep(for: .milliseconds(250))
        }
        throw DemoError("the workers and the sink made no room on the topics in 300 s")
    }

    /// Every input consumed by the workers, every event written by the sink (it commits a batch's offsets only after
    /// its database transaction) and read by the responder, seen twice in a row one second apart.
    private func drain(cluster: EmbeddedKafkaCluster) async -> Bool {
        let admin = KafkaAdmin(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers, clientId: "fleet-chaos-drain"))
        let deadline = ContinuousClock.now + options.drainTimeout
        var zeroes = 0
        var lastNote = ContinuousClock.now
        while ContinuousClock.now < deadline {
            try? await restartUnexpectedExits()
            let raw = (try? await admin.consumerLag(groupId: DemoRunner.workerGroup, topics: [FleetTopics.raw])) ?? []
            let result = (try? await admin.consumerLag(groupId: DemoRunner.sinkGroup, topics: [FleetTopics.result])) ?? []
            let answered = (try? await admin.consumerLag(groupId: DemoRunner.responderGroup, topics: [FleetTopics.result])) ?? []
            let rawDone = !raw.isEmpty && raw.totalLag == 0 && raw.reduce(0, { $0 + $1.highWatermark }) >= Int64(report.delivered)
            let resultDone = !result.isEmpty && result.totalLag == 0 && result.reduce(0, { $0 + $1.highWatermark }) > 0
            let responderDone = !answered.isEmpty && answered.totalLag == 0
            zeroes = rawDone && resultDone && responderDone ? zeroes + 1 : 0
            if zeroes >= 2 { return true }
            if ContinuousClock.now - lastNote > .seconds(15) {
                lastNote = .now
                say("drain      \(clock)  worker lag \(raw.isEmpty ? "?" : String(raw.totalLag)), sink lag \(result.isEmpty ? "?" : String(result.totalLag)), responder lag \(answered.isEmpty ? "?" : String(answered.totalLag))")
            }
            try? await Task.sleep(for: .seconds(1))
        }
        return false
    }
}
