import FleetDevStack
import Foundation
import Synchronization
import Testing

@testable import FleetKafka

enum TestKafka {
    /// Consumer-group timings from docs/kafka-notes.md (the mock makes a joining member wait session.timeout - 1s).
    static func config(_ bootstrap: String) -> KafkaConfiguration {
        var c = KafkaConfiguration(bootstrapServers: bootstrap, clientId: "fleet-tests")
        c.sessionTimeoutMilliseconds = 6000
        c.heartbeatIntervalMilliseconds = 500
        c.autoCommitIntervalMilliseconds = 200
        return c
    }

    static func unique(_ prefix: String) -> String { "\(prefix)-\(UUID().uuidString.prefix(8).lowercased())" }

    /// A cluster with one topic, ready (metadata shows every partition led).
    static func cluster(brokers: Int = 3, topic: String, partitions: Int, replicationFactor: Int = 1) async throws
        -> EmbeddedKafkaCluster
    {
        let cluster = try EmbeddedKafkaCluster(brokers: brokers)
        try cluster.createTopic(topic, partitions: partitions, replicationFactor: replicationFactor)
        let counts = try await KafkaAdmin(configuration: config(cluster.bootstrapServers)).waitForTopics([topic])
        #expect(counts[topic] == partitions)
        return cluster
    }

    /// Produces `perPartition` messages to every partition with value "p:seq" and waits for every report.
    static func produceSequenced(_ bootstrap: String, topic: String, partitions: Int, perPartition: Int) async throws {
        let producer = try KafkaProducer(configuration: config(bootstrap))
        let counts = Counts()
        try await runOnThread {
            for seq in 0..<perPartition {
                for p in 0..<partitions {
                    try producer.enqueue(OutgoingMessage(topic: topic, key: Array("k\(p)".utf8),
                                                         value: Array("\(p):\(seq)".utf8), partition: Int32(p))) {
                        counts.record($0)
                    }
                }
            }
            producer.flush(timeout: .seconds(60))
        }
        producer.close()
        #expect(counts.ok == partitions * perPartition)
        #expect(counts.failures.isEmpty, "delivery failures: \(counts.failures.prefix(3))")
    }

    /// Consumes until `count` messages arrived or `timeout` passed; returns them in arrival order.
    static func consume(_ consumer: KafkaConsumer, count: Int, timeout: Duration = .seconds(30)) async throws -> [KafkaMessage] {
        var seen: [KafkaMessage] = []
        let deadline = ContinuousClock.now + timeout
        while seen.count < count, ContinuousClock.now < deadline {
            seen += try await consumer.nextBatch(maxMessages: 500, timeout: .milliseconds(500))
        }
        return seen
    }

    static func runOnThread(_ body: @escaping @Sendable () throws -> Void) async throws {
        let result: Result<Void, any Error> = await withCheckedContinuation { c in
            let t = Thread {
                do { try body(); c.resume(returning: .success(())) } catch { c.resume(returning: .failure(error)) }
            }
            t.start()
        }
        try result.get()
    }
}

final class Counts: Sendable {
    private let state = Mutex((ok: 0, failures: [KafkaError]()))
    func record(_ r: Result<DeliveryReport, KafkaError>) {
        state.withLock { s in
            switch r {
            case .success: s.ok += 1
            case .failure(let e): s.failures.append(e)
            }
        }
    }
    var ok: Int { state.withLock { $0.ok } }
    var failures: [KafkaError] { state.withLock { $0.failures } }
}

/// The built `fleet` executable, for multi-process tests.
enum FleetBinary {
    static let path: String? = {
        var candidates: [URL] = []
        // Next to the test bundle (…/.build/<triple>/debug/entitlement-fleetPackageTests.xctest).
        let bundle = Bundle.main.bundleURL
        candidates.append(bundle.deletingLastPathComponent().appendingPathComponent("fleet"))
        if let arg0 = CommandLine.arguments.first {
            let u = URL(fileURLWithPath: arg0)
            candidates.append(u.deletingLastPathComponent().appendingPathComponent("fleet"))
            candidates.append(u.deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("fleet"))
        }
        // Relative to this source file: <repo>/Tests/FleetKafkaTests/Support.swift -> <repo>/.build/debug/fleet
        let repo = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        candidates.append(repo.appendingPathComponent(".build/debug/fleet"))
        return candidates.map(\.path).first { FileManager.default.isExecutableFile(atPath: $0) }
    }()

    static var available: Bool { path != nil }

    struct Output {
        var status: Int32
        var stdout: String
        var stderr: String
    }

    /// Runs `fleet args...` to completion (killed after `timeout`).
    static func run(_ args: [String], timeout: Duration = .seconds(60)) async throws -> Output {
        let p = try start(args)
        let deadline = ContinuousClock.now + timeout
        while p.process.isRunning {
            if ContinuousClock.now > deadline {
                kill(p.process.processIdentifier, SIGKILL)
                Issue.record("fleet \(args.joined(separator: " ")) timed out")
                break
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        p.process.waitUntilExit()
        return Output(status: p.process.terminationStatus, stdout: p.readStdout(), stderr: p.readStderr())
    }

    final class Child: Sendable {
        let process: Process
        let stdoutPipe: Pipe
        let stderrFile: URL
        init(process: Process, stdoutPipe: Pipe, stderrFile: URL) {
            self.process = process
            self.stdoutPipe = stdoutPipe
            self.stderrFile = stderrFile
        }
        func readStdout() -> String { String(decoding: stdoutPipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self) }
        func readStderr() -> String {
            (try? String(contentsOf: stderrFile, encoding: .utf8)) ?? ""
        }
        /// Reads the first line of stdout (blocking read on a dedicated thread).
        func firstLine(timeout: Duration) async throws -> String? {
            let handle = stdoutPipe.fileHandleForReading
            let shot = Shot()
            let t = Thread {
                var bytes: [UInt8] = []
                while true {
                    let d = handle.readData(ofLength: 1)
                    if d.isEmpty || d.first == UInt8(ascii: "\n") { break }
                    bytes.append(contentsOf: d)
                }
                shot.fire(String(decoding: bytes, as: UTF8.self))
            }
            t.start()
            return await shot.wait(timeout: timeout)
        }
        func terminate(_ sig: Int32) { kill(process.processIdentifier, sig) }
        func waitExit(timeout: Duration) async -> Int32? {
            let deadline = ContinuousClock.now + timeout
            while process.isRunning {
                if ContinuousClock.now > deadline { return nil }
                try? await Task.sleep(for: .milliseconds(50))
            }
            return process.terminationStatus
        }
    }

    static func start(_ args: [String]) throws -> Child {
        guard let path else { throw CancellationError() }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: path)
        p.arguments = args
        let out = Pipe()
        p.standardOutput = out
        let errFile = FileManager.default.temporaryDirectory.appendingPathComponent("fleet-test-\(UUID().uuidString).err")
        FileManager.default.createFile(atPath: errFile.path, contents: nil)
        p.standardError = try FileHandle(forWritingTo: errFile)
        p.standardInput = FileHandle.nullDevice
        try p.run()
        return Child(process: p, stdoutPipe: out, stderrFile: errFile)
    }
}

final class Shot: Sendable {
    private let state = Mutex<(String?, Bool, CheckedContinuation<String?, Never>?)>((nil, false, nil))
    func fire(_ v: String?) {
        let c: CheckedContinuation<String?, Never>? = state.withLock { s in
            guard !s.1 else { return nil }
            s.1 = true
            s.0 = v
            defer { s.2 = nil }
            return s.2
        }
        c?.resume(returning: v)
    }
    func wait(timeout: Duration) async -> String? {
        Task.detached { [self] in
            try? await Task.sleep(for: timeout)
            self.fire(nil)
        }
        return await withCheckedContinuation { c in
            let now: (Bool, String?) = state.withLock { s in
                if s.1 { return (true, s.0) }
                s.2 = c
                return (false, nil)
            }
            if now.0 { c.resume(returning: now.1) }
        }
    }
}

final class Recorder<T: Sendable>: Sendable {
    private let state = Mutex<[T]>([])
    func append(_ v: T) { state.withLock { $0.append(v) } }
    var values: [T] { state.withLock { $0 } }
}
