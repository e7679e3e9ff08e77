import AppStoreVerification
import EntitlementDomain
import FleetDemo
import FleetDevStack
import FleetKafka
import FleetOperations
import FleetSink
import Foundation
import Logging
import PostgresNIO
import ServiceLifecycle
import Synchronization

/// `fleet bench sink`: pre-produces entitlement events into an embedded Kafka cluster, runs the sink against a
/// throwaway PostgreSQL and reports events/s and the p99 batch latency, next to the rate of a plain `COPY` of the
/// same rows (every row the sink wrote, each table's into an empty table) measured in the same run: the ceiling.
/// The last stdout line is one JSON object: `events_per_s`, `p99_batch_ms`, `copy_rows_per_s` (rows/s of that COPY),
/// `copy_events_per_s` (the events those rows hold, per second of COPY) and `sink_to_copy_ratio` (events_per_s over
/// copy_events_per_s), plus `events_table_copy_rows_per_s` (the entitlement_events rows alone) and a stricter
/// ceiling, `binary_copy_events_per_s` / `sink_to_binary_copy_ratio` (the same rows by a binary COPY that the server
/// reads from a file). CPU per event, steadier than rates on a noisy machine (`/proc/PID/stat`, from the end of the
/// first batch): `backend_cpu_us_per_event` (the sink's PostgreSQL backends), `copy_backend_cpu_us_per_event` (the
/// backend running the text COPY reference), `backend_cpu_ratio` (the second over the first: the share of the sink's
/// backend work a plain COPY of its rows would need) and `sink_process_cpu_us_per_event` (this process, i.e. the sink,
/// when the cluster runs in a child; else null). Over the same window, what bounds the rate: `backend_busy_pct` (the
/// share of the time each sink backend was on a CPU; near 100, that serial connection is the limit),
/// `backend_runqueue_pct` (the share it was runnable but waiting for a CPU, `/proc/PID/schedstat`; the rest of its
/// time it waited for the sink's next statement or rows) and `machine_idle_pct` (`/proc/stat`, all cores; near 0, the
/// cores are the limit). A figure is null when a backend went away (a reconnect). Registered by the lead under
/// `fleet bench`.
public struct BenchSink: Sendable {
    public init() {}

    public var events: Int = 100_000
    public var batchSize: Int = SinkConfiguration.defaultMaxBatchSize
    /// `fleet sink --batch-target-ms` (0: fixed batches of `batchSize`).
    public var batchTargetMs: Int = SinkConfiguration.defaultBatchTargetMilliseconds
    public var writers: Int = 1

    public var partitions: Int?
    /// The collation of the benchmark's database (nil: C, the throwaway cluster's). Production databases usually
    /// compare text linguistically (`en_US.UTF-8`); `database_locale` in the JSON line says which one ran.
    public var databaseLocale: ThrowawayPostgres.DatabaseLocale?
    /// The `fleet` binary: the embedded cluster then runs in a child `fleet dev-kafka`, so that `rss_mb` is the
    /// sink's process alone (in-process, the cluster holding the whole topic counted ~160 MB of it).
    public var executable: String?

    public func run() async throws {
        guard events > 0, batchSize > 0, batchTargetMs >= 0, partitions ?? 1 > 0 else { throw ValidationError("all counts must be positive") }
        FleetLogging.bootstrap(format: "text", level: "warning")
        // The malloc settings `fleet sink` starts with (the sink runs in this process).
        MemoryTuning.keepBatchBlocksInHeap(environment: ProcessInfo.processInfo.environment)
        var logger = Logger(label: "fleet.bench.sink")
        logger.logLevel = .warning
        let postgres = try await ThrowawayPostgres(database: "bench", databaseLocale: databaseLocale)
        defer { postgres.destroy() }
        // The records exactly as workers write them (`VerifierWorker`: `jsonBytes()`, every embedded document's
        // members in jsonb's order). Encoded with JSONEncoder instead, the documents came in the order of Swift's
        // dictionaries, and PostgreSQL sorted the members of every one (`qsort_arg` under `jsonb_recv`, ~5.6 % of
        // the backend in a `perf` profile of the sink's window): a cost the pipeline never pays. Made, sized and
        // produced a chunk at a time (`BenchStream.chunks`): made all at once (~470 MB of small objects), what was
        // left of them in the heap after they were freed put 42-74 MB under the sink's peak RSS, varying by run.
        // The mock cluster keeps ~5 MB per partition and deletes older data even if unread: spread the events over
        // enough partitions that every one stays retained (half the retention each, room for hash skew).
        var bytes = 0
        for chunk in BenchStream.chunks(count: events) { bytes += chunk.reduce(0) { $0 + $1.jsonBytes().count } }
        let partitions = self.partitions ?? max(4, Int((Double(bytes) / (0.5 * Double(BacklogGate.mockPartitionBytes))).rounded(.up)))
        let topic = "bench.entitlements.verified"
        let cluster = try BenchCluster(executable: executable, topics: [topic: partitions, "bench.sink-rejected": 1])
        defer { cluster.shutdown() }
        print("bench sink: \(events) events, batch \(batchSize), \(max(1, writers)) writer(s), \(partitions) partitions; PostgreSQL \(postgres.binDirectory), database collation \(databaseLocale?.description ?? "C")")

        // Produce (not timed).
        // The consumer's fetch bounds as `fleet sink` sets them.
        let kafka = KafkaConfiguration(
            bootstrapServers: cluster.bootstrapServers, clientId: "bench-sink",
            properties: KafkaConfiguration.withBoundedFetch([:]))
        let producer = try KafkaProducer(configuration: kafka)
        var produced = 0
        let failures = Mutex(0)
        for chunk in BenchStream.chunks(count: events) {
            for event in chunk {
                // Partitioned by subject so that a subject's events stay in order, as the workers key them.
                let key = event.originalTransactionId ?? event.eventId
                let partition = Int32(truncatingIfNeeded: UInt32(truncatingIfNeeded: key.utf8.reduce(5381) { ($0 &* 33) &+ Int($1) }) % UInt32(partitions))
                try producer.enqueue(OutgoingMessage(
                    topic: topic, key: Array(key.utf8), value: event.jsonBytes(),
                    headers: FleetHeaders.result(event, KafkaHeader.init(key:string:)),
                    partition: partition)) { result in
                    if case .failure = result { failures.withLock { $0 += 1 } }
                }
                produced += 1
            }
            guard await producer.flush(deadline: .seconds(120)) else { throw ValidationError("producing the bench events timed out") }
        }
        guard failures.withLock({ $0 }) == 0 else { throw ValidationError("\(failures.withLock { $0 }) bench events failed to produce") }
        let retained = try await KafkaAdmin(configuration: kafka).consumerLag(groupId: "bench-sink", topics: [topic]).totalLag
        guard retained == Int64(events) else {
            throw ValidationError("the embedded cluster retained \(retained) of \(events) events; use more --partitions")
        }
        print("produced \(produced) events (\(bytes / max(1, events)) bytes each on average) over \(partitions) partitions")
        // Restart the peak-RSS count, so that the peak printed is the process's during the sink's run.
        let rssBeforeSink = ProcessMemory.resetPeak()

        // Migrate, then run the sink until every event is processed.
        let connection = try await PostgresConnection.connect(
            configuration: try DatabaseURL(postgres.url).connectionConfiguration(), id: 1, logger: logger)
        try await SinkSchema.migrate(connection: connection, logger: logger)

        let durations = Mutex<[Duration]>([])
        /// Records per batch, and the limit the last batch left for the next (`BatchSizing`).
        let sizes = Mutex<(batches: [Int], nextLimit: Int)>(([], 0))
        let processed = Mutex(0)
        let sinkWriters = try KafkaSinkWriters(
            count: writers, kafka: kafka, groupId: "bench-sink", topic: topic,
            configuration: SinkConfiguration(
                databaseURL: try DatabaseURL(postgres.url), maxBatchSize: batchSize,
                batchTarget: batchTargetMs > 0 ? .milliseconds(batchTargetMs) : nil),
            rejected: KafkaRejectedSink(producer: producer, topic: "bench.sink-rejected"), logger: logger,
            onBatch: { report in
                durations.withLock { $0.append(report.duration) }
                sizes.withLock { $0.batches.append(report.records); $0.nextLimit = report.nextLimit }
                processed.withLock { $0 += report.records }
            })
        let clock = ContinuousClock()
        // Wait for the group assignment before starting the clock.
        let started = clock.now
        let task = Task {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for service in sinkWriters.services { group.addTask { try await service.run() } }
                try await group.waitForAll()
            }
        }
        while processed.withLock({ $0 }) == 0 {
            try await Task.sleep(for: .milliseconds(5))
            if clock.now - started > .seconds(60) { task.cancel(); throw ValidationError("the sink did not start within 60 s") }
        }
        let firstBatchDone = clock.now
        let firstCount = processed.withLock { $0 }
        // CPU time per event, a steadier figure than events/s on a noisy machine: the sink's backends (its
        // connections to the bench database) and this process (the sink; the cluster runs in a child), from here on.
        let backends = try await clientBackendPIDs(except: connection, logger: logger)
        let cpuFrom = (backends: summed(backends, processCPUSeconds(pid:)), sink: processCPUSeconds(pid: getpid()),
                       count: processed.withLock { $0 }, machine: MachineCPU.sample(),
                       queued: summed(backends, processRunQueueSeconds(pid:)), at: clock.now)
        while processed.withLock({ $0 }) < events {
            try await Task.sleep(for: .milliseconds(2))
            if clock.now - started > .seconds(900) { task.cancel(); throw ValidationError("the sink did not finish within 900 s") }
        }
        let finished = clock.now
        let cpuTo = (backends: summed(backends, processCPUSeconds(pid:)), sink: processCPUSeconds(pid: getpid()),
                     machine: MachineCPU.sample(), queued: summed(backends, processRunQueueSeconds(pid:)))
        task.cancel()
        _ = try? await task.value
        _ = await sinkWriters.close(deadline: .seconds(5))
        producer.close(timeout: .seconds(2))
        // The sink's peak, read before the COPY reference loads every row into this process.
        let rssMB = peakRSSMegabytes(pid: getpid())
        let clusterMB = cluster.peakRSSMegabytes

        // Steady-state rate: from the end of the first batch (the group join and first fetch excluded).
        let elapsed = seconds(finished - firstBatchDone)
        let eventsPerSecond = Double(events - firstCount) / max(elapsed, 1e-9)
        let sorted = durations.withLock { $0 }.sorted()
        let p99 = sorted.isEmpty ? 0 : seconds(sorted[min(sorted.count - 1, Int((Double(sorted.count) * 0.99).rounded(.up)) - 1)]) * 1000
        let p50 = sorted.isEmpty ? 0 : seconds(sorted[sorted.count / 2]) * 1000
        let (batchSizes, lastLimit) = sizes.withLock { $0 }
        let meanBatch = Double(batchSizes.reduce(0, +)) / Double(max(1, batchSizes.count))

        let written = try await connection.query("SELECT count(*) FROM entitlement_events", logger: logger).collect()
        let rows = try written.first?.decode(Int64.self) ?? 0
        guard rows == Int64(events) else { throw ValidationError("expected \(events) events in entitlement_events, found \(rows)") }

        // The ceiling: a plain COPY of the same rows, i.e. every row the sink wrote (its notifications, transaction
        // versions and facts, events, entitlements and ledger entries), each table's rows into an empty table of the
        // same columns without indexes or constraints, in text format over the same connection kind.
        var copySeconds = 0.0
        var copiedRows = 0
        var eventsTableRowsPerSecond = 0.0
        var tableSecondsList: [String] = []
        let ownBackend = try await connection.query("SELECT pg_backend_pid()", logger: logger).collect().first?.decode(Int32.self)
        var copyBackendSeconds: Double? = 0
        for table in Self.sinkTables {
            let lines = try await copyLines(table: table, connection: connection, logger: logger)
            // The same columns as the sink's table, with their defaults, compression (lz4 for the payloads, migration
            // 3) and storage; no indexes or constraints. (Until 2026-11-25 compression was not copied: alternated runs
            // with and without it gave the same COPY rate, 34,100-37,900 against 36,700-38,600 events/s.)
            try await connection.query(PostgresQuery(
                unsafeSQL: "CREATE TABLE copy_\(table) (LIKE \(table) INCLUDING DEFAULTS INCLUDING COMPRESSION INCLUDING STORAGE)"),
                logger: logger)
            let copyStart = clock.now
            let backendBefore = ownBackend.flatMap(processCPUSeconds)
            try await connection.copyFrom(table: "copy_\(table)", columns: lines.columns, logger: logger) { writer in
                var buffer = ByteBuffer()
                for line in lines.rows {
                    buffer.writeString(line)
                    if buffer.readableBytes > 1 << 20 {
                        try await writer.write(buffer)
                        buffer.clear()
                    }
                }
                if buffer.readableBytes > 0 { try await writer.write(buffer) }
            }
            let tableSeconds = seconds(clock.now - copyStart)
            if let before = backendBefore, let after = ownBackend.flatMap(processCPUSeconds), let sum = copyBackendSeconds {
                copyBackendSeconds = sum + after - before
            } else {
                copyBackendSeconds = nil
            }
            copySeconds += tableSeconds
            tableSecondsList.append(String(format: "%@ %.0f ms (%d rows)", table, tableSeconds * 1000, lines.rows.count))
            copiedRows += lines.rows.count
            if table == "entitlement_events" { eventsTableRowsPerSecond = Double(lines.rows.count) / max(tableSeconds, 1e-9) }
        }
        // A stricter ceiling beside it: the same rows in binary format (the format the sink's own COPYs use since
        // 2026-11-27), read by the server from a file it wrote (no client or protocol in the way at all).
        var binarySeconds = 0.0
        for table in Self.sinkTables {
            let file = "\(postgres.directory)/copy_\(table).bin"
            try await connection.query(PostgresQuery(unsafeSQL: "COPY \(table) TO '\(file)' (FORMAT binary)"), logger: logger)
            try await connection.query(PostgresQuery(
                unsafeSQL: "CREATE TABLE bcopy_\(table) (LIKE \(table) INCLUDING DEFAULTS INCLUDING COMPRESSION INCLUDING STORAGE)"),
                logger: logger)
            let copyStart = clock.now
            try await connection.query(PostgresQuery(unsafeSQL: "COPY bcopy_\(table) FROM '\(file)' (FORMAT binary)"), logger: logger)
            binarySeconds += seconds(clock.now - copyStart)
            try? FileManager.default.removeItem(atPath: file)
        }
        let binaryCopyEventsPerSecond = Double(events) / max(binarySeconds, 1e-9)
        let copyRowsPerSecond = Double(copiedRows) / max(copySeconds, 1e-9)
        // The same events written by COPY alone: the events/s a sink could at best reach on this machine.
        let copyEventsPerSecond = Double(events) / max(copySeconds, 1e-9)
        try await connection.close()

        let ratio = eventsPerSecond / copyEventsPerSecond
        let cpuEvents = Double(max(1, events - cpuFrom.count))
        func used(_ from: Double?, _ to: Double?) -> Double? {
            guard let from, let to else { return nil }
            return (to - from) * 1e6 / cpuEvents
        }
        let backendUs = used(cpuFrom.backends, cpuTo.backends)
        let sinkUs = cluster.isChild ? used(cpuFrom.sink, cpuTo.sink) : nil
        let copyBackendUs = copyBackendSeconds.map { $0 * 1e6 / Double(events) }
        let cpuRatio = copyBackendUs.flatMap { copy in backendUs.map { copy / max($0, 1e-9) } }
        // Which resource bounds the rate: a backend busy all the time (each connection's work is serial), or the
        // machine's cores (no idle share left).
        let cpuWindow = seconds(finished - cpuFrom.at)
        func share(_ from: Double?, _ to: Double?) -> Double? {
            guard let from, let to else { return nil }
            return ((to - from) / max(cpuWindow * Double(max(1, backends.count)), 1e-9) * 1000).rounded() / 10
        }
        let backendBusy = share(cpuFrom.backends, cpuTo.backends)
        let backendQueued = share(cpuFrom.queued, cpuTo.queued)
        let machineIdle = MachineCPU.idlePercent(from: cpuFrom.machine, to: cpuTo.machine)
        func json(_ value: Double?, _ format: String) -> String { value.map { String(format: format, $0) } ?? "null" }
        print(String(format: "sink: %.0f events/s over %.2f s (%d batches, p50 %.1f ms, p99 %.1f ms)",
                     eventsPerSecond, elapsed, sorted.count, p50, p99))
        print(String(format: "batches: at most %d events, target %@; %.0f events on average, largest %d, the last limit %d",
                     batchSize, batchTargetMs > 0 ? "\(batchTargetMs) ms" : "none (fixed)", meanBatch,
                     batchSizes.max() ?? 0, lastLimit))
        print(String(format: "COPY of the same %d rows (%.1f per event, %d tables) into empty tables: %.0f rows/s = %.0f events/s (%.2f s); sink/COPY = %.2f",
                     copiedRows, Double(copiedRows) / Double(events), Self.sinkTables.count, copyRowsPerSecond,
                     copyEventsPerSecond, copySeconds, ratio))
        print("COPY per table: " + tableSecondsList.joined(separator: ", "))
        print(String(format: "the same rows by a binary COPY from a server-side file: %.0f events/s; sink/binary COPY = %.2f",
                     binaryCopyEventsPerSecond, eventsPerSecond / binaryCopyEventsPerSecond))
        print(String(format: "(entitlement_events rows alone COPY at %.0f rows/s: the sink writes ~%.1f rows per event, with their indexes)",
                     eventsTableRowsPerSecond, Double(copiedRows) / Double(events)))
        let whose = cluster.isChild
            ? "the sink's process; the embedded cluster holding the topic runs in a child process, peak \(Int(clusterMB)) MB"
            : "the whole bench process: the sink and the embedded cluster holding the topic"
        print(String(format: "peak RSS while the sink ran %.1f MB (", rssMB) + whose
              + String(format: "; %.1f MB before the sink started)", rssBeforeSink))
        print("PostgreSQL's backend CPU per event: the sink's \(json(backendUs, "%.1f")) us (\(backends.count) backend(s)), "
              + "the COPY reference's \(json(copyBackendUs, "%.1f")) us: COPY/sink = \(json(cpuRatio, "%.3f")); "
              + "the sink's process \(json(sinkUs, "%.1f")) us per event")
        print("while the sink ran: its backend(s) busy \(json(backendBusy, "%.1f")) % of the time each and waiting for a CPU "
              + "\(json(backendQueued, "%.1f")) % (the rest: waiting for the sink), the machine idle \(json(machineIdle, "%.1f")) %")
        print("targets: >= 12000 events/s \(eventsPerSecond >= 12_000 ? "met" : "NOT met"); >= 0.6 x COPY \(ratio >= 0.6 ? "met" : "NOT met"); p99 batch < 250 ms \(p99 < 250 ? "met" : "NOT met"); RSS < 200 MB \(rssMB < 200 ? "met" : "NOT met")")
        print(String(format: #"{"events_per_s": %.0f, "p99_batch_ms": %.2f, "copy_rows_per_s": %.0f, "copy_events_per_s": %.0f, "sink_to_copy_ratio": %.3f, "copy_rows_per_event": %.2f, "events_table_copy_rows_per_s": %.0f, "binary_copy_events_per_s": %.0f, "sink_to_binary_copy_ratio": %.3f, "p50_batch_ms": %.2f, "events": %d, "batch_size": %d, "batch_target_ms": %d, "mean_batch_events": %.0f, "max_batch_events": %d, "writers": %d, "rss_mb": %.1f, "rss_before_sink_mb": %.1f, "cluster_in_child_process": \#(cluster.isChild), "cluster_rss_mb": %.1f, "database_locale": "\#(databaseLocale?.description ?? "C")", "backend_cpu_us_per_event": \#(json(backendUs, "%.1f")), "copy_backend_cpu_us_per_event": \#(json(copyBackendUs, "%.1f")), "backend_cpu_ratio": \#(json(cpuRatio, "%.3f")), "sink_process_cpu_us_per_event": \#(json(sinkUs, "%.1f")), "backend_busy_pct": \#(json(backendBusy, "%.1f")), "backend_runqueue_pct": \#(json(backendQueued, "%.1f")), "machine_idle_pct": \#(json(machineIdle, "%.1f"))}"#,
                     eventsPerSecond, p99, copyRowsPerSecond, copyEventsPerSecond, ratio,
                     Double(copiedRows) / Double(events), eventsTableRowsPerSecond, binaryCopyEventsPerSecond,
                     eventsPerSecond / binaryCopyEventsPerSecond, p50, events, batchSize, batchTargetMs, meanBatch,
                     batchSizes.max() ?? 0, max(1, writers),
                     rssMB, rssBeforeSink, clusterMB))
    }

    /// The client backends of this database other than `connection`'s (the sink's connections).
    private func clientBackendPIDs(except connection: PostgresConnection, logger: Logger) async throws -> [Int32] {
        let rows = try await connection.query("""
            SELECT pid FROM pg_stat_activity
            WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()
            """, logger: logger).collect()
        return try rows.map { try $0.decode(Int32.self) }
    }

    /// `read` (CPU seconds, run-queue seconds) of `pids` together; nil when one is gone (a reconnect: then no figure
    /// rather than a wrong one).
    private func summed(_ pids: [Int32], _ read: (Int32) -> Double?) -> Double? {
        guard !pids.isEmpty else { return nil }
        var total = 0.0
        for pid in pids {
            guard let seconds = read(pid) else { return nil }
            total += seconds
        }
        return total
    }

    /// Every table the sink writes.
    static let sinkTables = [
        "notifications", "transaction_versions", "transactions", "entitlement_events", "entitlements", "consumable_ledger",
    ]

    private func seconds(_ d: Duration) -> Double {
        Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
    }

    /// The rows of one of the sink's tables in COPY text format (read back from the table, so the COPY writes
    /// exactly the same values).
    private func copyLines(table: String, connection: PostgresConnection, logger: Logger) async throws -> (columns: [String], rows: [String]) {
        let columnRows = try await connection.query("""
            SELECT column_name::text FROM information_schema.columns
            WHERE table_schema = current_schema() AND table_name = \(table) ORDER BY ordinal_position
            """, logger: logger).collect()
        let columns = try columnRows.map { try $0.decode(String.self) }
        var rows: [String] = []
        let select = columns.map { "\($0)::text" }.joined(separator: ", ")
        for try await row in try await connection.query(PostgresQuery(unsafeSQL: "SELECT \(select) FROM \(table)"), logger: logger) {
            let r = row.makeRandomAccess()
            var fields: [String] = []
            fields.reserveCapacity(columns.count)
            for i in 0..<columns.count {
                if let v = try r[i].decode(String?.self) { fields.append(copyEscape(v)) } else { fields.append(#"\N"#) }
            }
            rows.append(fields.joined(separator: "\t") + "\n")
        }
        return (columns, rows)
    }

    private func copyEscape(_ s: String) -> String {
        guard s.contains(where: { $0 == "\\" || $0 == "\t" || $0 == "\n" || $0 == "\r" }) else { return s }
        var out = ""
        for c in s {
            switch c {
            case "\\": out += "\\\\"
            case "\t": out += "\\t"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            default: out.append(c)
            }
        }
        return out
    }
}

/// A realistic mix: per subscriber a purchase, two renewals, a renewal-state change and either a refund or a
/// consumable purchase; every event carries its decoded transaction and a notification.
enum BenchStream {
    /// The events of `make(count:)` in consecutive chunks of at most `size` (a multiple of the 5 events each
    /// subscription makes), each made when the iteration reaches it.
    static func chunks(count: Int, size: Int = 5_000) -> some Sequence<[EntitlementEvent]> {
        precondition(size > 0 && size % 5 == 0, "a chunk holds whole subscriptions")
        return stride(from: 0, to: count, by: size).lazy.map { make(count: min(size, count - $0), from: $0) }
    }

    /// `count` events of the stream, from its event `first` (a multiple of 5: a subscription's first event).
    static func make(count: Int, from first: Int = 0) -> [EntitlementEvent] {
        precondition(first % 5 == 0, "the stream is made a subscription (5 events) at a time")
        var out: [EntitlementEvent] = []
        out.reserveCapacity(count)
        let base: Int64 = 1_760_000_000_000
        let day: Int64 = 86_400_000
        var s = first / 5
        while out.count < count {
            let otx = "2000000\(100_000 + s)"
            let t0 = base + Int64(s) * 37
            let subscription = ProductType.autoRenewable.rawValue
            let steps: [(String, String, EntitlementEffect, Int64, String, String)] = [
                ("SUBSCRIPTION_STARTED", "SUBSCRIBED", .grant, t0, otx, subscription),
                ("SUBSCRIPTION_RENEWED", "DID_RENEW", .extend, t0 + 30 * day, "\(otx)1", subscription),
                ("SUBSCRIPTION_RENEWED", "DID_RENEW", .extend, t0 + 60 * day, "\(otx)2", subscription),
                ("AUTO_RENEW_DISABLED", "DID_CHANGE_RENEWAL_STATUS", .state, t0 + 61 * day, "\(otx)2", subscription),
                s % 2 == 0
                    ? ("REFUNDED", "REFUND", .revoke, t0 + 62 * day, "\(otx)2", subscription)
                    : ("ONE_TIME_PURCHASED", "ONE_TIME_CHARGE", .grant, t0 + 5 * day, "\(otx)9", ProductType.consumable.rawValue),
            ]
            for (i, step) in steps.enumerated() where out.count < count {
                let (kind, type, effect, signed, txn, productType) = step
                let consumable = productType == ProductType.consumable.rawValue
                let product = consumable ? "com.example.gems100" : "com.example.premium.monthly"
                var transaction: [String: JSONValue] = [
                    "transactionId": .string(txn), "originalTransactionId": .string(consumable ? txn : otx),
                    "productId": .string(product), "type": .string(productType), "signedDate": .integer(signed),
                    "purchaseDate": .integer(signed), "bundleId": .string("com.example.app"),
                    "environment": .string("Production"), "inAppOwnershipType": .string("PURCHASED"),
                    "quantity": .integer(1), "webOrderLineItemId": .string("\(txn)w"), "storefront": .string("JPN"),
                    "currency": .string("JPY"), "price": .integer(480_000),
                ]
                if !consumable { transaction["expiresDate"] = .integer(signed + 30 * day) }
                if effect == .revoke {
                    transaction["revocationDate"] = .integer(signed)
                    transaction["revocationReason"] = .integer(0)
                }
                out.append(EntitlementEvent(
                    eventId: "ev-\(s)-\(i)", kind: kind, effect: effect, reason: nil, environment: "Production",
                    bundleId: "com.example.app", appAppleId: 1234, subject: consumable ? "user-\(s)" : otx,
                    productId: product, productType: productType, transactionId: txn,
                    originalTransactionId: consumable ? txn : otx, webOrderLineItemId: "\(txn)w",
                    ownershipType: "PURCHASED", quantity: 1, validFrom: signed,
                    validUntil: consumable ? nil : signed + 30 * day, revocationDate: effect == .revoke ? signed : nil,
                    notification: EventNotification(uuid: "n-\(s)-\(i)", type: type, subtype: nil, signedDate: signed, version: "2.0"),
                    signedDate: signed, verifiedAt: signed + 500,
                    source: EventSource(topic: FleetTopics.raw, partition: Int32(s % 4), offset: Int64(first + out.count), kind: .notification),
                    units: consumable ? 100 : nil, entitlement: consumable ? nil : "premium",
                    transaction: .object(transaction)))
            }
            s += 1
        }
        return out
    }
}
