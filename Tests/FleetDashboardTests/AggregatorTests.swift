import EntitlementDomain
import Foundation
import Testing

@testable import FleetDashboard

@Suite("Dashboard aggregation")
struct AggregatorTests {
    let later = baseTime + 400 * day  // "now" for active judgements: after every window below unless stated

    @Test("a replayed event (same eventId) is counted once, in events and byKind")
    func duplicates() {
        var a = DashboardAggregator()
        let e = event("e1", validUntil: later + day)
        #expect(a.ingest(e) == .counted)
        #expect(a.ingest(e) == .duplicate)
        #expect(a.ingest(e) == .duplicate)
        let s = a.summary(now: baseTime)
        #expect(s.events == 1)
        #expect(s.byKind == ["SUBSCRIPTION_STARTED": 1])
        #expect(s.records.result == 3)
        #expect(s.records.duplicates == 2)
        #expect(s.activeEntitlements == ["premium": 1])
    }

    @Test("a stale event (signed before the entitlement's last applied one) changes nothing but is counted")
    func stale() {
        var a = DashboardAggregator()
        a.ingest(event("grant", signed: baseTime + 10, validUntil: later + day))
        // A revoke signed earlier than the grant arrives late: stale, the entitlement stays active.
        #expect(a.ingest(event("old-revoke", kind: "REFUNDED", effect: .revoke, signed: baseTime)) == .stale)
        let s = a.summary(now: later)
        #expect(s.events == 2)
        #expect(s.stale == 1)
        #expect(s.activeEntitlements == ["premium": 1])
    }

    @Test("ordering: revoke ends access, restore resumes it, an expired window is not active now")
    func ordering() {
        var a = DashboardAggregator()
        a.ingest(event("g", signed: baseTime, validUntil: baseTime + 30 * day))
        #expect(a.summary(now: baseTime + day).activeEntitlements == ["premium": 1])
        #expect(a.summary(now: baseTime + 31 * day).activeEntitlements.isEmpty, "expired: not entitled now")
        a.ingest(event("x", kind: "SUBSCRIPTION_RENEWED", effect: .extend, signed: baseTime + 30 * day, transactionId: "tx-2",
                       validUntil: baseTime + 60 * day))
        #expect(a.summary(now: baseTime + 31 * day).activeEntitlements == ["premium": 1])
        a.ingest(event("r", kind: "REFUNDED", effect: .revoke, signed: baseTime + 32 * day, transactionId: "tx-2"))
        #expect(a.summary(now: baseTime + 33 * day).activeEntitlements.isEmpty)
        a.ingest(event("u", kind: "REFUND_REVERSED", effect: .restore, signed: baseTime + 34 * day, transactionId: "tx-2"))
        #expect(a.summary(now: baseTime + 35 * day).activeEntitlements == ["premium": 1])
        // An extend never moves validUntil earlier.
        a.ingest(event("x2", kind: "SUBSCRIPTION_RENEWED", effect: .extend, signed: baseTime + 36 * day, transactionId: "tx-3",
                       validUntil: baseTime + 40 * day))
        #expect(a.summary(now: baseTime + 50 * day).activeEntitlements == ["premium": 1])
        let life = a.summary(now: baseTime).environments["Production"]!.lifecycleByDay
        #expect(life.reduce(0) { $0 + $1.starts } == 1)
        #expect(life.reduce(0) { $0 + $1.renewals } == 2)
        #expect(life.reduce(0) { $0 + $1.refunds } == 1)
    }

    @Test("a refund of an earlier billing period does not end current access")
    func refundOfEarlierPeriod() {
        var a = DashboardAggregator()
        a.ingest(event("g", signed: baseTime, transactionId: "tx-1", validUntil: baseTime + 30 * day))
        a.ingest(event("x", kind: "SUBSCRIPTION_RENEWED", effect: .extend, signed: baseTime + 30 * day, transactionId: "tx-2",
                       validUntil: baseTime + 60 * day))
        a.ingest(event("r", kind: "REFUNDED", effect: .revoke, signed: baseTime + 31 * day, transactionId: "tx-1",
                       expiresDate: baseTime + 30 * day))
        #expect(a.summary(now: baseTime + 32 * day).activeEntitlements == ["premium": 1])
    }

    @Test("an upgrade ends the other tier of the same subscription")
    func upgrade() {
        var a = DashboardAggregator()
        a.ingest(event("basic", signed: baseTime, product: "basic.monthly", entitlement: "basic", validUntil: baseTime + 30 * day))
        a.ingest(event("pro", kind: "SUBSCRIPTION_UPGRADED", signed: baseTime + day, product: "pro.monthly", entitlement: "pro",
                       transactionId: "tx-2", validUntil: baseTime + 31 * day))
        let s = a.summary(now: baseTime + 2 * day)
        #expect(s.activeEntitlements == ["pro": 1])
        #expect(s.environments["Production"]!.activeByProduct == ["pro.monthly": 1])
    }

    @Test("per-minute buckets: counts per kind, only the last `minutes` minutes are kept")
    func minuteBuckets() {
        var limits = DashboardAggregator.Limits()
        limits.minutes = 5
        var a = DashboardAggregator(limits: limits)
        let m0 = baseTime - baseTime % 60_000
        a.ingest(event("a", verifiedAt: m0 + 1_000, subject: "s1"))
        a.ingest(event("b", verifiedAt: m0 + 59_000, subject: "s2"))
        a.ingest(event("c", kind: "SUBSCRIPTION_RENEWED", effect: .extend, verifiedAt: m0 + 60_000, subject: "s3"))
        var s = a.summary(now: m0 + 60_000)
        var minutes = s.environments["Production"]!.perMinute
        #expect(minutes.count == 5)
        #expect(minutes.last!.t == m0 + 60_000)
        #expect(minutes.last!.byKind == ["SUBSCRIPTION_RENEWED": 1])
        #expect(minutes[3].t == m0)
        #expect(minutes[3].byKind == ["SUBSCRIPTION_STARTED": 2])
        // Ten minutes later the old buckets fall out of the window; totals are kept.
        a.ingest(event("d", verifiedAt: m0 + 600_000, subject: "s4"))
        s = a.summary(now: m0 + 600_000)
        minutes = s.environments["Production"]!.perMinute
        #expect(minutes.count == 5)
        #expect(minutes.map { $0.byKind.values.reduce(0, +) }.reduce(0, +) == 1)
        #expect(s.events == 4)
        // A late event older than the window still counts in the totals, not in a bucket.
        a.ingest(event("late", verifiedAt: m0, subject: "s5"))
        s = a.summary(now: m0 + 600_000)
        #expect(s.events == 5)
        #expect(s.environments["Production"]!.perMinute.map { $0.byKind.values.reduce(0, +) }.reduce(0, +) == 1)
    }

    @Test("bounded: days, kinds and latest events are capped; totals stay exact")
    func bounded() {
        var limits = DashboardAggregator.Limits()
        limits.days = 7
        limits.maxKeys = 10
        limits.latest = 5
        var a = DashboardAggregator(limits: limits)
        for i in 0..<100 {
            a.ingest(event("e\(i)", kind: "KIND_\(i % 30)", effect: .info, signed: baseTime + Int64(i) * day, subject: "s\(i)"))
        }
        let s = a.summary(now: baseTime)
        let env = s.environments["Production"]!
        #expect(s.events == 100)
        #expect(s.byKind.count == 11)
        #expect(s.byKind[DashboardAggregator.other] == 100 - 10 * 4)
        #expect(s.byKind.values.reduce(0, +) == 100)
        #expect(env.lifecycleByDay.count == 7)
        #expect(env.lifecycleByDay.last!.day == DashboardAggregator.day(baseTime + 99 * day))
        #expect(env.latest.count == 5)
        #expect(env.latest.first!.eventId == "e99", "newest first")
    }

    @Test("the eventId filter is exact within its window and still catches old ids beyond it")
    func seenFilter() {
        var f = SeenFilter(exactCapacity: 100, bloomBits: 1 << 16)
        var accepted = 0
        for i in 0..<1000 where f.insert("id-\(i)") { accepted += 1 }
        #expect(f.exactCount == 100)
        #expect(f.filtered == 900)
        #expect(f.approximate)
        // 900 ids in 65,536 bits with k = 7: a false positive is rare; allow a few rather than none.
        #expect(accepted >= 995)
        var again = 0
        for i in 0..<1000 where f.insert("id-\(i)") { again += 1 }
        #expect(again == 0, "no id is ever counted twice (a Bloom filter has no false negatives)")
        let exact = SeenFilter(exactCapacity: 10)
        #expect(!exact.approximate)
    }

    @Test("revenue per currency per day, once per transaction; consumable units credited and debited")
    func revenueAndUnits() {
        var a = DashboardAggregator()
        a.ingest(event("n", signed: baseTime, transactionId: "t1", validUntil: later, price: 4990))
        a.ingest(event("t", kind: "SUBSCRIPTION_OBSERVED", effect: .extend, signed: baseTime + 1, transactionId: "t1", price: 4990))
        a.ingest(event("e", signed: baseTime + 2, subject: "s2", transactionId: "t2", originalTransactionId: "o2", validUntil: later,
                       price: 3990, currency: "EUR"))
        for (i, pct) in [nil, 50_000].enumerated() {
            a.ingest(event("g\(i)", kind: "ONE_TIME_PURCHASED", signed: baseTime, product: "gems", productType: "Consumable",
                           entitlement: nil, transactionId: "c\(i)", units: 100))
            a.ingest(event("r\(i)", kind: "REFUNDED", effect: .revoke, signed: baseTime + 5, product: "gems",
                           productType: "Consumable", entitlement: nil, transactionId: "c\(i)", units: 100,
                           revocationPercentage: pct))
        }
        // The same purchase and refund again as other events (a notification and the transaction JWS): the ledger,
        // like the sink's, credits once per transaction and debits once per revocation.
        a.ingest(event("g0-txn", kind: "ONE_TIME_PURCHASED", signed: baseTime, product: "gems", productType: "Consumable",
                       entitlement: nil, transactionId: "c0", units: 100))
        a.ingest(event("r0-txn", kind: "REFUNDED", effect: .revoke, signed: baseTime + 5, product: "gems",
                       productType: "Consumable", entitlement: nil, transactionId: "c0", units: 100))
        let env = a.summary(now: baseTime).environments["Production"]!
        #expect(env.revenueByDay == [RevenueDay(day: DashboardAggregator.day(baseTime), byCurrency: ["USD": 4990, "EUR": 3990])])
        #expect(env.consumables["gems"]?.credited == 200)
        #expect(env.consumables["gems"]?.debited == 150)
    }

    @Test("rejections by reason header; environments kept apart, Production shown by default")
    func rejectedAndEnvironments() {
        var a = DashboardAggregator()
        a.ingestRejected(reason: "INVALID_SIGNATURE", timestamp: baseTime)
        a.ingestRejected(reason: "INVALID_SIGNATURE", timestamp: nil)
        a.ingestRejected(reason: nil, timestamp: baseTime)
        a.ingest(event("s", environment: "Sandbox", validUntil: later))
        var s = a.summary(now: baseTime)
        #expect(s.rejected == ["INVALID_SIGNATURE": 2, "(missing)": 1])
        #expect(s.rejectedTotal == 3)
        #expect(s.defaultEnvironment == "Sandbox")
        a.ingest(event("p", subject: "other", environment: "Production", validUntil: later))
        s = a.summary(now: baseTime)
        #expect(s.defaultEnvironment == "Production")
        #expect(s.activeEntitlements == ["premium": 2])
        #expect(s.environments["Sandbox"]!.activeEntitlements == ["premium": 1])
        #expect(s.events == 2)
    }

    @Test("the page shows the total with thousands separators and loads nothing from elsewhere")
    func page() {
        #expect(DashboardPage.grouped(1_234_567) == "1,234,567")
        #expect(DashboardPage.grouped(999) == "999")
        #expect(DashboardPage.grouped(-1000) == "-1,000")
        var s = DashboardSummary()
        s.events = 12_345
        s.environments["Production"] = nil
        let html = DashboardPage.render(s)
        #expect(html.contains(#"id="total-events" data-testid="total-events">12,345<"#))
        // No external resource: every URL in the page is the SVG namespace name (an identifier, never fetched).
        let urls = html.components(separatedBy: "http").dropFirst().map { "http" + $0.prefix(30) }
        #expect(urls.allSatisfy { $0.hasPrefix("http://www.w3.org/2000/svg") }, "\(urls)")
        #expect(!html.contains("src=\""))
        // Data cannot close the script element it is embedded in.
        s.byKind["</script><b>"] = 1
        #expect(!DashboardPage.render(s).contains("</script><b>"))
    }
}
