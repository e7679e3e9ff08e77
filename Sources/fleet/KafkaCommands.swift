import ArgumentParser
import EntitlementDomain
import FleetDevStack
import FleetKafka
import FleetOperations
import Foundation
import Synchronization

// MARK: - shared options

struct KafkaConnectionOptions: ParsableArguments {
    @Option(name: .customLong("bootstrap-servers"), help: "Kafka bootstrap servers (host:port,...).")
    var bootstrapServers: String

    @Option(name: .customLong("kafka-property"), help: "librdkafka property key=value, passed through verbatim (repeatable).")
    var kafkaProperties: [String] = []

    @Option(name: .customLong("client-id"), help: "client.id")
    var clientId: String = "fleet"

    func configuration() throws -> KafkaConfiguration {
        let props: [String: String]
        do { props = try KafkaConfiguration.parseProperties(kafkaProperties) } catch {
            throw ValidationError(error.message)
        }
        return KafkaConfiguration(bootstrapServers: bootstrapServers, clientId: clientId, properties: props)
    }
}

/// SIGINT/SIGTERM as an async event (the default handlers are replaced while it lives).
final class TerminationSignal {
    private let sources: [any DispatchSourceSignal]
    private let stream: AsyncStream<Int32>
    private let flag = Flag()

    init() {
        let (stream, continuation) = AsyncStream.makeStream(of: Int32.self)
        self.stream = stream
        var sources: [any DispatchSourceSignal] = []
        let flag = self.flag
        for sig in [SIGINT, SIGTERM] {
            signal(sig, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
            source.setEventHandler {
                flag.set()
                continuation.yield(sig)
            }
            source.resume()
            sources.append(source)
        }
        self.sources = sources
    }

    var received: Bool { flag.value }

    /// Suspends until a termination signal arrives; returns it.
    func wait() async -> Int32 {
        for await sig in stream { return sig }
        return SIGTERM
    }

    final class Flag: Sendable {
        private let state = Mutex(false)
        func set() { state.withLock { $0 = true } }
        var value: Bool { state.withLock { $0 } }
    }
}

// MARK: - fleet dev-kafka

struct DevKafka: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dev-kafka",
        abstract: "Run an embedded Kafka-protocol cluster (librdkafka mock) for development and tests.",
        discussion: """
            Prints `bootstrap.servers=HOST:PORT,...` as the first stdout line, then runs until SIGINT/SIGTERM.
            Without --topic, the fleet's default topics are created. Data lives in memory only; no SASL/SSL; no
            CreateTopics API (topics come from --topic).

            Retention: librdkafka's mock keeps at most 5 MiB (and 100,000 message sets) per partition and deletes the
            oldest records beyond that, read or not; no setting raises it. Give topics enough partitions for the data
            they must hold (--partitions, or --expected-bytes to size them): a consumer group that falls behind
            deleted records finds its offsets gone (logged and counted as offset_reset by fleet's consumers). The
            cluster warns when a partition passes 80 % of the limit and logs an error when records are deleted.
            """
    )

    @Option(help: "Number of brokers.") var brokers: Int = 3
    @Option(help: "Partitions per topic (each retains at most 5 MiB: see --expected-bytes).") var partitions: Int = 6
    @Option(name: .customLong("expected-bytes"), help: "Bytes one topic must retain; raises --partitions to hold them at half the mock's per-partition limit.")
    var expectedBytes: Int?
    @Flag(name: .customLong("no-retention-watch"), help: "Do not watch partitions for the mock's retention limit.")
    var noRetentionWatch = false
    @Option(name: .customLong("replication-factor"), help: "Replication factor per topic (default: min(3, brokers)).")
    var replicationFactor: Int?
    @Option(name: .customLong("topic"), help: "Topic to create (repeatable).") var topics: [String] = []

    static let defaultTopics = FleetTopics.all

    func validate() throws {
        guard brokers >= 1 else { throw ValidationError("--brokers must be at least 1") }
        guard partitions >= 1 else { throw ValidationError("--partitions must be at least 1") }
        if let rf = replicationFactor, rf < 1 || rf > brokers {
            throw ValidationError("--replication-factor must be between 1 and --brokers")
        }
    }

    func run() async throws {
        let signals = TerminationSignal()
        let cluster = try EmbeddedKafkaCluster(brokers: brokers)
        let rf = replicationFactor ?? min(3, brokers)
        let names = topics.isEmpty ? Self.defaultTopics : topics
        let count = expectedBytes.map { EmbeddedKafkaRetentionWatch.partitions(forBytes: $0, minimum: partitions) } ?? partitions
        for topic in names {
            try cluster.createTopic(topic, partitions: count, replicationFactor: rf)
        }
        writeStdout("bootstrap.servers=\(cluster.bootstrapServers)")
        let capacity = count * EmbeddedKafkaRetentionWatch.partitionBytes / (1024 * 1024)
        writeStderr("embedded Kafka cluster: \(brokers) broker(s), topics \(names.joined(separator: ",")) with \(count) partition(s); each topic retains at most ~\(capacity) MiB (5 MiB per partition, oldest records deleted beyond that, read or not); Ctrl-C to stop")
        let watch = noRetentionWatch ? nil : try EmbeddedKafkaRetentionWatch(
            bootstrapServers: cluster.bootstrapServers, topics: Dictionary(uniqueKeysWithValues: names.map { ($0, count) }))
        let sig = await signals.wait()
        writeStderr("signal \(sig): shutting down the embedded cluster")
        watch?.stop()
        cluster.shutdown()
    }
}

// MARK: - fleet publish

enum PublishKeyField: String, ExpressibleByArgument, CaseIterable {
    case notificationUUID
    case transactionId
    case none
}

/// Input-line handling for `fleet publish` (kept apart for tests).
enum PublishInput {
    /// The bare JWS of a line: the line itself, or `signedPayload` of Apple's notification body. Nil for an
    /// empty line.
    static func jws(fromLine raw: String) -> String? {
        let line = raw.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !line.isEmpty else { return nil }
        if line.hasPrefix("{"),
           let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
           let signed = object["signedPayload"] as? String {
            return signed
        }
        return line
    }

    /// Decodes the payload (middle segment) of a compact JWS without verifying anything.
    static func payload(ofJWS jws: String) -> [String: Any]? {
        let parts = jws.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else { return nil }
        var b64 = parts[1].replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while b64.count % 4 != 0 { b64 += "=" }
        guard let data = Data(base64Encoded: b64) else { return nil }
        return (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
    }

    /// The message key for a JWS: `notificationUUID` of a notification, or `transactionId` of a transaction
    /// (for a notification: of its nested `data.signedTransactionInfo`).
    static func key(ofJWS jws: String, field: PublishKeyField) -> String? {
        guard field != .none, let payload = payload(ofJWS: jws) else { return nil }
        if let v = stringValue(payload[field.rawValue]) { return v }
        if field == .transactionId,
           let data = payload["data"] as? [String: Any],
           let nested = data["signedTransactionInfo"] as? String,
           let inner = Self.payload(ofJWS: nested),
           let v = stringValue(inner["transactionId"]) {
            return v
        }
        return nil
    }

    private static func stringValue(_ any: Any?) -> String? {
        switch any {
        case let s as String where !s.isEmpty: return s
        case let n as NSNumber: return n.stringValue
        default: return nil
        }
    }
}

struct Publish: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Publish JWS (one per line: bare JWS or Apple's {\"signedPayload\":...} body) to a Kafka topic.",
        discussion: """
            Every non-empty input line becomes one message whose value is the bare JWS. The key is read from the JWS
            payload without verification; a line whose key cannot be extracted is still sent, unkeyed, and counted.
            Waits for every delivery report; exits non-zero if any message failed.
            """
    )

    @OptionGroup var kafka: KafkaConnectionOptions
    @Option(help: "Topic to publish to.") var topic: String
    @Option(name: .customLong("key-field"), help: "Message key: notificationUUID, transactionId or none.")
    var keyField: PublishKeyField = .notificationUUID
    @Option(name: .customLong("flush-timeout-seconds"), help: "How long to wait for delivery reports.")
    var flushTimeoutSeconds: Int = 60
    @Flag(name: [.short, .long], help: "Also print where the messages went: messages and bytes per partition.")
    var verbose = false
    @Argument(help: "Input files (default or '-': standard input).") var inputs: [String] = []

    func run() async throws {
        let producer = try KafkaProducer(configuration: try kafka.configuration())
        let tally = PublishTally()
        var sent = 0
        var unkeyed = 0
        for input in inputs.isEmpty ? ["-"] : inputs {
            let lines: [String]
            if input == "-" {
                var read: [String] = []
                while let line = readLine(strippingNewline: true) { read.append(line) }
                lines = read
            } else {
                guard let data = FileManager.default.contents(atPath: input) else {
                    throw ValidationError("cannot read input file \(input)")
                }
                lines = String(decoding: data, as: UTF8.self).split(whereSeparator: \.isNewline).map(String.init)
            }
            for line in lines {
                guard let jws = PublishInput.jws(fromLine: line) else { continue }
                let key = PublishInput.key(ofJWS: jws, field: keyField)
                if key == nil && keyField != .none { unkeyed += 1 }
                let message = OutgoingMessage(topic: topic, key: key.map { Array($0.utf8) }, value: Array(jws.utf8))
                let size = message.value.count + (message.key?.count ?? 0)
                try producer.enqueue(message) { result in
                    tally.state.withLock { t in
                        switch result {
                        case .success(let report):
                            t.delivered += 1
                            t.placement[report.partition, default: (0, 0)].messages += 1
                            t.placement[report.partition, default: (0, 0)].bytes += size
                        case .failure(let e):
                            t.failed += 1
                            if t.firstError == nil { t.firstError = "\(e)" }
                        }
                    }
                }
                sent += 1
            }
        }
        let flushed = await producer.flush(deadline: .seconds(flushTimeoutSeconds))
        producer.close(timeout: .seconds(1))
        let t = tally.state.withLock { $0 }
        let missing = sent - t.delivered - t.failed
        writeStdout("delivered \(t.delivered) of \(sent) message(s) to \(topic) (\(unkeyed) unkeyed, \(t.failed + missing) failed)")
        if verbose {
            for (partition, p) in t.placement.sorted(by: { $0.key < $1.key }) {
                writeStdout("  partition \(partition): \(p.messages) message(s), \(p.bytes) bytes")
            }
        }
        if let e = t.firstError { writeStderr("first delivery error: \(e)") }
        if !flushed || t.failed > 0 || missing > 0 || t.delivered != sent { throw ExitCode(1) }
    }
}

final class PublishTally: Sendable {
    let state = Mutex((delivered: 0, failed: 0, firstError: String?.none,
                       placement: [Int32: (messages: Int, bytes: Int)]()))
}

// MARK: - fleet lag

struct Lag: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Consumer lag per partition (committed offset vs high watermark) and total.")

    @OptionGroup var kafka: KafkaConnectionOptions
    @Option(help: "Consumer group.") var group: String
    @Option(name: .customLong("topic"), help: "Topic (repeatable).") var topics: [String]
    @Flag(help: "Print one JSON object.") var json = false

    struct Report: Codable {
        var group: String
        var partitions: [PartitionLag]
        var total: Int64
        /// Partitions whose committed offset is below the low watermark: records the group never read were deleted.
        var outOfRange: [String]
    }

    func run() async throws {
        guard !topics.isEmpty else { throw ValidationError("give at least one --topic") }
        let admin = KafkaAdmin(configuration: try kafka.configuration())
        let lags = try await admin.consumerLag(groupId: group, topics: topics)
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            let data = try encoder.encode(Report(group: group, partitions: lags, total: lags.totalLag,
                                                 outOfRange: lags.filter(\.committedOutOfRange).map { "\($0.topic)[\($0.partition)]" }))
            writeStdout(String(decoding: data, as: UTF8.self))
        } else {
            writeStdout("TOPIC\tPARTITION\tCOMMITTED\tHIGH\tLAG")
            for l in lags {
                let note = l.committedOutOfRange ? "\tOUT OF RANGE: offsets \(l.committedOffset ?? 0)..<\(l.lowWatermark) deleted unread" : ""
                writeStdout("\(l.topic)\t\(l.partition)\t\(l.committedOffset.map(String.init) ?? "-")\t\(l.highWatermark)\t\(l.lag)\(note)")
            }
            writeStdout("total\t\(lags.totalLag)")
        }
    }
}

// MARK: - fleet consume (development / multi-process tests)

struct Consume: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Development consumer: joins a group and records `topic partition offset` per processed message.",
        discussion: """
            Each message is "processed" (optional delay), its line written (and flushed) to --output or stdout, and
            only then marked processed, so committed offsets never pass unrecorded work. Exits on SIGINT/SIGTERM
            (committing and leaving the group), after --max-messages, or after --idle-exit-seconds without messages.
            """
    )

    @OptionGroup var kafka: KafkaConnectionOptions
    @Option(help: "Consumer group.") var group: String
    @Option(name: .customLong("topic"), help: "Topic (repeatable).") var topics: [String]
    @Option(help: "Append processed-message lines to this file (default: stdout).") var output: String?
    @Option(name: .customLong("delay-ms"), help: "Artificial processing time per message.") var delayMs: Int = 0
    @Option(name: .customLong("max-messages")) var maxMessages: Int?
    @Option(name: .customLong("idle-exit-seconds")) var idleExitSeconds: Int?
    @Option(name: .customLong("session-timeout-ms")) var sessionTimeoutMs: Int = 10_000
    @Option(name: .customLong("heartbeat-interval-ms")) var heartbeatIntervalMs: Int = 1_000
    @Option(name: .customLong("batch-size")) var batchSize: Int = 100
    @Option(name: .customLong("close-deadline-seconds")) var closeDeadlineSeconds: Int = 10

    func run() async throws {
        guard !topics.isEmpty else { throw ValidationError("give at least one --topic") }
        let signals = TerminationSignal()
        var config = try kafka.configuration()
        config.sessionTimeoutMilliseconds = sessionTimeoutMs
        config.heartbeatIntervalMilliseconds = heartbeatIntervalMs
        let out: FileHandle
        if let output {
            if !FileManager.default.fileExists(atPath: output) {
                guard FileManager.default.createFile(atPath: output, contents: nil) else {
                    throw ValidationError("cannot create \(output)")
                }
            }
            guard let h = FileHandle(forWritingAtPath: output) else { throw ValidationError("cannot open \(output)") }
            h.seekToEndOfFile()
            out = h
        } else {
            out = .standardOutput
        }
        let consumer = try KafkaConsumer(configuration: config, groupId: group, topics: topics)
        var processed = 0
        var idleSince = ContinuousClock.now
        loop: while !signals.received {
            let batch = try await consumer.nextBatch(maxMessages: batchSize, timeout: .milliseconds(200))
            if batch.isEmpty {
                if let idle = idleExitSeconds, ContinuousClock.now - idleSince > .seconds(idle) { break }
                continue
            }
            idleSince = ContinuousClock.now
            for m in batch {
                if delayMs > 0 { try? await Task.sleep(for: .milliseconds(delayMs)) }
                out.write(Data("\(m.topic) \(m.partition) \(m.offset)\n".utf8))
                consumer.markProcessed(m)
                processed += 1
                if let max = maxMessages, processed >= max { break loop }
                if signals.received { break loop }
            }
        }
        let clean = await consumer.close(deadline: .seconds(closeDeadlineSeconds))
        writeStderr("consume: processed \(processed) message(s); close \(clean ? "completed" : "abandoned after the deadline")")
    }
}
