import ArgumentParser
import FleetKafka
import Foundation
import Synchronization

/// `fleet bench kafka`: producer and consumer throughput of the FleetKafka wrapper through the embedded cluster,
/// and of `kcat` (same librdkafka, same cluster, same run) as the reference. The last stdout line is one JSON object.
struct BenchKafka: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "kafka",
        abstract: "Kafka produce/consume messages per second (wrapper vs kcat) through the embedded cluster."
    )

    @Option(help: "Messages per measurement.") var messages: Int = 200_000
    @Option(name: .customLong("value-size"), help: "Value size in bytes.") var valueSize: Int = 1024
    @Option(help: "Partitions of the benchmark topics.") var partitions: Int = 6
    @Option(help: "Brokers of the embedded cluster.") var brokers: Int = 3
    @Option(help: "kcat executable (skipped when not found).") var kcat: String = "kcat"
    @Flag(name: .customLong("no-kcat"), help: "Do not measure kcat.") var noKcat = false

    func validate() throws {
        guard messages >= 1000 else { throw ValidationError("--messages must be at least 1000") }
        guard valueSize >= 1 else { throw ValidationError("--value-size must be at least 1") }
        guard partitions >= 1, brokers >= 1 else { throw ValidationError("--partitions and --brokers must be >= 1") }
    }

    struct Result: Codable {
        var benchmark = "kafka"
        var messages: Int
        var value_bytes: Int
        var partitions: Int
        var produce_per_s: Double
        var consume_per_s: Double
        var kcat_produce_per_s: Double?
        var kcat_consume_per_s: Double?
        var produce_ratio: Double?
        var consume_ratio: Double?
    }

    func run() async throws {
        let cluster = try EmbeddedKafkaCluster(brokers: brokers)
        defer { cluster.shutdown() }
        let wrapperTopic = "bench.wrapper", kcatTopic = "bench.kcat"
        try cluster.createTopic(wrapperTopic, partitions: partitions, replicationFactor: 1)
        try cluster.createTopic(kcatTopic, partitions: partitions, replicationFactor: 1)
        var config = KafkaConfiguration(bootstrapServers: cluster.bootstrapServers, clientId: "fleet-bench")
        config.sessionTimeoutMilliseconds = 6000
        config.heartbeatIntervalMilliseconds = 500
        _ = try await KafkaAdmin(configuration: config).waitForTopics([wrapperTopic, kcatTopic])

        let produce = try await measureProduce(config: config, topic: wrapperTopic)
        writeStderr(String(format: "wrapper produce: %.0f msg/s", produce))
        let consume = try await measureConsume(config: config, topic: wrapperTopic)
        writeStderr(String(format: "wrapper consume: %.0f msg/s", consume))

        var result = Result(messages: messages, value_bytes: valueSize, partitions: partitions,
                            produce_per_s: produce.rounded(), consume_per_s: consume.rounded())
        if !noKcat, let kcatPath = Self.findExecutable(kcat) {
            let kp = try measureKcatProduce(kcatPath, bootstrap: cluster.bootstrapServers, topic: kcatTopic)
            writeStderr(String(format: "kcat produce: %.0f msg/s", kp))
            let kc = try measureKcatConsume(kcatPath, bootstrap: cluster.bootstrapServers, topic: wrapperTopic)
            writeStderr(String(format: "kcat consume: %.0f msg/s", kc))
            result.kcat_produce_per_s = kp.rounded()
            result.kcat_consume_per_s = kc.rounded()
            result.produce_ratio = (produce / kp * 1000).rounded() / 1000
            result.consume_ratio = (consume / kc * 1000).rounded() / 1000
        } else {
            writeStderr("kcat not measured (\(noKcat ? "--no-kcat" : "\(kcat) not found"))")
        }
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

    private func measureConsume(config: KafkaConfiguration, topic: String) async throws -> Double {
        let consumer = try KafkaConsumer(configuration: config, groupId: "fleet-bench-\(getpid())", topics: [topic])
        var got = 0
        var first: ContinuousClock.Instant?
        let giveUp = ContinuousClock.now + .seconds(60)
        while got < messages {
            let batch = try await consumer.nextBatch(maxMessages: 1000, timeout: .seconds(1))
            if batch.isEmpty {
                if ContinuousClock.now > giveUp { throw ValidationError("consume: only \(got) of \(messages) messages") }
                continue
            }
            if first == nil { first = ContinuousClock.now }
            got += batch.count
            consumer.markProcessed(batch)
        }
        let elapsed = ContinuousClock.now - (first ?? .now)
        await consumer.close(deadline: .seconds(5))
        // The first batch's messages arrived before the clock started: count only the rest.
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
                    "-l", file.path]
        let elapsed = try Self.time(kcat, args)
        return Double(messages) / elapsed
    }

    private func measureKcatConsume(_ kcat: String, bootstrap: String, topic: String) throws -> Double {
        let args = ["-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-c", String(messages), "-e", "-q"]
        return Double(messages) / (try Self.time(kcat, args))
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
