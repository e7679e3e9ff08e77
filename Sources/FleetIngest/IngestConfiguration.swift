import EntitlementDomain
import FleetKafka
import NIOCore

/// Everything `fleet ingest` needs, resolved from config file < FLEET_* env < flags by the CLI.
public struct IngestConfiguration: Sendable {
    /// Producer settings. The service forces `enable.idempotence=true` (which implies acks=all) and sets
    /// `message.timeout.ms` to `publishTimeout`, so a message the broker cannot take in time fails with a report;
    /// `compression.type` defaults to zstd (a `--kafka-property` may set another).
    public var kafka: KafkaConfiguration
    /// The raw topic the workers consume.
    public var topic: String
    public var host: String
    /// Listening port; 0 picks a free one (tests, benchmarks); `IngestService.onListening` reports it.
    public var port: Int
    /// Apple's App Store Server Notifications V2 endpoint.
    public var notificationsPath: String
    /// The apps' and upstream services' endpoint (`signedTransaction` or `receipt-data`).
    public var transactionsPath: String
    /// Largest accepted request body; a larger one gets 413 and is not read past the bound.
    public var maxBodyBytes: Int
    /// Requests handled at once; beyond it 503 + Retry-After.
    public var maxInFlight: Int
    /// How long a request may wait for its delivery report before 503 + Retry-After.
    public var publishTimeout: Duration
    /// How long a client may take to send its whole body (slow clients get 408 and the connection is closed).
    public var requestTimeout: Duration
    /// A connection with nothing read for this long is closed.
    public var idleTimeout: Duration
    /// Seconds sent in `Retry-After` with a 503.
    public var retryAfterSeconds: Int
    /// Bearer token required on the transactions endpoint, when set. Never logged.
    public var apiToken: [UInt8]?
    /// SIGTERM: stop accepting, finish in-flight requests, flush the producer within this deadline.
    public var shutdownDeadline: Duration
    /// Threads verifying `/v1/transactions` (default: one per core).
    public var verifierThreads: Int = System.coreCount
    /// Event-loop threads of the HTTP server (default: one per core). Each connection's requests are handled on
    /// its own loop (`LoopBoundHTTP1Channel`): reading, routing, parsing, the Kafka hand-off and the answer;
    /// verification has its own pool. On 2 cores, two loops handling the requests instead of one loop handing them to
    /// the cooperative pool: `fleet bench ingest --seconds 5`, 9 alternated pairs, `/v1/transactions` 6,687-9,227/s
    /// (mean 7,334) against 5,908-7,774/s (mean 6,752), notifications 11,495-15,295/s against 9,634-12,420/s. One
    /// loop handling the requests was slower (4 pairs: 5,804-6,601/s against 6,577-7,363/s).
    public var eventLoopThreads: Int = IngestConfiguration.defaultEventLoopThreads

    /// One per core (`System.coreCount` follows the container's CPU quota).
    public static var defaultEventLoopThreads: Int { max(1, System.coreCount) }

    public init(
        kafka: KafkaConfiguration, topic: String = FleetTopics.raw, host: String = "0.0.0.0", port: Int = 8080,
        notificationsPath: String = "/apple/notifications", transactionsPath: String = "/v1/transactions",
        maxBodyBytes: Int = 64 * 1024, maxInFlight: Int = 1024, publishTimeout: Duration = .seconds(5),
        requestTimeout: Duration = .seconds(10), idleTimeout: Duration = .seconds(60), retryAfterSeconds: Int = 5,
        apiToken: [UInt8]? = nil, shutdownDeadline: Duration = .seconds(25)
    ) {
        self.kafka = kafka
        self.topic = topic
        self.host = host
        self.port = port
        self.notificationsPath = notificationsPath
        self.transactionsPath = transactionsPath
        self.maxBodyBytes = maxBodyBytes
        self.maxInFlight = maxInFlight
        self.publishTimeout = publishTimeout
        self.requestTimeout = requestTimeout
        self.idleTimeout = idleTimeout
        self.retryAfterSeconds = retryAfterSeconds
        self.apiToken = apiToken
        self.shutdownDeadline = shutdownDeadline
    }

    /// Checks the values that would otherwise fail obscurely at run time.
    public func validate() throws(IngestConfigurationError) {
        func fail(_ key: String, _ value: String, _ expected: String) -> IngestConfigurationError {
            IngestConfigurationError(key: key, value: value, expected: expected)
        }
        guard (0...65535).contains(port) else { throw fail("port", "\(port)", "0...65535") }
        for (key, path) in [("notifications-path", notificationsPath), ("transactions-path", transactionsPath)] {
            guard path.hasPrefix("/"), path.count > 1 else { throw fail(key, path, "an absolute path such as /apple/notifications") }
        }
        guard notificationsPath != transactionsPath else {
            throw fail("transactions-path", transactionsPath, "a path different from notifications-path")
        }
        guard maxBodyBytes >= 1024 else { throw fail("max-body-bytes", "\(maxBodyBytes)", "at least 1024") }
        guard maxInFlight >= 1 else { throw fail("max-in-flight", "\(maxInFlight)", "at least 1") }
        guard publishTimeout >= .milliseconds(100) else { throw fail("publish-timeout-ms", "\(publishTimeout)", "at least 100") }
        guard requestTimeout >= .seconds(1) else { throw fail("request-timeout-seconds", "\(requestTimeout)", "at least 1") }
        guard idleTimeout >= .seconds(1) else { throw fail("idle-timeout-seconds", "\(idleTimeout)", "at least 1") }
        guard retryAfterSeconds >= 1 else { throw fail("retry-after-seconds", "\(retryAfterSeconds)", "at least 1") }
        if let apiToken, apiToken.count < 16 { throw fail("api-token-file", "(a token of \(apiToken.count) bytes)", "a token of at least 16 bytes") }
        guard !topic.isEmpty else { throw fail("topic", topic, "a topic name") }
        guard (1...256).contains(verifierThreads) else { throw fail("verifier-threads", "\(verifierThreads)", "1...256") }
        guard (1...256).contains(eventLoopThreads) else { throw fail("event-loop-threads", "\(eventLoopThreads)", "1...256") }
    }

    /// The producer configuration actually used: idempotent (acks=all) with the publish deadline as message timeout.
    var producerConfiguration: KafkaConfiguration {
        var k = kafka
        k.idempotence = true
        let ms = Int(publishTimeout.components.seconds * 1000 + publishTimeout.components.attoseconds / 1_000_000_000_000_000)
        k.messageTimeoutMilliseconds = ms
        // No linger unless one is asked for: each request waits for its own delivery report, so time a message
        // spends waiting for company is latency every client pays, and with a bounded number of clients it caps the
        // rate (`fleet bench ingest`, 64 connections: 8,400 notifications/s with linger.ms=5, 13,000-16,000 with 0).
        // Messages still travel in batches under load: they queue while earlier requests are in flight.
        if k.properties["linger.ms"] == nil && k.properties["queue.buffering.max.ms"] == nil {
            k.lingerMilliseconds = 0
        }
        k.lingerMilliseconds = min(k.lingerMilliseconds, max(0, ms / 10))
        k.maxInFlightMessages = max(k.maxInFlightMessages, maxInFlight)
        // A deployment may override librdkafka defaults through properties, but never the delivery guarantee.
        k.properties["enable.idempotence"] = "true"
        k.properties["acks"] = "all"
        k.properties["message.timeout.ms"] = String(ms)
        // Apple's notifications are large (a real one with a transaction and a renewal info: 18.6 KB) and compress
        // well: zstd at level 1 takes that one to 11.7 KB alone and ten retries of it in one batch to 11.7 KB too, so
        // a partition holds more of them (the embedded cluster keeps only 5 MiB per partition, and retries of one
        // notification share its key and partition). Level 1 rather than zstd's default 3 (11.5 KB for both): at
        // level 3 compressing was ~40 % of the producer's broker thread (`fleet bench ingest`, 3 rotations:
        // transactions 0.634-0.660 x single-thread verify against 0.546-0.643, notifications 15,243-18,626/s against
        // 13,765-16,387). `--kafka-property compression.type=...` / `compression.level=...` choose otherwise.
        if k.properties["compression.type"] == nil && k.properties["compression.codec"] == nil {
            k.properties["compression.type"] = "zstd"
            if k.properties["compression.level"] == nil { k.properties["compression.level"] = "1" }
        }
        return k
    }
}

public struct IngestConfigurationError: Error, CustomStringConvertible, Sendable {
    public var key: String
    public var value: String
    public var expected: String
    public var description: String { "invalid value '\(value)' for \(key): expected \(expected)" }
}
