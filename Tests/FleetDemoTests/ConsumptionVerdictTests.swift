import Testing

@testable import FleetDemo

/// The chaos soak's check of the responder: it must fail on each way the responder could go wrong.
struct ConsumptionVerdictTests {
    let expected: Set<String> = ["u1", "u2", "u3"]
    let settled: [ConsumptionVerdict.Row] = [("u1", "t1", "sent"), ("u2", "t2", "sent"), ("u3", "t3", "expired")]
    let answers = ["t1": 1, "t2": 1]

    @Test func answeredOnceAndExpiredUnansweredPasses() {
        let v = ConsumptionVerdict(expected: expected, rows: settled, calls: answers, responderKills: 0)
        #expect(v.passed, "\(v.detail)")
        #expect(v.byState == ["sent": 2, "expired": 1])
    }

    @Test func aTransactionAnsweredTwiceFails() {
        let v = ConsumptionVerdict(expected: expected, rows: settled, calls: ["t1": 2, "t2": 1], responderKills: 3)
        #expect(!v.passed)
        #expect(v.detail.contains("1 transaction(s) answered twice"), "\(v.detail)")
    }

    @Test func aRequestNeverRecordedFails() {
        let v = ConsumptionVerdict(expected: expected, rows: Array(settled.prefix(2)), calls: answers, responderKills: 0)
        #expect(!v.passed)
        #expect(v.detail.contains("1 missing"), "\(v.detail)")
    }

    @Test func aRowLeftSendingIsExplainedOnlyByAKill() {
        var rows = settled
        rows[1].state = "sending"
        #expect(!ConsumptionVerdict(expected: expected, rows: rows, calls: answers, responderKills: 0).passed)
        #expect(ConsumptionVerdict(expected: expected, rows: rows, calls: answers, responderKills: 1).passed)
    }

    @Test func pendingRefusedOrUnexplainedAnswersFail() {
        var pending = settled
        pending[0].state = "pending"
        #expect(!ConsumptionVerdict(expected: expected, rows: pending, calls: ["t2": 1], responderKills: 0).passed)
        var refused = settled
        refused[0].state = "failed"
        #expect(!ConsumptionVerdict(expected: expected, rows: refused, calls: ["t2": 1], responderKills: 0).passed)
        #expect(!ConsumptionVerdict(expected: expected, rows: settled, calls: answers.merging(["t3": 1]) { a, _ in a }, responderKills: 0).passed,
                "an answer for an expired request")
        #expect(!ConsumptionVerdict(expected: expected, rows: settled, calls: answers.merging(["t9": 1]) { a, _ in a }, responderKills: 0).passed,
                "an answer no row explains")
        #expect(!ConsumptionVerdict(expected: expected, rows: settled, calls: ["t1": 1], responderKills: 0).passed,
                "a row recorded as sent that the App Store never received")
    }

    @Test func nothingAnsweredFails() {
        let rows: [ConsumptionVerdict.Row] = [("u1", "t1", "expired"), ("u2", "t2", "expired"), ("u3", "t3", "expired")]
        #expect(!ConsumptionVerdict(expected: expected, rows: rows, calls: [:], responderKills: 0).passed)
    }
}
