import FleetDevStack
import FleetKafka
import FleetOperations
import Foundation
import Synchronization

/// `fleet bench kafka`: producer and consumer throughput of the FleetKafka wrapper through the embedded cluster,
/// and of `kcat` (same librdkafka, same cluster, same run) as the reference. The last stdout line is one JSON object.
public struct BenchKafka: Sendable {
    public init() {}

    public var messages: Int = 100_000
    public var valueSize: Int = 1024
    /// The librdkafka 2.0.2 mock keeps only ~5 MB per partition (older data is deleted), so the consume
    /// measurement needs enough partitions to retain every produced byte: 32 x ~3 MB for the defaults.
    public var partitions: Int = 32
    public var brokers: Int = 3
    public var kcat: String = "kcat"
    public var noKcat = false
    public var passes: Int = 3
    public var kafkaProperties: [String] = []

    struct Result: Codable {
        var benchmark = "kafka"
        var messages: Int
        var value_bytes: Int
        var partitions: Int
        var passes: Int
        var consumed_messages: Int
        var produce_per_s: Double
        var consume_per_s: Double
        var kcat_produce_per_s: Double?
        var kcat_consume_per_s: Double?
        var produce_ratio: Double?
        var consume_ratio: Double?
    }

    public func run() async throws {
        FleetLogging.bootstrap(format: "text", level: "warning")
        let cluster = try EmbeddedKafkaCluster(brokers: brokers)
        defer { cluster.shutdown() }
        let wrapperTopics = (0..<passes).map { "bench.wrapper.\($0)" }
        let kcatTopics = (0..<passes).map { "bench.kcat.\($0)" }
        for t in wrapperTopics + kcatTopics { try cluster.createTopic(t, partitions: partitions, replicationFactor: 1) }
        var config = KafkaConfiguration(bootstrapServers: cluster.bootstrapServers, clientId: "fleet-bench",
                                        properties: try KafkaConfiguration.parseProperties(kafkaProperties))
        config.sessionTimeoutMilliseconds = 6000
        config.heartbeatIntervalMilliseconds = 500
        _ = try await KafkaAdmin(configuration: config).waitForTopics(wrapperTopics + kcatTopics)
        let kcatPath = noKcat ? nil : Self.findExecutable(kcat)
        if kcatPath == nil { writeStderr("kcat not measured (\(noKcat ? "--no-kcat" : "\(kcat) not found"))") }

        // Interleaved passes (wrapper, then kcat) so both see the same machine load; the best pass of each counts.
        var produce: [Double] = [], kcatProduce: [Double] = []
        for pass in 0..<passes {
            produce.append(try await measureProduce(config: config, topic: wrapperTopics[pass]))
            if let kcatPath {
                kcatProduce.append(try measureKcatProduce(kcatPath, bootstrap: cluster.bootstrapServers, topic: kcatTopics[pass]))
            }
            writeStderr(String(format: "pass %d produce: wrapper %.0f msg/s, kcat %@ msg/s", pass + 1, produce.last ?? 0,
                               kcatProduce.last.map { String(format: "%.0f", $0) } ?? "-"))
        }
        // Consume what the cluster retained (all of it unless the ~5 MB/partition mock retention kicked in).
        let source = wrapperTopics[0]
        let retained = Int(try await KafkaAdmin(configuration: config)
            .consumerLag(groupId: "fleet-bench-none", topics: [source]).totalLag)
        if retained < messages {
            writeStderr("note: the embedded cluster retained \(retained) of \(messages) messages (mock keeps ~5 MB per partition); use more --partitions")
        }
        guard retained > 0 else { throw ValidationError("nothing retained to consume") }
        var consume: [Double] = [], kcatConsume: [Double] = []
        for pass in 0..<passes {
            consume.append(try await measureConsume(config: config, topic: source, count: retained, pass: pass))
            if let kcatPath {
                kcatConsume.append(try measureKcatConsume(kcatPath, bootstrap: cluster.bootstrapServers, topic: source, count: retained))
            }
            writeStderr(String(format: "pass %d consume: wrapper %.0f msg/s, kcat %@ msg/s", pass + 1, consume.last ?? 0,
                               kcatConsume.last.map { String(format: "%.0f", $0) } ?? "-"))
        }

        let best = { (xs: [Double]) -> Double? in xs.max().map { $0.rounded() } }
        var result = Result(messages: messages, value_bytes: valueSize, partitions: partitions, passes: passes,
                            consumed_messages: retained,
                            produce_per_s: best(produce) ?? 0, consume_per_s: best(consume) ?? 0)
        result.kcat_produce_per_s = best(kcatProduce)
        result.kcat_consume_per_s = best(kcatConsume)
        if let kp = result.kcat_produce_per_s, kp > 0 { result.produce_ratio = (result.produce_per_s / kp * 1000).rounded() / 1000 }
        if let kc = result.kcat_consume_per_s, kc > 0 { result.consume_ratio = (result.consume_per_s / kc * 1000).rounded() / 1000 }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        writeStdout(String(decoding: try encoder.encode(result), as: UTF8.self))
    }

    private func measureProduce(config: KafkaConfiguration, topic: String) async throws -> Double {
        let producer = try KafkaProducer(configuration: config)
        defer { producer.close(timeout: .seconds(5)) }
        let value = [UInt8](repeating: UInt8(ascii: "x"), count: valueSize)
        let counts = BenchCounts()
        let n = messages
        let start = ContinuousClock.now
        // The high-throughput path blocks when in-flight is full: run it on its own thread.
        let enqueueError: String? = await withCheckedContinuation { (c: CheckedContinuation<String?, Never>) in
            let thread = Thread {
                do {
                    for i in 0..<n {
                        try producer.enqueue(OutgoingMessage(topic: topic, key: Array(String(i).utf8), value: value)) { r in
                            counts.record(r)
                        }
                    }
                    producer.flush(timeout: .seconds(60))
                    c.resume(returning: nil)
                } catch {
                    c.resume(returning: "\(error)")
                }
            }
            thread.start()
        }
        let elapsed = ContinuousClock.now - start
        if let enqueueError { throw ValidationError("produce failed: \(enqueueError)") }
        let (ok, failed) = counts.value
        guard ok == n, failed == 0 else { throw ValidationError("produce: \(ok) delivered, \(failed) failed of \(n)") }
        return Double(n) / elapsed.seconds
    }

    private func measureConsume(config: KafkaConfiguration, topic: String, count: Int, pass: Int) async throws -> Double {
        let consumer = try KafkaConsumer(configuration: config, groupId: "fleet-bench-\(getpid())-\(pass)", topics: [topic])
        var got = 0
        var first: ContinuousClock.Instant?
        let giveUp = ContinuousClock.now + .seconds(60)
        while got < count {
            let batch = try await consumer.nextBatch(maxMessages: 1000, timeout: .seconds(1))
            if batch.isEmpty {
                if ContinuousClock.now > giveUp { throw ValidationError("consume: only \(got) of \(count) messages") }
                continue
            }
            if first == nil { first = ContinuousClock.now }
            got += batch.count
            consumer.markProcessed(batch)
        }
        let elapsed = ContinuousClock.now - (first ?? .now)
        await consumer.close(deadline: .seconds(5))
        return Double(got) / max(elapsed.seconds, 0.001)
    }

    private func measureKcatProduce(_ kcat: String, bootstrap: String, topic: String) throws -> Double {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("fleet-bench-kcat-\(getpid()).txt")
        defer { try? FileManager.default.removeItem(at: file) }
        var line = [UInt8](repeating: UInt8(ascii: "x"), count: valueSize)
        line.append(UInt8(ascii: "\n"))
        var data = Data(capacity: line.count * messages)
        for _ in 0..<messages { data.append(contentsOf: line) }
        try data.write(to: file)
        let args = ["-P", "-b", bootstrap, "-t", topic, "-X", "enable.idempotence=true", "-X", "linger.ms=5",
                    "-X", "queue.buffering.max.messages=\(messages + 1000)", "-X", "batch.num.messages=10000",
                    "-l", file.path] + kafkaProperties.flatMap { ["-X", $0] }
        let elapsed = try Self.time(kcat, args)
        return Double(messages) / elapsed
    }

    private func measureKcatConsume(_ kcat: String, bootstrap: String, topic: String, count: Int) throws -> Double {
        let args = ["-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-c", String(count), "-e", "-q"]
            + kafkaProperties.flatMap { ["-X", $0] }
        return Double(count) / (try Self.time(kcat, args))
    }

    static func time(_ executable: String, _ args: [String]) throws -> Double {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = args
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        let start = ContinuousClock.now
        try p.run()
        p.waitUntilExit()
        let elapsed = (ContinuousClock.now - start).seconds
        guard p.terminationStatus == 0 else {
            throw ValidationError("\(executable) \(args.joined(separator: " ")) exited with \(p.terminationStatus)")
        }
        return elapsed
    }

    static func findExecutable(_ name: String) -> String? {
        if name.contains("/") { return FileManager.default.isExecutableFile(atPath: name) ? name : nil }
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"
        for dir in path.split(separator: ":") {
            let candidate = "\(dir)/\(name)"
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        return nil
    }
}

private final class BenchCounts: Sendable {
    private let state = Mutex((ok: 0, failed: 0))
    func record(_ r: Swift.Result<DeliveryReport, KafkaError>) {
        state.withLock { s in
            if case .success = r { s.ok += 1 } else { s.failed += 1 }
        }
    }
    var value: (Int, Int) { state.withLock { ($0.ok, $0.failed) } }
}

extension Duration {
    var seconds: Double {
        let c = components
        return Double(c.seconds) + Double(c.attoseconds) / 1e18
    }
}
