import AppStoreVerification
import EntitlementDomain
import FleetKafka
import Foundation

enum TestPaths {
    static let repoRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// The built `fleet` executable (`make test` builds it before running the tests).
    static var fleet: String? {
        var candidates: [String] = []
        if let env = ProcessInfo.processInfo.environment["FLEET_EXECUTABLE"] { candidates.append(env) }
        candidates.append(URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("fleet").path)
        candidates.append(Bundle.main.bundleURL.deletingLastPathComponent().appendingPathComponent("fleet").path)
        candidates.append(repoRoot.appendingPathComponent(".build/debug/fleet").path)
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    static var eventSchema: String { repoRoot.appendingPathComponent("config/entitlement-event.schema.json").path }

    static func tempFile(_ name: String, _ bytes: [UInt8]) -> String {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("fleet-worker-tests-\(UUID().uuidString.prefix(8))")
        try? FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let path = dir.appendingPathComponent(name).path
        FileManager.default.createFile(atPath: path, contents: Data(bytes))
        return path
    }
}

/// Reads a topic from the beginning with a private group until at least `count` messages arrived, and then on until
/// everything the topic held at that moment was read (so duplicates after a crash cannot hide a missing message).
func readTopic(_ bootstrap: String, _ topic: String, atLeast count: Int, timeout: Duration = .seconds(60)) async throws -> [KafkaMessage] {
    let config = KafkaConfiguration(bootstrapServers: bootstrap, clientId: "test-reader", sessionTimeoutMilliseconds: 6000, heartbeatIntervalMilliseconds: 500)
    let group = "reader-\(UUID().uuidString.prefix(8))"
    let consumer = try KafkaConsumer(configuration: config, groupId: group, topics: [topic])
    var out: [KafkaMessage] = []
    let deadline = ContinuousClock.now + timeout
    while out.count < count && ContinuousClock.now < deadline {
        out += try await consumer.nextBatch(maxMessages: 5000, timeout: .milliseconds(300))
    }
    let held = try await KafkaAdmin(configuration: config).consumerLag(groupId: group, topics: [topic])
        .reduce(0) { $0 + Int($1.highWatermark - $1.lowWatermark) }
    let rest = ContinuousClock.now + .seconds(20)
    while out.count < held && ContinuousClock.now < rest {
        out += try await consumer.nextBatch(maxMessages: 5000, timeout: .milliseconds(300))
    }
    _ = await consumer.close(deadline: .seconds(5))
    return out
}

func header(_ m: KafkaMessage, _ key: String) -> String? {
    m.headers.last { $0.key == key }.map { String(decoding: $0.value, as: UTF8.self) }
}

/// Publishes values in order to one partition each (round robin by explicit partition) and returns their coordinates.
func publish(_ bootstrap: String, topic: String, partitions: Int32, values: [(value: [UInt8], headers: [KafkaHeader])]) async throws -> [InputRef] {
    let producer = try KafkaProducer(configuration: KafkaConfiguration(bootstrapServers: bootstrap, clientId: "test-publisher"))
    var refs: [InputRef] = []
    for (i, v) in values.enumerated() {
        let report = try await producer.send(OutgoingMessage(topic: topic, key: nil, value: v.value, headers: v.headers, partition: Int32(i) % partitions))
        refs.append(InputRef(partition: report.partition, offset: report.offset))
    }
    producer.close()
    return refs
}

struct InputRef: Hashable, Sendable {
    var partition: Int32
    var offset: Int64
}

final class ChildProcess {
    let process = Process()
    let log: String

    init(_ executable: String, _ arguments: [String]) throws {
        log = TestPaths.tempFile("child.log", [])
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: log))
        process.standardOutput = handle
        process.standardError = handle
        try process.run()
    }

    func kill(_ signal: Int32) { Foundation.kill(process.processIdentifier, signal) }

    /// Waits for exit up to `timeout`; returns the exit status, or nil if still running.
    func wait(timeout: Duration) async -> Int32? {
        let deadline = ContinuousClock.now + timeout
        while process.isRunning && ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(50)) }
        return process.isRunning ? nil : process.terminationStatus
    }

    var output: String { (try? String(contentsOfFile: log, encoding: .utf8)) ?? "" }

    deinit { if process.isRunning { Foundation.kill(process.processIdentifier, SIGKILL) } }
}
