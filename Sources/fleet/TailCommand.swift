import AppStoreVerification
import ArgumentParser
import EntitlementDomain
import FleetKafka
import FleetOperations
import Foundation

/// `fleet tail`: a live, compact view of the result topic — what the dashboards see.
struct Tail: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print entitlement events from the result topic as they arrive.")

    @Option(help: "Kafka bootstrap servers.")
    var bootstrapServers: String

    @Option(help: "Result topic.")
    var topic: String = FleetTopics.result

    @Flag(help: "Print each event's raw JSON, one per line.")
    var json = false

    @Flag(help: "Start from the beginning of the topic instead of new events only.")
    var fromBeginning = false

    @Option(help: "Stop after this many events.")
    var max: Int?

    @Option(help: "Stop after this many seconds without a new event.")
    var idleTimeout: Double?

    @Option(name: .customLong("kafka-property"), help: "Any librdkafka property, key=value (repeatable).")
    var kafkaProperties: [String] = []

    func run() async throws {
        FleetLogging.bootstrap(format: "text", level: "warning")
        var props: [String: String] = [:]
        for p in kafkaProperties {
            guard let eq = p.firstIndex(of: "=") else { throw ValidationError("--kafka-property needs key=value, got '\(p)'") }
            props[String(p[..<eq])] = String(p[p.index(after: eq)...])
        }
        // A private, throwaway group: tail never commits progress that a real consumer could rely on.
        var config = KafkaConfiguration(bootstrapServers: bootstrapServers, clientId: "fleet-tail", properties: props)
        config.autoOffsetReset = fromBeginning ? "earliest" : "latest"
        config.offsetResetPolicy = fromBeginning ? .earliest : .latest  // a viewer never blocks; resets are still logged
        let consumer = try KafkaConsumer(configuration: config, groupId: "fleet-tail-\(UUID().uuidString.prefix(8))", topics: [topic])
        let colour = !json && isatty(STDOUT_FILENO) == 1 && ProcessInfo.processInfo.environment["NO_COLOR"] == nil
            && ProcessInfo.processInfo.environment["TERM"] != "dumb"
        var seen = 0
        var lastEvent = ContinuousClock.now
        if !json { print(TailFormatter.header(colour: colour)) }
        outer: while true {
            let batch = try await consumer.nextBatch(maxMessages: 500, timeout: .milliseconds(250))
            for m in batch {
                if json {
                    print(String(decoding: m.value, as: UTF8.self))
                } else {
                    do {
                        let event = try EntitlementEvent(jsonBytes: m.value)
                        print(TailFormatter.line(event, colour: colour))
                    } catch {
                        print("(undecodable event at \(m.topic)[\(m.partition)]@\(m.offset): \(error))")
                    }
                }
                seen += 1
                lastEvent = .now
                if let max, seen >= max { break outer }
            }
            fflush(nil)
            if let idle = idleTimeout, ContinuousClock.now - lastEvent > .milliseconds(Int(idle * 1000)) { break }
        }
        fflush(nil)
        _ = await consumer.close(deadline: .seconds(5))
    }
}

enum TailFormatter {
    static func header(colour: Bool) -> String {
        let h = pad("SIGNED (UTC)", 20) + pad("KIND", 26) + pad("EFFECT", 8) + pad("PRODUCT", 30) + pad("SUBJECT", 38) + "VALID UNTIL"
        return colour ? "\u{1B}[1m\(h)\u{1B}[0m" : h
    }

    static func line(_ e: EntitlementEvent, colour: Bool) -> String {
        let effect = e.effect.rawValue
        let units = e.units.map { " x\($0)" } ?? ""
        let text = pad(date(e.signedDate), 20) + pad(e.kind, 26) + pad(effect, 8) + pad((e.productId ?? "-") + units, 30)
            + pad(e.subject ?? "-", 38) + (e.validUntil.map(date) ?? "-")
        guard colour else { return text }
        let code: String
        switch e.effect {
        case .grant, .restore: code = "32"
        case .extend: code = "36"
        case .revoke: code = "31"
        case .state: code = "33"
        case .info: code = "2"
        }
        return "\u{1B}[\(code)m\(text)\u{1B}[0m"
    }

    static func date(_ ms: Int64) -> String {
        let f = DateFormatter()
        f.locale = Locale(identifier: "en_US_POSIX")
        f.timeZone = TimeZone(identifier: "UTC")
        f.dateFormat = "yyyy-MM-dd HH:mm:ss"
        return f.string(from: EpochMillis.date(ms))
    }

    static func pad(_ s: String, _ n: Int) -> String {
        s.count >= n ? String(s.prefix(n - 1)) + " " : s + String(repeating: " ", count: n - s.count)
    }
}
