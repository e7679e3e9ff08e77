import AppStoreVerification
import EntitlementDomain
import FleetDevStack
import FleetKafka
import FleetTestSupport
import Foundation
import Testing

/// The README's commands beyond `fleet verify`, run through the built executable: tail, demo, benchmarks.
@Suite(.serialized)
struct PipelineCommandsTests {
    typealias Run = FleetBinary.Output

    /// Runs `fleet` with output to files (no pipe can fill up), killing it after `timeout`.
    static func fleet(_ args: [String], timeout: Duration) async throws -> Run {
        try await FleetBinary.run(args, timeout: timeout)
    }

    @Test func tailShowsEventsAsTheDashboardsSeeThem() async throws {
        let cluster = try EmbeddedKafkaCluster(brokers: 1)
        defer { cluster.shutdown() }
        try cluster.createTopic("entitlements.verified", partitions: 2)
        let producer = try KafkaProducer(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers))
        let kinds = ["SUBSCRIPTION_STARTED", "SUBSCRIPTION_RENEWED", "REFUNDED"]
        for (i, kind) in kinds.enumerated() {
            let e = EntitlementEvent(
                eventId: String(repeating: "\(i)", count: 32), kind: kind, effect: i == 2 ? .revoke : .grant, environment: "Sandbox",
                subject: "user-\(i)", productId: "com.example.pro.monthly", originalTransactionId: "100\(i)",
                validUntil: 1_760_000_000_000, signedDate: 1_759_000_000_000 + Int64(i), verifiedAt: 1_759_000_001_000,
                source: EventSource(topic: "appstore.raw", partition: 0, offset: Int64(i), inputKind: "notification"))
            _ = try await producer.send(OutgoingMessage(topic: "entitlements.verified", key: Array("100\(i)".utf8), value: e.jsonBytes()))
        }
        producer.close()
        let table = try await Self.fleet(["tail", "--bootstrap-servers", cluster.bootstrapServers, "--from-beginning",
                                          "--max", "3", "--idle-timeout", "30"], timeout: .seconds(60))
        #expect(table.status == 0, "\(table.stderr)")
        for kind in kinds { #expect(table.stdout.contains(kind)) }
        #expect(table.stdout.contains("REVOKE"))
        #expect(table.stdout.contains("2025-10-09"), "validUntil shown as a UTC date")
        #expect(!table.stdout.contains("\u{1B}["), "no colour when stdout is not a terminal")
        let json = try await Self.fleet(["tail", "--bootstrap-servers", cluster.bootstrapServers, "--from-beginning",
                                         "--json", "--max", "3", "--idle-timeout", "30"], timeout: .seconds(60))
        let events = try json.stdout.split(separator: "\n").map { try EntitlementEvent(jsonBytes: Array($0.utf8)) }
        #expect(Set(events.map(\.kind)) == Set(kinds))
    }

    @Test func demoRunsTheWholeStackAndStopsCleanly() async throws {
        let run = try await Self.fleet(["demo", "--subscribers", "12", "--months", "2", "--ticket-buyers", "6", "--rate", "300"],
                                       timeout: .seconds(240))
        #expect(run.status == 0, "stdout:\n\(run.stdout.suffix(3000))\nstderr:\n\(run.stderr.suffix(3000))")
        #expect(run.stdout.contains("== summary"))
        for reason in ["UNTRUSTED_CHAIN", "INVALID_SIGNATURE", "WRONG_BUNDLE_ID", "MALFORMED_JWS", "MALFORMED_RECEIPT", "UNSUPPORTED_ALGORITHM"] {
            #expect(run.stdout.contains(reason), "the summary counts \(reason)")
        }
        #expect(run.stdout.contains("SUBSCRIPTION_STARTED"))
        #expect(run.stdout.contains("active entitlements now"))
        #expect(run.stdout.contains("ticket balances"))
        // The responder answered the recent CONSUMPTION_REQUEST (the older ones are past Apple's window), once, and
        // the App Store API stand-in received exactly what it recorded as sent (the demo fails otherwise).
        let consumption = try #require(run.stdout.split(separator: "\n").first { $0.hasPrefix("consumption") }, "\(run.stdout)")
        #expect(consumption.contains(" 1 answered once") && consumption.contains("stand-in: 1)"), "\(consumption)")
        #expect(consumption.contains("0 refused"), "\(consumption)")
        #expect(run.stdout.contains("stopped"))
    }

    @Test func benchmarksPrintTheirFiguresAsJSON() async throws {
        let worker = try await Self.fleet(["bench", "worker", "--inputs", "1500", "--verify-seconds", "0.3"], timeout: .seconds(180))
        #expect(worker.status == 0, "\(worker.stdout)\n\(worker.stderr.suffix(2000))")
        let w = try #require(worker.lastJSON)
        for key in ["inputs_per_s", "events_per_s", "verify_notifications_per_s_single_thread", "rss_mb"] {
            #expect((w[key]?.int64Value ?? 0) > 0 || (w[key].map { if case .number(let d) = $0 { return d > 0 }; return false } ?? false), "\(key) in \(w)")
        }
        // The sink against a COPY of every row it wrote (several rows per event: the ceiling is per event, not per row).
        let sink = try await Self.fleet(["bench", "sink", "--events", "3000", "--batch-size", "500"], timeout: .seconds(240))
        #expect(sink.status == 0, "\(sink.stdout)\n\(sink.stderr.suffix(2000))")
        let k = try #require(sink.lastJSON)
        func number(_ key: String) -> Double {
            switch k[key] {
            case .integer(let v)?: return Double(v)
            case .number(let d)?: return d
            default: return 0
            }
        }
        for key in ["events_per_s", "p99_batch_ms", "copy_rows_per_s", "copy_events_per_s", "sink_to_copy_ratio",
                    "binary_copy_events_per_s", "sink_to_binary_copy_ratio"] {
            #expect(number(key) > 0, "\(key) in \(k)")
        }
        #expect(number("copy_rows_per_event") >= 3, "every table's rows are copied: \(k)")
        #expect(abs(number("sink_to_copy_ratio") - number("events_per_s") / number("copy_events_per_s")) < 0.01)
        #expect(abs(number("sink_to_binary_copy_ratio") - number("events_per_s") / number("binary_copy_events_per_s")) < 0.01)
        let pipeline = try await Self.fleet(["bench", "pipeline", "--burst", "300", "--rate", "200", "--seconds", "2"], timeout: .seconds(240))
        #expect(pipeline.status == 0, "\(pipeline.stdout)\n\(pipeline.stderr.suffix(2000))")
        let p = try #require(pipeline.lastJSON)
        for key in ["events_per_s", "p50_ms", "p99_ms", "verify_notifications_per_s_single_thread"] {
            #expect(p[key] != nil, "\(key) in \(p)")
        }
    }
}
