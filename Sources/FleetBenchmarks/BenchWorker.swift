import AppStoreVerification
import FleetDemo
import FleetDevStack
import FleetKafka
import FleetOperations
import FleetTestPKI
import Foundation

/// `fleet bench worker`: one worker process (all cores) against the embedded cluster on pre-produced notifications,
/// beside the single-thread verify-only rate measured in the same run.
public struct BenchWorker: Sendable {
    public init() {}

    public var inputs = 20_000

    public var verifySeconds = 3.0

    public var threads: Int?

    public func run() async throws {
        FleetLogging.bootstrap(format: "text", level: "warning")
        let fleet = currentExecutable()
        let cores = ProcessInfo.processInfo.activeProcessorCount
        // 1. The reference: single-thread verify-only notifications/s, measured now, on this machine.
        let reference = try VerifyBenchmark.run(seconds: verifySeconds, threads: 1)
        let verifyRate = reference.notifications_per_s

        // 2. Pre-produce notifications (outer + nested transaction + renewal info) to the embedded cluster.
        let pki = try TestPKI()
        let now = TestPayloads.nowMillis()
        let distinct = 2000
        var values: [[UInt8]] = []
        values.reserveCapacity(distinct)
        for k in 0..<distinct {
            let original = String(2_000_000_000_000_000 + k)
            let t = TestPayloads.transaction(transactionId: original, originalTransactionId: original, purchaseDate: now - 86_400_000, signedDate: now - 1000)
            let r = TestPayloads.renewalInfo(originalTransactionId: original, signedDate: now - 1000)
            values.append(Array(pki.signNotification(type: .didRenew, transaction: t, renewal: r, signedDate: now - 500).utf8))
        }
        // The mock cluster keeps ~5 MB per partition and deletes older data even if unread: spread the pre-produced
        // inputs over enough partitions that every one of them stays retained.
        let largest = values.map(\.count).max() ?? 1
        let partitions = max(6, Int((Double(inputs) * Double(largest) / (0.8 * Double(BacklogGate.mockPartitionBytes))).rounded(.up)))
        let cluster = try EmbeddedKafkaCluster(brokers: 1)
        defer { cluster.shutdown() }
        try cluster.createTopic("bench.raw", partitions: partitions)
        try cluster.createTopic("bench.result", partitions: partitions)
        try cluster.createTopic("bench.rejected", partitions: 1)
        let producer = try KafkaProducer(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers, clientId: "bench-publisher"))
        for i in 0..<inputs {
            // Spread evenly (explicit partition) so that no partition outgrows the mock's retention.
            try producer.enqueue(OutgoingMessage(topic: "bench.raw", key: Array(String(i % distinct).utf8), value: values[i % distinct],
                                                 partition: Int32(i % partitions))) { _ in }
        }
        guard await producer.flush(deadline: .seconds(60)) else { throw ValidationError("could not pre-produce the inputs") }
        producer.close()
        let retained = try await KafkaAdmin(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers, clientId: "bench-admin"))
            .consumerLag(groupId: "bench", topics: ["bench.raw"])
        guard retained.totalLag == Int64(inputs) else {
            throw ValidationError("the embedded cluster retained \(retained.totalLag) of \(inputs) inputs; lower --inputs")
        }
        print("pre-produced \(inputs) notifications of up to \(largest) bytes over \(partitions) partitions")
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("bench-root-\(UUID().uuidString.prefix(6)).der").path
        _ = FileManager.default.createFile(atPath: root, contents: Data(TestPKI.der(pki.root)))
        defer { try? FileManager.default.removeItem(atPath: root) }

        // 3. One worker process using every core.
        let port = Loopback.freePort()
        let p = Process()
        p.executableURL = URL(fileURLWithPath: fleet)
        p.arguments = [
            "worker", "--bootstrap-servers", cluster.bootstrapServers, "--group", "bench", "--input-topic", "bench.raw",
            "--result-topic", "bench.result", "--rejected-topic", "bench.rejected", "--root-certificate", root,
            "--bundle-id", TestPayloads.bundleId, "--environment", "Sandbox", "--metrics-port", String(port),
            "--threads", String(threads ?? cores), "--log-level", "warning", "--log-format", "text",
        ]
        let logPath = FileManager.default.temporaryDirectory.appendingPathComponent("bench-worker-\(UUID().uuidString.prefix(6)).log").path
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
        p.standardOutput = log
        p.standardError = log
        try p.run()
        defer { if p.isRunning { kill(p.processIdentifier, SIGTERM); p.waitUntilExit() } }

        func scrape() -> (inputs: Double, events: Double)? {
            guard let r = HTTPProbe.get(port: port, path: "/metrics"), r.status == 200 else { return nil }
            return (HTTPProbe.sumMetric(r.body, name: "fleet_worker_inputs_total")[""] ?? 0,
                    HTTPProbe.sumMetric(r.body, name: "fleet_worker_events_total")[""] ?? 0)
        }
        var started: ContinuousClock.Instant?
        var startCount = (inputs: 0.0, events: 0.0)
        var finished: (ContinuousClock.Instant, Double, Double)?
        let deadline = ContinuousClock.now + .seconds(300)
        while ContinuousClock.now < deadline, p.isRunning {
            if let s = scrape() {
                if started == nil && s.inputs > 0 { started = .now; startCount = s }
                if s.inputs >= Double(inputs) { finished = (.now, s.inputs, s.events); break }
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        guard let started, let finished else {
            throw ValidationError("the worker did not process every input (running: \(p.isRunning)); its log: \(logPath)")
        }
        try? FileManager.default.removeItem(atPath: logPath)  // kept only when the run failed (named above)
        let rssMB = peakRSSMegabytes(pid: p.processIdentifier)
        let seconds = (finished.0 - started).components
        let elapsed = Double(seconds.seconds) + Double(seconds.attoseconds) / 1e18
        let inputsPerS = (finished.1 - startCount.inputs) / elapsed
        let eventsPerS = (finished.2 - startCount.events) / elapsed
        print("worker: \(Int(inputsPerS)) notifications/s, \(Int(eventsPerS)) events/s on \(threads ?? cores) thread(s); peak RSS \(String(format: "%.1f", rssMB)) MB")
        print("reference: single-thread verify-only \(Int(verifyRate)) notifications/s (raw ES256 \(Int(reference.raw_es256_verifies_per_s))/s)")
        print("ratio: \(String(format: "%.2f", inputsPerS / verifyRate)) x single-thread verify (target >= 1.0); RSS target < 150 MB")
        let json: [String: Double] = [
            "inputs_per_s": inputsPerS.rounded(), "events_per_s": eventsPerS.rounded(),
            "verify_notifications_per_s_single_thread": verifyRate.rounded(), "rss_mb": (rssMB * 10).rounded() / 10,
        ]
        print(String(decoding: try JSONSerialization.data(withJSONObject: json, options: [.sortedKeys]), as: UTF8.self))
    }
}

/// Peak resident set size of a process (VmHWM), in MB.
func peakRSSMegabytes(pid: Int32) -> Double { processStatusMegabytes(pid: pid, field: "VmHWM:") }

/// A memory field of /proc/PID/status (given in kB there), in MB; -1 when unreadable.
func processStatusMegabytes(pid: Int32, field: String) -> Double {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return -1 }
    for line in status.split(separator: "\n") where line.hasPrefix(field) {
        let kb = line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first.flatMap { Double($0) } ?? -1
        return kb / 1024
    }
    return -1
}

/// This process's memory, for benchmarks that measure one phase of a run.
enum ProcessMemory {
    /// Returns freed heap memory to the system (glibc's `malloc_trim`), restarts the peak-RSS count (`VmHWM`, by
    /// writing 5 to /proc/self/clear_refs) and returns the resident set size from which it restarts, in MB.
    static func resetPeak() -> Double {
        typealias Trim = @convention(c) (Int) -> Int32
        if let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "malloc_trim") {
            _ = unsafeBitCast(symbol, to: Trim.self)(0)
        }
        try? "5".write(toFile: "/proc/self/clear_refs", atomically: false, encoding: .utf8)
        return processStatusMegabytes(pid: getpid(), field: "VmRSS:")
    }
}

/// The time a single-threaded process (a PostgreSQL backend) has spent runnable but waiting for a CPU so far
/// (/proc/PID/schedstat, its second field, in ns), in seconds; nil when unreadable (the process is gone, or the kernel
/// keeps no scheduler statistics).
func processRunQueueSeconds(pid: Int32) -> Double? {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/schedstat", encoding: .utf8) else { return nil }
    let fields = text.split(whereSeparator: { $0 == " " || $0 == "\n" })
    guard fields.count >= 2, let waited = UInt64(fields[1]) else { return nil }
    return Double(waited) / 1e9
}

/// The CPU time a process has used so far (user + system, /proc/PID/stat), in seconds; nil when unreadable (the
/// process is gone). Resolution: one clock tick (10 ms).
func processCPUSeconds(pid: Int32) -> Double? {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = stat.lastIndex(of: ")") else { return nil }
    // After the command's closing parenthesis: state is field 3, utime field 14, stime field 15.
    let fields = stat[stat.index(after: close)...].split(separator: " ", omittingEmptySubsequences: true)
    guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return nil }
    return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
}
