import Logging

/// Client configuration shared by producer, consumer and admin.
///
/// Fleet defaults are applied first; `properties` (any librdkafka property, verbatim) are applied LAST, so a deployment
/// can override every default and add `security.protocol`, `sasl.*`, `ssl.*` etc. without code changes.
public struct KafkaConfiguration: Sendable {
    /// `bootstrap.servers`: comma-separated `host:port` list.
    public var bootstrapServers: String
    /// `client.id`.
    public var clientId: String
    /// librdkafka properties passed through verbatim and applied after all defaults.
    public var properties: [String: String]

    // MARK: producer
    /// `enable.idempotence` (acks=all, ordered, retried without duplicates). Default on.
    public var idempotence: Bool
    /// `linger.ms`.
    public var lingerMilliseconds: Int
    /// Bound on messages enqueued but not yet acknowledged by a delivery report (backpressure).
    public var maxInFlightMessages: Int
    /// `message.timeout.ms`: how long librdkafka keeps retrying a message before failing it with `_MSG_TIMED_OUT`.
    public var messageTimeoutMilliseconds: Int

    // MARK: consumer
    /// `session.timeout.ms`.
    public var sessionTimeoutMilliseconds: Int
    /// `heartbeat.interval.ms`.
    public var heartbeatIntervalMilliseconds: Int
    /// `max.poll.interval.ms`.
    public var maxPollIntervalMilliseconds: Int
    /// `auto.commit.interval.ms` (stored offsets are committed in the background at this interval and on close/revoke).
    public var autoCommitIntervalMilliseconds: Int
    /// `auto.offset.reset` for partitions without a committed offset: `earliest` (default) or `latest`.
    public var autoOffsetReset: String
    /// What to do when a committed position is out of range (records deleted before they were read); see
    /// `OffsetResetPolicy`. Under `earliest`/`latest` librdkafka's `auto.offset.reset` is that value for new groups too.
    public var offsetResetPolicy: OffsetResetPolicy
    /// Messages fetched by the poll thread and not yet handed to the application; the poll thread stops polling
    /// when this many are buffered (backpressure into librdkafka's own bounded fetch queue).
    ///
    /// librdkafka 2.0.2 trap: when its local fetch queue exceeds `queued.min.messages` (100000) or
    /// `queued.max.messages.kbytes` (65536), it backs off fetching that partition for a hard-coded ~1 s
    /// (configurable only from 2.2 as `fetch.queue.backoff.ms`). A consumer that falls behind therefore sees
    /// 1 s gaps; raise `queued.max.messages.kbytes` through `properties` if memory allows.
    public var maxBufferedMessages: Int
    /// Seconds an owned partition may have messages waiting (high watermark above its position) without delivering
    /// any, while the application takes what it is given, before the consumer reports a stall (`ConsumerStall`:
    /// error log, metrics, not ready, and not live after twice as long). 0 turns the watch off.
    public var stallTimeoutSeconds: Int = 0

    public init(
        bootstrapServers: String,
        clientId: String = "fleet",
        properties: [String: String] = [:],
        idempotence: Bool = true,
        lingerMilliseconds: Int = 5,
        maxInFlightMessages: Int = 100_000,
        messageTimeoutMilliseconds: Int = 300_000,
        sessionTimeoutMilliseconds: Int = 10_000,
        heartbeatIntervalMilliseconds: Int = 1_000,
        maxPollIntervalMilliseconds: Int = 300_000,
        autoCommitIntervalMilliseconds: Int = 1_000,
        autoOffsetReset: String = "earliest",
        offsetResetPolicy: OffsetResetPolicy = .fail,
        maxBufferedMessages: Int = 10_000
    ) {
        self.bootstrapServers = bootstrapServers
        self.clientId = clientId
        self.properties = properties
        self.idempotence = idempotence
        self.lingerMilliseconds = lingerMilliseconds
        self.maxInFlightMessages = maxInFlightMessages
        self.messageTimeoutMilliseconds = messageTimeoutMilliseconds
        self.sessionTimeoutMilliseconds = sessionTimeoutMilliseconds
        self.heartbeatIntervalMilliseconds = heartbeatIntervalMilliseconds
        self.maxPollIntervalMilliseconds = maxPollIntervalMilliseconds
        self.autoCommitIntervalMilliseconds = autoCommitIntervalMilliseconds
        self.autoOffsetReset = autoOffsetReset
        self.offsetResetPolicy = offsetResetPolicy
        self.maxBufferedMessages = maxBufferedMessages
    }

    /// Bounded consumer fetch settings for the fleet's long-running consumers (worker, sink) where an operator's
    /// `--kafka-property` does not set them. librdkafka 2.0.2's defaults pre-fetch up to 64 MB per consumer; 20 MB
    /// filled 128 KB per partition at a time keeps the process's memory bounded. When the local queue reaches its
    /// bound, librdkafka 2.0.2 stops fetching for up to a second; the consumer wakes it as soon as it has drained the
    /// queue (`ConsumerState.stalledFetchPositions`), so the bound no longer has to hold a second of input.
    public static let boundedFetchDefaults = [
        "queued.max.messages.kbytes": "20480", "max.partition.fetch.bytes": "131072", "fetch.max.bytes": "8388608",
    ]

    /// `properties` with `boundedFetchDefaults` added where absent; `requestBytes`, when given, is the default
    /// `fetch.max.bytes` instead of 8 MB (the worker's: a fetch response is held whole until its messages are parsed),
    /// `queueKilobytes` the default `queued.max.messages.kbytes` instead of 20 MB.
    public static func withBoundedFetch(
        _ properties: [String: String], requestBytes: Int? = nil, queueKilobytes: Int? = nil
    ) -> [String: String] {
        var defaults = boundedFetchDefaults
        if let requestBytes { defaults["fetch.max.bytes"] = String(requestBytes) }
        if let queueKilobytes { defaults["queued.max.messages.kbytes"] = String(queueKilobytes) }
        return properties.merging(defaults) { own, _ in own }
    }

    /// librdkafka properties whose values are secrets (passwords, keys, tokens): never printed.
    public static func isSecret(_ key: String) -> Bool {
        let k = key.lowercased()
        return ["password", "secret", "jaas", "token", ".key.pem", "ssl.key", "oauthbearer.config"].contains { k.contains($0) }
    }

    /// Parses `key=value` strings (as given to `--kafka-property`).
    public static func parseProperties(_ pairs: [String]) throws(KafkaError) -> [String: String] {
        var out: [String: String] = [:]
        for pair in pairs {
            guard let eq = pair.firstIndex(of: "="), eq != pair.startIndex else {
                throw .invalidArgument("librdkafka property '\(isSecret(pair) ? "<redacted>" : pair)' is not of the form key=value")
            }
            out[String(pair[..<eq])] = String(pair[pair.index(after: eq)...])
        }
        return out
    }

    func baseProperties() -> [(String, String)] {
        [("bootstrap.servers", bootstrapServers), ("client.id", clientId)]
    }

    func producerProperties() -> [(String, String)] {
        baseProperties() + [
            ("enable.idempotence", idempotence ? "true" : "false"),
            ("linger.ms", String(lingerMilliseconds)),
            ("message.timeout.ms", String(messageTimeoutMilliseconds)),
            // librdkafka's own queue must hold at least our in-flight bound.
            ("queue.buffering.max.messages", String(max(maxInFlightMessages + 1_000, 1_000))),
            ("batch.num.messages", "10000"),
        ] + overrides()
    }

    func consumerProperties(groupId: String) -> [(String, String)] {
        baseProperties() + [
            ("group.id", groupId),
            ("enable.auto.commit", "true"),
            ("enable.auto.offset.store", "false"),
            ("auto.commit.interval.ms", String(autoCommitIntervalMilliseconds)),
            ("auto.offset.reset", offsetResetPolicy == .fail ? autoOffsetReset : offsetResetPolicy.rawValue),
            ("session.timeout.ms", String(sessionTimeoutMilliseconds)),
            ("heartbeat.interval.ms", String(heartbeatIntervalMilliseconds)),
            ("max.poll.interval.ms", String(maxPollIntervalMilliseconds)),
            ("enable.partition.eof", "false"),
        ] + overrides()
    }

    /// Properties for short-lived admin/metadata handles.
    func adminProperties(groupId: String? = nil) -> [(String, String)] {
        var props = baseProperties()
        if let groupId { props.append(("group.id", groupId)) }
        // Pass through only what is relevant to connecting (security etc.) and anything the user set explicitly.
        return props + overrides()
    }

    private func overrides() -> [(String, String)] {
        properties.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
    }
}
