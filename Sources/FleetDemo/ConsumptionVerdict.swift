import FleetDevStack
import Logging
import PostgresNIO

/// The judgement of the responder's work, by the demo and the chaos soak: every CONSUMPTION_REQUEST of the traffic
/// recorded once and settled (answered exactly once, or expired unanswered), nothing pending or refused, no
/// transaction answered twice, no answer that no row explains, and rows left `sending` only as many as the responder
/// was killed.
struct ConsumptionVerdict {
    typealias Row = (uuid: String, transactionId: String, state: String)
    let passed: Bool
    let detail: String
    let byState: [String: Int]

    init(expected: Set<String>, rows: [Row], calls: [String: Int], responderKills: Int) {
        var byState: [String: Int] = [:]
        for row in rows { byState[row.state, default: 0] += 1 }
        self.byState = byState
        let recorded = Set(rows.map(\.uuid))
        let missing = expected.subtracting(recorded).count, unexplained = recorded.subtracting(expected).count
        let sentWrong = rows.filter { $0.state == "sent" && calls[$0.transactionId] != 1 }.count
        let unsentCalled = rows.filter { ($0.state == "expired" || $0.state == "pending") && calls[$0.transactionId] != nil }.count
        let rowTransactions = Set(rows.map(\.transactionId))
        let strayCalls = calls.keys.filter { !rowTransactions.contains($0) }.count
        let twice = calls.values.filter { $0 > 1 }.count
        let leftSending = byState["sending", default: 0]
        let answered = byState["sent", default: 0]
        let pending = byState["pending", default: 0], refused = byState["failed", default: 0]
        passed = missing == 0 && unexplained == 0 && sentWrong == 0 && unsentCalled == 0 && strayCalls == 0 && twice == 0
            && pending == 0 && refused == 0 && leftSending <= responderKills && !expected.isEmpty && answered > 0
        detail = "consumption requests: \(recorded.count) recorded (\(expected.count) in the traffic, \(missing) missing, \(unexplained) unexplained): \(answered) answered, \(byState["expired", default: 0]) expired, \(leftSending) left sending by \(responderKills) responder kill(s), \(pending) pending, \(refused) refused; the App Store API received \(calls.values.reduce(0, +)) answer(s): \(twice) transaction(s) answered twice, \(sentWrong) sent row(s) without exactly one answer, \(unsentCalled + strayCalls) answer(s) no row explains"
    }

    /// `consumption_answers` as the verdict reads it.
    static func rows(_ db: PostgresConnection, logger: Logger) async throws -> [Row] {
        var rows: [Row] = []
        for try await row in try await db.query("SELECT notification_uuid, transaction_id, state FROM consumption_answers", logger: logger)
            .decode((String, String, String).self) { rows.append((row.0, row.1, row.2)) }
        return rows
    }

    /// The answers the App Store API received, counted by transaction.
    static func answersByTransaction(_ calls: [AppleAPIStandIn.ConsumptionCall]) -> [String: Int] {
        Dictionary(grouping: calls, by: \.transactionId).mapValues(\.count)
    }
}
