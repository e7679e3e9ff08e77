import AppStoreVerification
import EntitlementDomain
import FleetKafka
import FleetResponder
import FleetSink
import FleetTestPKI
import FleetWorker
import Foundation
import Logging
import PostgresNIO

/// What `fleet bench chaos` checks once every lag is 0, each printed as one PASS/FAIL line:
/// - every input is accounted for: verified (each of its events in the database exactly once by eventId) or
///   rejected (on the rejected topic at least once, with the expected reason); no event that no input explains;
/// - the final tables equal those of a calm run over the same inputs: the same inputs verified and mapped in-process
///   by the worker's `InputProcessor` (with the raw topic coordinates they were published at) and applied in publish
///   order by the sink's `EventApplier` to a second database, then both compared by dump (wall-clock columns left
///   out: `applied_at`, `received_at`, `verified_at`, `updated_at`);
/// - no consumable credited twice, none missing;
/// - the sink refused nothing; no process logged an offset reset (`offset_reset`, or librdkafka's own "offset reset").
struct ChaosChecks {
    let soak: ChaosSoak
    let traffic: DemoTraffic
    let pki: TestPKI

    /// Columns written from the wall clock (the sink's or the workers'): they differ between any two runs.
    static let wallClockColumns = ["applied_at", "received_at", "verified_at", "updated_at"]
    static let tables = ["notifications", "transactions", "transaction_versions", "entitlement_events", "entitlements", "consumable_ledger"]

    private func check(_ name: String, _ passed: Bool, _ detail: String) {
        soak.report.checks[name] = passed
        soak.say("check      \(passed ? "PASS" : "FAIL")  \(detail)")
    }

    func run() async throws {
        guard let pg = soak.postgres, let cluster = soak.cluster else { throw DemoError("the stack is gone") }
        let logger = soak.logger
        let delivered = soak.deliveries.withLock { $0 }
        check("delivered", delivered.count == traffic.items.count, "published: \(delivered.count) of \(traffic.items.count) inputs delivered to Kafka")

        // The calm reference, input by input.
        let t = soak.trafficOptions
        let processor = InputProcessor(
            verifier: SignedDataVerifier(policy: try pki.policy(bundleId: t.bundleId, appAppleId: t.appAppleId, environments: [t.environment])),
            mapper: EntitlementMapper(catalogue: try ProductCatalogue.parse(DemoTraffic.catalogueYAML)))
        var expectedEvents: [EntitlementEvent] = []
        var perInput: [(index: Int, eventIds: [String])] = []
        var rejections: [(index: Int, value: [UInt8], reason: String)] = []
        var intentMismatches = 0
        for (i, item) in traffic.items.enumerated() {
            guard let coordinates = delivered[i] else { continue }
            let at = InputCoordinates(topic: FleetTopics.raw, partition: coordinates.0, offset: coordinates.1)
            switch processor.process(value: item.value, deviceVerificationId: nil, at: at) {
            case .events(let events, _):
                expectedEvents += events
                perInput.append((i, events.map(\.eventId)))
                if item.expectation != "valid" && item.expectation != "replay" { intentMismatches += 1 }
            case .rejected(let reason, _):
                rejections.append((i, item.value, reason.rawValue))
                if item.expectation != reason.rawValue { intentMismatches += 1 }
            case .retryable:
                intentMismatches += 1  // the soak runs without revocation checks
            }
        }
        let expectedIds = Set(expectedEvents.map(\.eventId))
        soak.report.expected_verified_inputs = perInput.count
        soak.report.expected_rejected_inputs = rejections.count
        soak.report.expected_events = expectedIds.count
        soak.say("reference  \(perInput.count) inputs verify to \(expectedIds.count) distinct events, \(rejections.count) are rejected (\(intentMismatches) verdicts differ from the generator's intent)")

        let db = try await PostgresConnection.connect(configuration: try DatabaseURL(pg.url).connectionConfiguration(), id: 11, logger: logger)
        defer { Task { try? await db.close() } }

        // Verified inputs: every event exactly once; nothing unexplained.
        var stored: [String: Int] = [:]
        for try await (id, n) in try await db.query("SELECT event_id, count(*)::bigint FROM entitlement_events GROUP BY event_id", logger: logger)
            .decode((String, Int64).self) { stored[id] = Int(n) }
        soak.report.events_in_database = stored.count
        let missingInputs = perInput.filter { input in input.eventIds.contains { id in stored[id] == nil } }
        let twice = stored.values.filter { $0 > 1 }.count
        let unexplained = Set(stored.keys).subtracting(expectedIds)
        check("verified_exactly_once", missingInputs.isEmpty && twice == 0 && unexplained.isEmpty,
              "verified inputs: \(perInput.count - missingInputs.count) of \(perInput.count) have all their events in the database (\(stored.count) events, \(twice) stored twice, \(unexplained.count) no input explains)"
              + (missingInputs.isEmpty ? "" : "; first missing: input #\(missingInputs[0].index) at \(delivered[missingInputs[0].index].map { "\(FleetTopics.raw)[\($0.0)]@\($0.1)" } ?? "?")"))

        // Rejected inputs: on the rejected topic at least once, with the expected reason.
        let onTopic = try await readRejected(bootstrap: cluster.bootstrapServers)
        let missingRejections = rejections.filter { !(onTopic.reasons[$0.value]?.contains($0.reason) ?? false) }
        check("rejected_at_least_once", missingRejections.isEmpty && onTopic.complete,
              "rejected inputs: \(rejections.count - missingRejections.count) of \(rejections.count) on \(FleetTopics.rejected) with the expected reason (\(onTopic.records) records read\(onTopic.complete ? "" : ", INCOMPLETE: the topic lost records or could not be read"))")

        // The calm run: the same inputs, verified and applied without faults, into fleet_calm.
        let calm = try await PostgresConnection.connect(configuration: try DatabaseURL(pg.url(database: "fleet_calm")).connectionConfiguration(), id: 12, logger: logger)
        defer { Task { try? await calm.close() } }
        let applier = EventApplier()
        var batch: [EntitlementEvent] = []
        for (n, event) in expectedEvents.enumerated() {
            // Through JSON, as the sink receives it.
            batch.append(try EntitlementEvent(jsonBytes: event.jsonBytes()))
            if batch.count == 500 || n == expectedEvents.count - 1 {
                _ = try await applier.apply(batch, connection: calm, logger: logger)
                batch.removeAll()
            }
        }
        let chaosDump = try await Self.dump(db, logger: logger)
        let calmDump = try await Self.dump(calm, logger: logger)
        var differing: [String] = []
        for table in Self.tables where chaosDump[table] != calmDump[table] {
            let a = Set(chaosDump[table]?.rows ?? []), b = Set(calmDump[table]?.rows ?? [])
            differing.append("\(table): \(a.subtracting(b).count) rows only in the chaos run, \(b.subtracting(a).count) only in the calm run")
            if let row = b.subtracting(a).sorted().first { soak.say("  calm-only row of \(table): \(row.prefix(400))") }
            if let row = a.subtracting(b).sorted().first { soak.say("  chaos-only row of \(table): \(row.prefix(400))") }
        }
        let sizes = Self.tables.map { "\($0) \(chaosDump[$0]?.rows.count ?? 0)" }.joined(separator: ", ")
        check("tables_equal_calm_run", differing.isEmpty,
              differing.isEmpty ? "tables equal the calm run's (\(sizes) rows)" : "tables differ from the calm run's: " + differing.joined(separator: "; "))

        // Consumables: credited exactly once each.
        let chaosCredits = try await credits(db, logger: logger)
        let calmCredits = try await credits(calm, logger: logger)
        let twiceCredited = chaosCredits.filter { $0.value > 1 }.count
        let notCredited = Set(calmCredits.keys).subtracting(chaosCredits.keys).count
        let extraCredited = Set(chaosCredits.keys).subtracting(calmCredits.keys).count
        check("consumables_credited_once", twiceCredited == 0 && notCredited == 0 && extraCredited == 0 && !calmCredits.isEmpty,
              "consumables: \(chaosCredits.count) transactions credited (calm run \(calmCredits.count)), \(twiceCredited) twice, \(notCredited) missing, \(extraCredited) unexpected")

        try await checkConsumption(expectedEvents, db: db, logger: logger)

        // The sink refused nothing.
        let admin = KafkaAdmin(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers, clientId: "fleet-chaos-check"))
        let sinkRejected = try await admin.consumerLag(groupId: "fleet-chaos-observer", topics: [FleetTopics.sinkRejected])
            .reduce(Int64(0)) { $0 + $1.highWatermark }
        check("sink_rejected_nothing", sinkRejected == 0, "sink: \(sinkRejected) events refused (\(FleetTopics.sinkRejected))")

        // No offset reset, in any incarnation's log.
        let (files, resets) = offsetResetLines()
        check("no_offset_reset", resets.isEmpty, "offset resets: \(resets.count) lines in \(files) process logs" + (resets.first.map { "; first: \($0.prefix(300))" } ?? ""))

        // Consumer stalls are not a failed check (the fleet said so, and the liveness restart healed them), but say them.
        let stalls = logLines(containing: "consumer_stalled")
        soak.report.consumer_stalls = stalls.count
        soak.say("note       consumer stalls: \(stalls.count) reported, \(soak.report.liveness_restarts) liveness restart(s)"
                 + (stalls.first.map { "; first: \($0.prefix(300))" } ?? ""))
    }

    /// Every CONSUMPTION_REQUEST recorded once and settled: answered exactly once, or expired (past Apple's window)
    /// unanswered; none pending, none answered twice. A row left `sending` is the responder's at-most-once rule after a
    /// SIGKILL between sending and recording (an operator's call, never a second answer): allowed, up to one per kill.
    private func checkConsumption(_ expectedEvents: [EntitlementEvent], db: PostgresConnection, logger: Logger) async throws {
        let expected = Set(expectedEvents.compactMap { ConsumptionClaim(event: $0)?.notificationUUID })
        var rows: [ConsumptionVerdict.Row] = []
        let deadline = ContinuousClock.now + .seconds(120)
        repeat {
            rows = try await ConsumptionVerdict.rows(db, logger: logger)
            if !rows.contains(where: { $0.state == "pending" }) && Set(rows.map(\.uuid)).isSuperset(of: expected) { break }
            try await Task.sleep(for: .milliseconds(500))
        } while ContinuousClock.now < deadline
        let calls = ConsumptionVerdict.answersByTransaction(soak.appleAPI?.standIn.consumptionCalls ?? [])
        let verdict = ConsumptionVerdict(
            expected: expected, rows: rows, calls: calls,
            responderKills: soak.report.faults[ChaosSoak.Fault.killResponder.rawValue, default: 0])
        soak.report.consumption = verdict.byState
        soak.report.consumption_calls = calls.values.reduce(0, +)
        soak.report.consumption_refusals = soak.appleAPI?.standIn.consumptionRefusals ?? 0
        check("consumption_answered_once", verdict.passed,
              verdict.detail + " (\(soak.report.consumption_refusals) refused by the stand-in's injected outages and answered again)")
    }

    struct Dump: Equatable { var rows: [String] }

    /// Every row of every sink table as JSON text without the wall-clock columns, sorted.
    static func dump(_ c: PostgresConnection, logger: Logger) async throws -> [String: Dump] {
        let strip = wallClockColumns.map { " - '\($0)'" }.joined()
        var result: [String: Dump] = [:]
        for table in tables {
            var rows: [String] = []
            let sql = "SELECT (to_jsonb(t)\(strip))::text AS r FROM \(table) t ORDER BY 1"
            for try await row in try await c.query(PostgresQuery(unsafeSQL: sql), logger: logger).decode(String.self) { rows.append(row) }
            result[table] = Dump(rows: rows)
        }
        return result
    }

    private func credits(_ c: PostgresConnection, logger: Logger) async throws -> [String: Int] {
        var out: [String: Int] = [:]
        let rows = try await c.query("SELECT environment || '/' || transaction_id, count(*)::bigint FROM consumable_ledger WHERE entry = 'credit' GROUP BY 1", logger: logger)
        for try await (key, n) in rows.decode((String, Int64).self) { out[key] = Int(n) }
        return out
    }

    /// Every record of the rejected topic: original input bytes -> the reasons it was rejected with.
    private func readRejected(bootstrap: String) async throws -> (reasons: [[UInt8]: Set<String>], records: Int, complete: Bool) {
        let admin = KafkaAdmin(configuration: KafkaConfiguration(bootstrapServers: bootstrap, clientId: "fleet-chaos-check"))
        let lags = try await admin.consumerLag(groupId: "fleet-chaos-observer", topics: [FleetTopics.rejected])
        let total = Int(lags.reduce(Int64(0)) { $0 + $1.highWatermark - $1.lowWatermark })
        let retainedAll = lags.allSatisfy { $0.lowWatermark == 0 }
        let consumer = try KafkaConsumer(
            configuration: KafkaConfiguration(bootstrapServers: bootstrap, clientId: "fleet-chaos-check"),
            groupId: "fleet-chaos-check-\(UUID().uuidString.prefix(6))", topics: [FleetTopics.rejected])
        var reasons: [[UInt8]: Set<String>] = [:]
        var seen = 0
        let deadline = ContinuousClock.now + .seconds(120)
        while seen < total && ContinuousClock.now < deadline {
            for m in try await consumer.nextBatch(maxMessages: 1000, timeout: .milliseconds(500)) {
                seen += 1
                let reason = m.headers.first { $0.key == FleetHeaders.reason }.map { String(decoding: $0.value, as: UTF8.self) } ?? "?"
                reasons[m.value, default: []].insert(reason)
            }
        }
        _ = await consumer.close(deadline: .seconds(5))
        return (reasons, seen, retainedAll && seen >= total)
    }

    /// Log lines of every process that report an offset reset: our own `offset_reset` error, or librdkafka's
    /// "offset reset" line.
    private func logLines(containing marker: String) -> [String] {
        let logs = ((try? FileManager.default.contentsOfDirectory(atPath: soak.directory)) ?? []).filter { $0.hasSuffix(".log") }
        return logs.sorted().flatMap { file -> [String] in
            guard let text = try? String(contentsOfFile: soak.directory + "/" + file, encoding: .utf8) else { return [] }
            return text.split(separator: "\n").filter { $0.contains(marker) }.map { "\(file): \($0)" }
        }
    }

    private func offsetResetLines() -> (files: Int, lines: [String]) {
        let logs = ((try? FileManager.default.contentsOfDirectory(atPath: soak.directory)) ?? []).filter { $0.hasSuffix(".log") }
        var found: [String] = []
        for file in logs.sorted() {
            guard let text = try? String(contentsOfFile: soak.directory + "/" + file, encoding: .utf8) else { continue }
            for line in text.split(separator: "\n") {
                let lower = line.lowercased()
                guard lower.contains("offset_reset") || lower.contains("offset reset") else { continue }
                found.append("\(file): \(line)")
            }
        }
        return (logs.count, found)
    }
}
