import Foundation
import Testing

@testable import fleet

@Suite("fleet dashboard command line")
struct DashboardCommandTests {
    @Test("exactly the documented flags parse; the exclusive and malformed ones fail with a clear message")
    func flags() throws {
        let ok = try Fleet.parseAsRoot(["dashboard", "--bootstrap-servers", "b:9092", "--result-topic", "t", "--rejected-topic", "r",
                                        "--port", "8081", "--since", "6h"])
        let d = try #require(ok as? Dashboard)
        #expect(d.bootstrapServers == "b:9092" && d.resultTopic == "t" && d.rejectedTopic == "r" && d.port == 8081)
        _ = try Fleet.parseAsRoot(["dashboard", "--bootstrap-servers", "b:9092", "--from-beginning"])
        for (args, message) in [
            (["--from-beginning", "--since", "1h"], "exclude each other"),
            (["--since", "yesterday"], "invalid --since 'yesterday'"),
            (["--port", "70000"], "invalid --port 70000"),
        ] {
            do {
                _ = try Fleet.parseAsRoot(["dashboard", "--bootstrap-servers", "b"] + args)
                Issue.record("\(args) parsed")
            } catch {
                #expect(Fleet.message(for: error).contains(message), "\(Fleet.message(for: error))")
            }
        }
        #expect(throws: (any Error).self) { _ = try Fleet.parseAsRoot(["dashboard", "--group", "g"]) }
    }

    @Test("--help says where reading starts by default")
    func help() {
        let help = Fleet.helpMessage(for: Dashboard.self)
        #expect(help.contains("from the beginning"))
        #expect(help.contains("--since"))
    }

    @Test("--since: ISO 8601, a date, epoch milliseconds or an age")
    func since() throws {
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        #expect(Dashboard.parseSince("2026-11-23T09:00:00Z", now: now) == Date(timeIntervalSince1970: 1_795_424_400))
        #expect(Dashboard.parseSince("2026-11-23T09:00:00.500Z", now: now) == Date(timeIntervalSince1970: 1_795_424_400.5))
        #expect(Dashboard.parseSince("2026-11-23", now: now) == Date(timeIntervalSince1970: 1_795_392_000))
        #expect(Dashboard.parseSince("1795424400000", now: now) == Date(timeIntervalSince1970: 1_795_424_400))
        #expect(Dashboard.parseSince("90m", now: now) == now.addingTimeInterval(-5400))
        #expect(Dashboard.parseSince("2d", now: now) == now.addingTimeInterval(-172_800))
        for bad in ["", "soon", "-5m", "2026-13-01", "5y"] { #expect(Dashboard.parseSince(bad, now: now) == nil, "\(bad)") }
    }
}
