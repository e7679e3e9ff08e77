import AppStoreVerification
import EntitlementDomain
import FleetDevStack
import FleetIngest
import FleetIngestClient
import FleetKafka
import FleetOperations
import FleetTestPKI
import FleetWorker
import Foundation
import Logging
import ServiceLifecycle
import Synchronization

/// `fleet bench ingest`: acknowledged notifications/s of `fleet ingest` on loopback, with its same-run references.
public struct BenchIngest: Sendable {
    public init() {}

    public var seconds: Int = 10
    public var connections: Int = 64
    public var client = "auto"
    public var partitions: Int = 6
    /// librdkafka properties of the ingest's producer (e.g. linger.ms), applied over the service's own.
    public var kafkaProperties: [String: String] = [:]
    /// Which phases run.
    public enum Part: String, Sendable { case all, transactions, notifications }
    public var only: Part = .all

    public func run() async throws {
        // The log handler `fleet ingest` runs with by default (Hummingbird sets a request id in every request's logger
        // metadata, so the handler's cost is on every request). Bootstrapped before the service's logger is made, as
        // `fleet ingest` does: a Logger made before the bootstrap keeps swift-log's stream handler, whose metadata
        // setter formats every metadata value (until 2026-11-29 the benchmark's server ran with it).
        FleetLogging.bootstrap(format: "json", level: "warning")
        FleetMetrics.bootstrap()
        var logger = Logger(label: "fleet.bench.ingest")
        logger.logLevel = .warning
        let wrk = try resolveClient()
        let loadBefore = Self.loadAverage()
        let pki = try TestPKI()
        let cluster = try EmbeddedKafkaCluster(brokers: 1)
        let topic = "bench-raw"
        try cluster.createTopic(topic, partitions: partitions)
        _ = try await KafkaAdmin(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers)).waitForTopics([topic])
        let processor = InputProcessor(verifier: SignedDataVerifier(policy: try pki.policy()), mapper: EntitlementMapper())
        let config = IngestConfiguration(
            kafka: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers, clientId: "bench-ingest",
                                      properties: kafkaProperties), topic: topic,
            host: "127.0.0.1", port: 0, maxInFlight: 4096)
        let (ports, portStream) = AsyncStream.makeStream(of: Int.self)
        let service = try IngestService(configuration: config, processor: processor, readiness: Readiness(), logger: logger,
                                        onListening: { portStream.yield($0) })
        let group = ServiceGroup(configuration: .init(services: [service], gracefulShutdownSignals: [], logger: logger))
        let server = Task { try await group.run() }
        var port = 0
        for await p in ports { port = p; break }

        let notifications = (0..<512).map { _ in
            Array("{\"signedPayload\":\"\(pki.signNotification(type: .didRenew, transaction: TestPayloads.transaction()))\"}".utf8)
        }
        let transactions = (0..<512).map { _ in
            Array("{\"signedTransaction\":\"\(pki.sign(TestPayloads.transaction()))\"}".utf8)
        }
        let load = LoadRunner(port: port, connections: connections, seconds: seconds, wrk: wrk)
        func r(_ x: Double, _ places: Double = 10) -> Double { (x * places).rounded() / places }
        var out: [String: Any] = [
            "bench": "ingest", "client": wrk == nil ? "threads" : "wrk", "connections": connections, "seconds": seconds,
            "cores": ProcessInfo.processInfo.activeProcessorCount, "only": only.rawValue,
            "producer_properties": kafkaProperties.map { "\($0.key)=\($0.value)" }.sorted(),
        ]
        var checks: [String: Bool] = [:]
        if only != .transactions {
            let health = try await load.run(path: "/healthz", bodies: nil)
            let notes = try await load.run(path: "/apple/notifications", bodies: notifications)
            let halfRate = max(1, notes.perSecond / 2)
            let paced = try await load.paced(path: "/apple/notifications", bodies: notifications, ratePerSecond: halfRate)
            out.merge([
                "healthz_per_s": r(health.perSecond),
                "notifications_per_s": r(notes.perSecond), "notifications_p50_ms": r(notes.p50, 100), "notifications_p99_ms": r(notes.p99, 100),
                "notifications_non_200": notes.failures,
                "paced_rate_per_s": r(paced.perSecond), "paced_p50_ms": r(paced.p50, 100), "paced_p99_ms": r(paced.p99, 100),
                "paced_non_200": paced.failures,
            ]) { $1 }
            checks["notifications_target_met"] = notes.perSecond >= 5000 && notes.failures == 0
            checks["paced_p99_target_met"] = paced.p99 < 50 && paced.failures == 0
        }
        if only != .notifications {
            // The reference, single-thread verify, is interleaved with the phase: the phase runs as 1 s segments (wrk
            // restarted for each), with a 0.5 s reference before the first and after every segment (the same chain
            // cache). Each segment is held against the mean of the two references around it, so that a change of the
            // shared machine's speed moves both: here the machine's speed moves by up to 40 % within seconds, and one
            // reference before and one after a 5 s phase (until 2026-12-06) left the ratio to that noise.
            let workload = try VerifyBenchmark.Workload(), referenceCache = ChainCache()
            func reference() -> Double {
                VerifyBenchmark.transactionsPerSecond(workload: workload, seconds: 0.5, threads: 1, cache: referenceCache)
            }
            var references = [reference()]
            var segments: [LoadResult] = []
            var machineBusy = 0.0, processBusy = 0.0, machineIdle: [Double] = []
            for _ in 0..<max(1, seconds) {
                let machine = MachineCPU.sample(), process = processCPUSeconds(pid: getpid()) ?? 0
                segments.append(try await load.run(path: "/v1/transactions", bodies: transactions, seconds: 1))
                let machineEnd = MachineCPU.sample(), processEnd = processCPUSeconds(pid: getpid()) ?? 0
                machineBusy += MachineCPU.busySeconds(from: machine, to: machineEnd) ?? 0
                processBusy += processEnd - process
                if let idle = MachineCPU.idlePercent(from: machine, to: machineEnd) { machineIdle.append(idle) }
                references.append(reference())
            }
            let tx = TransactionsPhase(segments: segments, references: references)
            // CPU per acknowledged transaction in the segments: the whole machine's (server, mock cluster, wrk,
            // kernel), and this process's alone (the server with its verifier pool and producer, and the in-process
            // mock cluster). Throughput on a saturated machine is 2 cores / the first.
            let txRequests = max(1, tx.acknowledged)
            out.merge([
                "transactions_per_s": r(tx.perSecond), "transactions_p99_ms": r(tx.p99, 100), "transactions_non_200": tx.failures,
                "transactions_segments": segments.count,
                "transactions_segments_per_s": segments.map { r($0.perSecond) },
                "transactions_machine_cpu_us_per_request": r(machineBusy / txRequests * 1e6),
                "transactions_process_cpu_us_per_request": r(processBusy / txRequests * 1e6),
                "transactions_machine_idle_percent": machineIdle.isEmpty ? -1 : r(machineIdle.reduce(0, +) / Double(machineIdle.count)),
                "single_thread_verify_transactions_per_s": r(tx.reference),
                "single_thread_verify_before_after": [r(references.first!), r(references.last!)],
                "single_thread_verify_references": references.map { r($0) },
                "transactions_vs_single_thread_verify": r(tx.ratio, 1000),
            ]) { $1 }
            let txRatio = tx.ratio
            checks["transactions_target_met"] = txRatio >= 0.8 && tx.failures == 0
        }

        await group.triggerGracefulShutdown()
        _ = try? await server.value
        cluster.shutdown()
        // The machine is shared: its 1-minute load average before and after the run qualifies every figure.
        out["load_average_start"] = loadBefore
        out["load_average_end"] = Self.loadAverage()
        out["checks"] = checks
        let data = try JSONSerialization.data(withJSONObject: out, options: [.sortedKeys])
        print(String(decoding: data, as: UTF8.self))
    }

    static func loadAverage() -> Double {
        let text = (try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8)) ?? ""
        return Double(text.split(separator: " ").first ?? "") ?? -1
    }

    private func resolveClient() throws -> String? {
        let found = ["/usr/bin/wrk", "/usr/local/bin/wrk"].first { FileManager.default.isExecutableFile(atPath: $0) }
        switch client {
        case "threads": return nil
        case "wrk":
            guard let found else { throw ValidationError("wrk is not installed (apt-get install wrk)") }
            return found
        case "auto": return found
        default: throw ValidationError("--client must be auto, wrk or threads")
        }
    }
}

/// One phase's figures.
struct LoadResult {
    var perSecond: Double
    var p50: Double
    var p99: Double
    var failures: Int
    /// The phase's measured length in seconds.
    var seconds: Double
}

/// `/v1/transactions` in segments, each with the single-thread references measured right before and right after it
/// (`references` has one more element than `segments`).
struct TransactionsPhase {
    let segments: [LoadResult]
    let references: [Double]

    var acknowledged: Double { segments.reduce(0) { $0 + $1.perSecond * $1.seconds } }
    var duration: Double { segments.reduce(0) { $0 + $1.seconds } }
    var perSecond: Double { acknowledged / max(duration, 1e-9) }
    var failures: Int { segments.reduce(0) { $0 + $1.failures } }
    /// The slowest segment's p99 (wrk's percentiles cannot be merged).
    var p99: Double { segments.map(\.p99).max() ?? 0 }
    /// Single-thread verifications the same time would have given: each segment's length times the mean of the
    /// references around it.
    var expected: Double {
        zip(segments.indices, segments).reduce(0) { sum, s in
            sum + s.1.seconds * (references[s.0] + references[min(s.0 + 1, references.count - 1)]) / 2
        }
    }
    /// The reference rate over the segments' time.
    var reference: Double { expected / max(duration, 1e-9) }
    var ratio: Double { acknowledged / max(expected, 1) }
}

/// Drives the server with wrk (Lua script rotating the bodies) or with keep-alive threads.
struct LoadRunner {
    let port: Int
    let connections: Int
    let seconds: Int
    let wrk: String?

    /// Drives `path` for `seconds` (the runner's own length when nil).
    func run(path: String, bodies: [[UInt8]]?, seconds: Int? = nil) async throws -> LoadResult {
        let seconds = seconds ?? self.seconds
        if let wrk {
            // wrk blocks while it runs: on its own thread, never on the pool that serves the in-process server.
            let result: Result<LoadResult, any Error> = await withCheckedContinuation { c in
                Thread { c.resume(returning: Result { try self.runWrk(wrk, path: path, bodies: bodies, seconds: seconds) }) }.start()
            }
            return try result.get()
        }
        return try await runThreads(path: path, bodies: bodies, ratePerSecond: nil, seconds: seconds)
    }

    func paced(path: String, bodies: [[UInt8]], ratePerSecond: Double) async throws -> LoadResult {
        try await runThreads(path: path, bodies: bodies, ratePerSecond: ratePerSecond, seconds: seconds)
    }

    private func runThreads(path: String, bodies: [[UInt8]]?, ratePerSecond: Double?, seconds: Int) async throws -> LoadResult {
        let deadline = Date().addingTimeInterval(Double(seconds))
        let port = self.port
        let n = connections
        let results = await withTaskGroup(of: ([Double], Int, Int).self) { group in
            for t in 0..<n {
                group.addTask {
                    await withCheckedContinuation { (c: CheckedContinuation<([Double], Int, Int), Never>) in
                        let thread = Thread {
                            var lat: [Double] = []
                            var ok = 0, bad = 0, i = t
                            let interval = ratePerSecond.map { Double(n) / $0 }
                            var due = Date().addingTimeInterval(interval.map { $0 * Double(t) / Double(n) } ?? 0)
                            var conn: HTTPConnection?
                            while Date() < deadline {
                                if let interval {
                                    let wait = due.timeIntervalSinceNow
                                    if wait > 0 { Thread.sleep(forTimeInterval: wait) }
                                    due = due.addingTimeInterval(interval)
                                }
                                let began = DispatchTime.now().uptimeNanoseconds
                                do {
                                    if conn == nil || !conn!.isOpen { conn = try HTTPConnection(port: port) }
                                    let r: HTTPResult
                                    if let bodies { r = try conn!.postJSON(path, bodies[i % bodies.count]) } else { r = try conn!.request("GET", path) }
                                    if r.status == 200 { ok += 1 } else { bad += 1 }
                                } catch { bad += 1; conn = nil }
                                lat.append(Double(DispatchTime.now().uptimeNanoseconds - began) / 1e6)
                                i += n
                            }
                            c.resume(returning: (lat, ok, bad))
                        }
                        thread.start()
                    }
                }
            }
            var all: [([Double], Int, Int)] = []
            for await r in group { all.append(r) }
            return all
        }
        let lat = results.flatMap(\.0).sorted()
        let ok = results.reduce(0) { $0 + $1.1 }
        let bad = results.reduce(0) { $0 + $1.2 }
        func pct(_ p: Double) -> Double { lat.isEmpty ? 0 : lat[min(lat.count - 1, Int(Double(lat.count) * p))] }
        return LoadResult(perSecond: Double(ok) / Double(seconds), p50: pct(0.5), p99: pct(0.99), failures: bad,
                          seconds: Double(seconds))
    }

    private func runWrk(_ wrk: String, path: String, bodies: [[UInt8]]?, seconds: Int) throws -> LoadResult {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("fleet-bench-ingest-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        var lua = "local bodies = {\n"
        for b in bodies ?? [] { lua += "[==[" + String(decoding: b, as: UTF8.self) + "]==],\n" }
        lua += "}\nlocal i = 0\nlocal requests = {}\n"
        // Each body's request is formatted once, on its first use, and reused after, instead of a new string of the
        // whole request for every request: wrk's user CPU in a 5 s `/v1/transactions` phase 0.11-0.13 s instead of
        // 0.18-0.31 s (its system CPU, ~0.6 s, is the sockets'). The client shares the server's two cores.
        lua += bodies == nil ? "" : """
            wrk.method = "POST"
            wrk.headers["Content-Type"] = "application/json"
            request = function()
              i = i + 1
              local k = (i % #bodies) + 1
              local r = requests[k]
              if r == nil then
                r = wrk.format(nil, nil, nil, bodies[k])
                requests[k] = r
              end
              return r
            end

            """
        lua += """
            -- No response() callback: with one wrk parses every response's headers and body into Lua (slow); the
            -- summary already counts statuses >= 400 (and socket errors) in summary.errors.
            done = function(summary, latency, requests)
              io.write(string.format("FLEET %d %d %d %d %d\\n", summary.requests, summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout, latency:percentile(50), latency:percentile(99), summary.duration))
            end

            """
        let script = dir.appendingPathComponent("load.lua").path
        try lua.write(toFile: script, atomically: true, encoding: .utf8)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: wrk)
        p.arguments = ["-t", "2", "-c", String(connections), "-d", "\(seconds)s", "--timeout", "10s", "-s", script,
                       "http://127.0.0.1:\(port)\(path)"]
        let pipe = Pipe()
        p.standardOutput = pipe
        p.standardError = pipe
        try p.run()
        let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        guard let line = output.split(separator: "\n").first(where: { $0.hasPrefix("FLEET ") }) else {
            throw ValidationError("wrk printed no summary: \(output.prefix(500))")
        }
        let f = line.split(separator: " ").dropFirst().compactMap { Double($0) }
        guard f.count == 5, f[4] > 0 else { throw ValidationError("unreadable wrk summary: \(line)") }
        // requests, errors (non-2xx/3xx and socket errors), p50 us, p99 us, duration us
        let good = max(0, f[0] - f[1])
        return LoadResult(perSecond: good / (f[4] / 1e6), p50: f[2] / 1000, p99: f[3] / 1000, failures: Int(f[1]),
                          seconds: f[4] / 1e6)
    }
}
