import Foundation
import Metrics

/// How the sink writes: the database, the size of its transactions, its retries.
public struct SinkConfiguration: Sendable {
    public var databaseURL: DatabaseURL
    /// The most events in one database transaction. With `batchTarget` the sink sizes its batches below this bound
    /// (`BatchSizing`); without it, every batch takes up to this many.
    public var maxBatchSize: Int
    /// The time one batch should take (nil: fixed batches of `maxBatchSize`). While the backlog fills its batches and
    /// they finish well within this time, the sink takes more events per transaction (up to `maxBatchSize`); a batch
    /// that takes longer makes the next ones smaller.
    public var batchTarget: Duration?
    public var initialBackoff: Duration
    public var maxBackoff: Duration
    /// A batch still unfinished after this long is abandoned (connection closed, retried).
    public var batchTimeout: Duration

    /// The most events per database transaction unless configured otherwise: the bound of `BatchSizing`, which
    /// starts at `initialBatchSize`. Fixed batches of 4,000 on a machine where one of 1,500 took ~60 ms: 0.577-0.596 x
    /// COPY against 0.479-0.551 x (`fleet bench sink --batch-size 4000`, fixed batches then, 2026-11-28), p99 batch
    /// 134-159 ms, RSS 157-166 MB; on a machine where 1,500 took ~140 ms, 3,000 gained nothing and its p99 batch was
    /// 329 ms: hence a bound that the batch time decides, not a larger fixed size.
    public static let defaultMaxBatchSize = 4000
    /// Where `BatchSizing` starts (and the fixed size until 2026-11-29): on the slower machines measured, batches of
    /// 1,500 took 140-220 ms, 2,000 had a p99 over 250 ms, 1,000 was slower.
    public static let initialBatchSize = 1500
    /// The batch time `BatchSizing` keeps under unless configured otherwise: batches sized to take ~120 ms (80 % of
    /// it) leave room for the ~1.5 x spread between p50 and p99 batch times measured on the slow machine under the
    /// 250 ms p99 target of `fleet bench sink`.
    public static let defaultBatchTarget: Duration = .milliseconds(defaultBatchTargetMilliseconds)
    public static let defaultBatchTargetMilliseconds = 150

    public init(
        databaseURL: DatabaseURL, maxBatchSize: Int = SinkConfiguration.defaultMaxBatchSize,
        batchTarget: Duration? = SinkConfiguration.defaultBatchTarget, initialBackoff: Duration = .milliseconds(100),
        maxBackoff: Duration = .seconds(5), batchTimeout: Duration = .seconds(30)
    ) {
        self.batchTimeout = batchTimeout
        self.databaseURL = databaseURL
        self.maxBatchSize = maxBatchSize
        self.batchTarget = batchTarget
        self.initialBackoff = initialBackoff
        self.maxBackoff = maxBackoff
    }
}

/// How many events the sink takes into its next transaction. A transaction has a fixed cost (statements parsed and
/// planned, the COPYs' set-up, the round trips between the batch's phases), so larger batches write more events per
/// second; but a batch's records wait for its whole transaction, so batches must stay short enough for the latency
/// they add. With a target, the size follows the time per record of the full batches (a moving average): the next
/// batch is sized to take ~80 % of the target, growing by at most a quarter per batch; a batch over the target cuts
/// the size at once to what it would have fitted into the target. Never over `maximum`, never under `minimum`: the
/// initial size, the fixed size before. Under it, shrinking hurt: where PostgreSQL shares the machine's cores with
/// the workers (`fleet bench pipeline` on 2 cores), batches take long because the CPU is busy, not because they are
/// large, and smaller ones only pay the fixed cost more often (one pair, a floor of 100 against fixed batches of 1,500:
/// 2,214 against 2,442 notifications/s, p99 publish -> row at 2,000/s 3,193 against 1,033 ms).
/// Without a target: always `maximum`.
struct BatchSizing: Sendable {
    let maximum: Int
    let minimum: Int
    let target: Duration?
    /// The most records the next batch takes.
    private(set) var current: Int
    /// `current` before the last `record`: the sink gathers each batch while the one before it is written, so the
    /// batch recorded was taken with this limit.
    private var previous: Int
    /// The time per record of the full batches, a moving average (nil: none yet).
    private var perRecord: Duration?

    init(maximum: Int, target: Duration?, initial: Int = SinkConfiguration.initialBatchSize) {
        self.maximum = max(1, maximum)
        self.minimum = min(self.maximum, initial)
        self.target = target.flatMap { $0 > .zero ? $0 : nil }
        current = self.target == nil ? self.maximum : minimum
        previous = current
    }

    init(_ configuration: SinkConfiguration) {
        self.init(maximum: configuration.maxBatchSize, target: configuration.batchTarget)
    }

    /// Adjusts `current` after a batch of `records` that took `duration`.
    mutating func record(records: Int, duration: Duration) {
        guard let target, records > 0 else { return }
        let full = records >= min(previous, current)
        previous = current
        let load = duration / target
        if load > 1 {
            current = max(minimum, min(current, Int(Double(records) / load)))
        }
        // Only full batches tell the time per record: a small one is mostly the transaction's fixed cost.
        guard full else { return }
        let sample = duration / records
        perRecord = perRecord.map { $0 * 0.7 + sample * 0.3 } ?? sample
        guard load <= 1, let perRecord, perRecord > .zero else { return }
        let fits = Int(min(0.8 * (target / perRecord), Double(maximum)))
        current = min(maximum, max(minimum, min(fits, current + current / 4)))
    }
}

/// Why a record went to the sink-rejected topic.
public enum SinkRejection: String, Sendable {
    /// The value is not an `EntitlementEvent` JSON document.
    case undecodable
    /// `schema` is not `entitlement-event/v1`.
    case unsupportedSchema = "unsupported_schema"
    /// Decoded, but a required field is empty.
    case invalidEvent = "invalid_event"
    /// PostgreSQL refused the event itself (a data error that retrying cannot fix), isolated from its batch.
    case databaseRejected = "database_rejected"
}

/// The sink's metrics (names listed in the README).
struct SinkMetrics: Sendable {
    let applied = Counter(label: "fleet_sink_events_total", dimensions: [("status", "applied")])
    let stale = Counter(label: "fleet_sink_events_total", dimensions: [("status", "stale")])
    let duplicate = Counter(label: "fleet_sink_events_total", dimensions: [("status", "duplicate")])
    let batch = Metrics.Timer(label: "fleet_sink_batch_seconds", preferredDisplayUnit: .seconds)
    let retries = Counter(label: "fleet_sink_retries_total")
    /// The most records the next batch takes (`BatchSizing`).
    let batchLimit = Gauge(label: "fleet_sink_batch_limit")
    static let tables = [
        "notifications", "transactions", "transaction_versions", "entitlement_events", "entitlements",
        "consumable_ledger",
    ]
    let rows: [String: Counter] = Dictionary(uniqueKeysWithValues: SinkMetrics.tables.map {
        ($0, Counter(label: "fleet_sink_rows_written_total", dimensions: [("table", $0)]))
    })

    func record(_ outcome: ApplyOutcome) {
        applied.increment(by: outcome.applied)
        stale.increment(by: outcome.stale)
        duplicate.increment(by: outcome.duplicate)
        for (table, n) in outcome.rowsWritten where n > 0 { rows[table]?.increment(by: n) }
    }

    func rejected(_ reason: String) {
        Counter(label: "fleet_sink_rejected_total", dimensions: [("reason", reason)]).increment()
    }
}
