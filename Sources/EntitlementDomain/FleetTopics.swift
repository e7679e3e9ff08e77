// The fleet's Kafka vocabulary: default topic names and record header names, in one place for every producer and
// reader (worker, sink, front door, dashboard, responder, demo, `fleet` commands, tests).

/// Default topic names. Every command's `--*-topic` default, the demo's and `fleet dev-kafka`'s topics.
public enum FleetTopics {
    /// Signed inputs byte for byte: written by `fleet ingest`, `fleet reconcile` and `fleet backfill`, read by workers.
    public static let raw = "appstore.raw"
    /// Entitlement events (`entitlement-event/v1`): written by workers; read by the sink, the dashboard, the
    /// responder and `fleet tail`.
    public static let result = "entitlements.verified"
    /// Inputs the workers refused: the input's bytes and key with the `FleetHeaders` of a rejection.
    public static let rejected = "appstore.rejected"
    /// Result records the sink refused: the record's bytes and key with the `FleetHeaders` of a rejection.
    public static let sinkRejected = "entitlements.sink-rejected"

    /// The four, in the order of the flow.
    public static let all = [raw, result, rejected, sinkRejected]
}

/// Record header names, by the topic whose records carry them.
public enum FleetHeaders {
    // MARK: raw topic

    /// The device whose `deviceVerification` the transaction must match (seeds: device check).
    public static let deviceVerificationId = "device-verification-id"
    /// The front door's endpoint that accepted the input.
    public static let ingestEndpoint = "ingest-endpoint"
    /// The `appAccountToken` an app sent with its transaction.
    public static let appAccountToken = "app-account-token"

    // MARK: result topic

    /// The event's `kind`.
    public static let eventKind = "event-kind"
    /// The event's `eventId`.
    public static let eventId = "event-id"

    // MARK: rejected topics (the worker's and the sink's)

    /// A `RejectionReason` code (worker) or an `EventDecodeFailure` reason (sink).
    public static let reason = "reason"
    /// What exactly was wrong, at most `maxDetailLength` characters.
    public static let detail = "detail"
    /// Where the refused record was read: topic, partition, offset.
    public static let sourceTopic = "source-topic"
    public static let sourcePartition = "source-partition"
    public static let sourceOffset = "source-offset"

    public static let maxDetailLength = 2000

    /// The headers of a result record: `event-kind`, `event-id`, each made by `header(name, value)` (the caller's
    /// header type, built directly: this runs for every event).
    public static func result<Header>(_ event: EntitlementEvent, _ header: (String, String) -> Header) -> [Header] {
        [header(eventKind, event.kind), header(eventId, event.eventId)]
    }

    /// The headers of a rejected record: `reason`, `detail` (cut to `maxDetailLength` characters), `source-topic`,
    /// `source-partition`, `source-offset`, each made by `header(name, value)`.
    public static func rejected<Header>(
        reason: String, detail: String, sourceTopic: String, sourcePartition: Int32, sourceOffset: Int64,
        _ header: (String, String) -> Header
    ) -> [Header] {
        [
            header(Self.reason, reason), header(Self.detail, String(detail.prefix(maxDetailLength))),
            header(Self.sourceTopic, sourceTopic), header(Self.sourcePartition, String(sourcePartition)),
            header(Self.sourceOffset, String(sourceOffset)),
        ]
    }
}
