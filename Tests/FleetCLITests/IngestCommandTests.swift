import AppStoreVerification
import FleetDevStack
import FleetIngestClient
import FleetKafka
import FleetOperations
import FleetTestPKI
import FleetTestSupport
import Foundation
import Synchronization
import Testing

/// `fleet ingest` as a process with the documented flags, against an embedded cluster: the acceptance scenario
/// (300 concurrent notifications byte for byte, 400, 413, verified and forged transactions) and SIGTERM under load.
@Suite(.serialized)
struct IngestCommandTests {
    final class Accepted: Sendable {
        let bodies = Mutex<[[UInt8]]>([])
        let stop = Atomic<Bool>(false)
    }

    static func onThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await offPool(body)
    }

    static func readAll(_ bootstrap: String, _ topic: String, atLeast count: Int) async throws -> [KafkaMessage] {
        let config = KafkaConfiguration(bootstrapServers: bootstrap, clientId: "cli-test-reader", sessionTimeoutMilliseconds: 6000,
                                        heartbeatIntervalMilliseconds: 500)
        let consumer = try KafkaConsumer(configuration: config, groupId: "reader-\(UUID().uuidString.prefix(8))", topics: [topic])
        var out: [KafkaMessage] = []
        let deadline = ContinuousClock.now + .seconds(60)
        while out.count < count && ContinuousClock.now < deadline {
            out += try await consumer.nextBatch(maxMessages: 5000, timeout: .milliseconds(300))
        }
        // A little longer: anything extra would show too.
        out += try await consumer.nextBatch(maxMessages: 5000, timeout: .seconds(1))
        _ = await consumer.close(deadline: .seconds(5))
        return out
    }

    @Test("a bad thread count, from a flag or FLEET_*, is refused naming its key")
    func threadSettingsAreValidated() throws {
        var env = ProcessInfo.processInfo.environment
        env["FLEET_CONFIG"] = nil
        let base = ["ingest", "--bootstrap-servers", "127.0.0.1:1", "--root-certificate", "/nonexistent/root.der",
                    "--bundle-id", TestPayloads.bundleId, "--environment", "Sandbox"]
        for (flag, value) in [("--event-loop-threads", "0"), ("--verifier-threads", "0"), ("--event-loop-threads", "300")] {
            let out = try FleetBinary.run(base + [flag, value], environment: env)
            #expect(out.status != 0)
            #expect(out.stderr.contains("invalid value '\(value)' for \(flag.dropFirst(2))"), "\(out.stderr)")
        }
        var viaEnv = env
        viaEnv["FLEET_EVENT_LOOP_THREADS"] = "0"
        let out = try FleetBinary.run(base, environment: viaEnv)
        #expect(out.status != 0)
        #expect(out.stderr.contains("invalid value '0' for event-loop-threads"), "\(out.stderr)")
    }

    @Test func ingestProcessAcceptanceAndSigterm() async throws {
        guard let url = FleetBinary.url else {
            Issue.record("fleet executable not built")
            return
        }
        let cluster = try EmbeddedKafkaCluster(brokers: 1)
        let topic = "raw-cli"
        try cluster.createTopic(topic, partitions: 4)
        _ = try await KafkaAdmin(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers)).waitForTopics([topic])
        let pki = try TestPKI()
        let dir = try TemporaryFiles.directory("fleet-ingest-cli")
        let root = dir.appendingPathComponent("root.der").path
        _ = FileManager.default.createFile(atPath: root, contents: Data(pki.rootDER))
        let port = Loopback.freePort(), metrics = Loopback.freePort()
        let p = Process()
        p.executableURL = url
        p.arguments = ["ingest", "--bootstrap-servers", cluster.bootstrapServers, "--topic", topic, "--port", String(port),
                       "--root-certificate", root, "--bundle-id", TestPayloads.bundleId, "--environment", "Sandbox",
                       "--app-apple-id", String(TestPayloads.appAppleId), "--metrics-port", String(metrics), "--log-format", "text"]
        let log = dir.appendingPathComponent("ingest.log").path
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        p.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: log))
        p.standardError = p.standardOutput
        var env = ProcessInfo.processInfo.environment
        env["FLEET_CONFIG"] = nil
        p.environment = env
        try p.run()
        defer { if p.isRunning { kill(p.processIdentifier, SIGKILL) } }
        let ready = ContinuousClock.now + .seconds(60)
        while HTTPProbe.get(port: metrics, path: "/readyz")?.status != 200 {
            #expect(p.isRunning, "fleet ingest exited: \((try? String(contentsOfFile: log, encoding: .utf8)) ?? "")")
            guard p.isRunning, ContinuousClock.now < ready else { return }
            try await Task.sleep(for: .milliseconds(200))
        }

        // 300 notifications at once (16 connections).
        let bodies = (0..<300).map { _ in Array("{\"signedPayload\":\"\(pki.signNotification(type: .didRenew))\"}".utf8) }
        let statuses = try await withThrowingTaskGroup(of: [Int].self) { group in
            for t in 0..<16 {
                group.addTask {
                    try await Self.onThread {
                        let c = try HTTPConnection(port: port)
                        return try stride(from: t, to: bodies.count, by: 16).map { try c.postJSON("/apple/notifications", bodies[$0]).status }
                    }
                }
            }
            var all: [Int] = []
            for try await s in group { all += s }
            return all
        }
        #expect(statuses.count == 300 && statuses.allSatisfy { $0 == 200 }, "\(Dictionary(grouping: statuses, by: { $0 }).mapValues(\.count))")
        let onTopic = try await Self.readAll(cluster.bootstrapServers, topic, atLeast: 300)
        #expect(onTopic.count == 300)
        #expect(Set(onTopic.map(\.value)) == Set(bodies), "every notification on the topic byte for byte")

        // 300 retries of Apple's largest real notification (18.6 KB, one notificationUUID: one key, one partition):
        // uncompressed, more than the embedded cluster keeps per partition (5 MiB), so the oldest were deleted; the
        // producer's zstd keeps every one.
        var realCopies = 0
        let realPath = FleetBinary.shared.appendingPathComponent("fixtures/apple-real/3.jws").path
        if let real = FileManager.default.contents(atPath: realPath) {
            let jws = String(decoding: real, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            let body = Array("{\"signedPayload\":\"\(jws)\"}".utf8)
            let codes = try await withThrowingTaskGroup(of: [Int].self) { group in
                for t in 0..<16 {
                    group.addTask {
                        try await Self.onThread {
                            let c = try HTTPConnection(port: port)
                            return try stride(from: t, to: 300, by: 16).map { _ in try c.postJSON("/apple/notifications", body).status }
                        }
                    }
                }
                var all: [Int] = []
                for try await s in group { all += s }
                return all
            }
            #expect(codes.count == 300 && codes.allSatisfy { $0 == 200 }, "\(Dictionary(grouping: codes, by: { $0 }).mapValues(\.count))")
            let read = try await Self.readAll(cluster.bootstrapServers, topic, atLeast: 600)
            #expect(read.filter { $0.value == body }.count == 300, "every retry of the real notification on the topic")
            realCopies = 300
        }

        // Bad JSON, a 5 MiB body, a valid and a forged transaction.
        let valid = pki.sign(TestPayloads.transaction())
        let forged = try TestPKI.forged().sign(TestPayloads.transaction())
        let answers = try await Self.onThread { () -> [(Int, String)] in
            let c = try HTTPConnection(port: port)
            var out: [(Int, String)] = []
            let bad = try c.postJSON("/apple/notifications", Array("{\"signedPayload\": ".utf8))
            out.append((bad.status, bad.text))
            let big = try HTTPConnection(port: port).postJSON("/apple/notifications", [UInt8](repeating: 0x20, count: 5 * 1024 * 1024))
            out.append((big.status, big.text))
            for jws in [valid, forged] {
                let r = try c.postJSON("/v1/transactions", Array("{\"signedTransaction\":\"\(jws)\"}".utf8))
                out.append((r.status, r.text))
            }
            return out
        }
        #expect(answers.map(\.0) == [400, 413, 200, 422], "\(answers)")
        #expect(answers[2].1.contains("\"verdict\":\"verified\""))
        #expect(answers[3].1.contains("\"reason\":\"UNTRUSTED_CHAIN\""))

        // SIGTERM under load: every 200 is on the topic, the process exits 0.
        let accepted = Accepted()
        let load = Task {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<8 {
                    group.addTask {
                        try await Self.onThread {
                            var c: HTTPConnection?
                            while !accepted.stop.load(ordering: .relaxed) {
                                let body = Array("{\"signedPayload\":\"\(pki.signNotification(type: .didRenew))\"}".utf8)
                                do {
                                    if c == nil || !c!.isOpen { c = try HTTPConnection(port: port) }
                                    if try c!.postJSON("/apple/notifications", body).status == 200 {
                                        accepted.bodies.withLock { $0.append(body) }
                                    }
                                } catch {
                                    c = nil
                                    Thread.sleep(forTimeInterval: 0.05)
                                }
                            }
                        }
                    }
                }
                try await group.waitForAll()
            }
        }
        // SIGTERM once the load is flowing (on a loaded machine the first answers can take a while).
        let flowing = ContinuousClock.now + .seconds(60)
        while ContinuousClock.now < flowing, accepted.bodies.withLock({ $0.count }) < 20 {
            try await Task.sleep(for: .milliseconds(100))
        }
        kill(p.processIdentifier, SIGTERM)
        let exitBy = ContinuousClock.now + .seconds(40)
        while p.isRunning && ContinuousClock.now < exitBy { try await Task.sleep(for: .milliseconds(100)) }
        accepted.stop.store(true, ordering: .relaxed)
        try await load.value
        #expect(!p.isRunning, "fleet ingest did not exit after SIGTERM")
        if !p.isRunning { #expect(p.terminationStatus == 0, "\((try? String(contentsOfFile: log, encoding: .utf8))?.suffix(2000) ?? "")") }
        let acknowledged = accepted.bodies.withLock { $0 }
        #expect(!acknowledged.isEmpty)
        let after = Set(try await Self.readAll(cluster.bootstrapServers, topic, atLeast: 300 + realCopies + 2 + acknowledged.count).map(\.value))
        let missing = acknowledged.filter { !after.contains($0) }.count
        #expect(missing == 0, "\(missing) of \(acknowledged.count) acknowledged during shutdown are not on the topic")
    }
}
