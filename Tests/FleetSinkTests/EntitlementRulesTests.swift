import EntitlementDomain
import EntitlementRules
import FleetTestSupport
import Testing

/// The sink's entitlement rules without PostgreSQL: `EntitlementRules.fold` over in-memory rows, batch after batch, the
/// way the sink carries the rows it wrote into the next batch's reads. (The database tests in ApplierTests cover the
/// SQL that loads and writes these rows.)
@Suite("Entitlement rules (no database)")
struct EntitlementRulesTests {
    /// The rows and ledgers a database would hold between batches.
    struct Store {
        var rows: [EntitlementKey: EntitlementRow] = [:]
        var ledgers: [LedgerKey: LedgerState] = [:]

        /// Folds one batch (in signedDate order, as the sink sorts it) and keeps what it decided; returns the status
        /// of every event by id.
        @discardableResult
        mutating func apply(_ events: [EntitlementEvent]) -> [String: EventStatus] {
            let ordered = events.enumerated().sorted { ($0.element.signedDate, $0.offset) < ($1.element.signedDate, $1.offset) }.map(\.element)
            let decision = EntitlementRules.fold(ordered, entitlements: rows, ledgers: ledgers)
            for (key, row) in decision.changedRows { rows[key] = row }
            for (key, entry) in decision.newLedgerEntries { ledgers[key, default: LedgerState()].entries.append(entry) }
            for e in ordered where e.effect == .restore { if let key = e.ledgerKey { ledgers[key, default: LedgerState()].latestRestore = max(ledgers[key]?.latestRestore ?? e.signedDate, e.signedDate) } }
            return Dictionary(zip(ordered.map(\.eventId), decision.statuses), uniquingKeysWith: { a, _ in a })
        }

        func row(_ entitlement: String = "premium", subject: String = "otx-1", environment: String = "Sandbox") -> EntitlementRow? {
            rows[EntitlementKey(environment: environment, subject: subject, entitlement: entitlement)]
        }

        /// Units x 100000, summed over the ledger of a transaction.
        func balance(_ transactionId: String, environment: String = "Sandbox") -> Int64 {
            ledgers[LedgerKey(environment: environment, transactionId: transactionId)]?.entries.reduce(0) { $0 + $1.scaledAmount } ?? 0
        }
    }

    let t = baseTime

    var buy: EntitlementEvent {
        makeEvent("buy", kind: "SUBSCRIPTION_STARTED", effect: .grant, signed: t, validFrom: t, validUntil: t + 30 * day,
                  notificationType: "SUBSCRIBED", subtype: "INITIAL_BUY")
    }

    @Test("a refund revokes; its reversal restores the window")
    func refundReversedRestores() {
        var store = Store()
        store.apply([buy])
        let refund = makeEvent("refund", kind: "REFUNDED", effect: .revoke, signed: t + 5 * day, validUntil: t + 30 * day,
                               revocationDate: t + 5 * day, notificationType: "REFUND")
        #expect(store.apply([refund])["refund"] == .applied)
        #expect(store.row()?.active == false)
        #expect(store.row()?.revokedAt == t + 5 * day)
        let reversed = makeEvent("reversed", kind: "REFUND_REVERSED", effect: .restore, signed: t + 6 * day,
                                 validUntil: t + 30 * day, notificationType: "REFUND_REVERSED")
        #expect(store.apply([reversed])["reversed"] == .applied)
        #expect(store.row()?.active == true)
        #expect(store.row()?.revokedAt == nil)
        #expect(store.row()?.validUntil == t + 30 * day)
    }

    @Test("a renewal signed before a refund but delivered after it is stale and leaves access revoked")
    func lateRenewalAfterRefundStaysRevoked() {
        var store = Store()
        store.apply([buy])
        store.apply([makeEvent("refund", kind: "REFUNDED", effect: .revoke, signed: t + 31 * day, transactionId: "tx-2",
                               validUntil: t + 60 * day, revocationDate: t + 31 * day, notificationType: "REFUND")])
        let late = makeEvent("renew", kind: "SUBSCRIPTION_RENEWED", effect: .extend, signed: t + 30 * day, transactionId: "tx-2",
                             validFrom: t + 30 * day, validUntil: t + 60 * day, notificationType: "DID_RENEW")
        #expect(store.apply([late])["renew"] == .stale)
        #expect(store.row()?.active == false)
        #expect(store.row()?.lastEventId == "refund")
    }

    @Test("within a batch events apply in signedDate order; an older event of a key is stale")
    func staleIsRecorded() {
        var store = Store()
        let renew = makeEvent("renew", kind: "SUBSCRIPTION_RENEWED", effect: .extend, signed: t + 30 * day, transactionId: "tx-2",
                              validFrom: t + 30 * day, validUntil: t + 60 * day)
        let statuses = store.apply([renew, buy])  // delivered out of order, in one batch
        #expect(statuses == ["buy": .applied, "renew": .applied])
        #expect(store.row()?.validUntil == t + 60 * day)
        let old = makeEvent("old", kind: "SUBSCRIPTION_OBSERVED", effect: .extend, signed: t + 10 * day, validUntil: t + 30 * day)
        #expect(store.apply([old])["old"] == .stale)
        #expect(store.row()?.validUntil == t + 60 * day, "a stale event changes nothing")
    }

    @Test("an upgrade grants the new tier and supersedes the old one of the same subscription")
    func upgradeSupersedes() {
        var store = Store()
        store.apply([buy])
        let upgrade = makeEvent("upgrade", kind: "PLAN_UPGRADED", effect: .grant, signed: t + 10 * day,
                                product: "com.example.pro.monthly", entitlement: "pro", transactionId: "tx-2",
                                validFrom: t + 10 * day, validUntil: t + 40 * day, notificationType: "DID_CHANGE_RENEWAL_PREF",
                                subtype: "UPGRADE")
        #expect(store.apply([upgrade])["upgrade"] == .applied)
        #expect(store.row("pro")?.active == true)
        #expect(store.row("premium")?.active == false)
        #expect(store.row("premium")?.revocationReason == "superseded_by:com.example.pro.monthly")
        #expect(store.row("premium")?.revokedAt == t + 10 * day)
        let lateOldTier = makeEvent("late", kind: "SUBSCRIPTION_RENEWED", effect: .extend, signed: t + 5 * day,
                                    validUntil: t + 30 * day)
        #expect(store.apply([lateOldTier])["late"] == .stale)
        #expect(store.rows.values.filter(\.active).count == 1)
    }

    @Test("a refund of an earlier billing period changes no access; a refund of the granting period revokes")
    func refundOfEarlierPeriod() {
        var store = Store()
        let renew = makeEvent("renew", kind: "SUBSCRIPTION_RENEWED", effect: .extend, signed: t + 30 * day, transactionId: "tx-2",
                              validFrom: t + 30 * day, validUntil: t + 60 * day)
        store.apply([buy, renew])
        let oldRefund = makeEvent("refund-1", kind: "REFUNDED", effect: .revoke, signed: t + 35 * day, transactionId: "tx-1",
                                  validFrom: t, validUntil: t + 30 * day, revocationDate: t + 35 * day)
        #expect(store.apply([oldRefund])["refund-1"] == .applied)
        #expect(store.row()?.active == true)
        #expect(store.row()?.lastEventId == "renew")
        let currentRefund = makeEvent("refund-2", kind: "REFUNDED", effect: .revoke, signed: t + 36 * day, transactionId: "tx-2",
                                      validFrom: t + 30 * day, validUntil: t + 60 * day, revocationDate: t + 36 * day)
        store.apply([currentRefund])
        #expect(store.row()?.active == false)
    }

    @Test("a family-sharing revoke ends the family member's access")
    func familyRevoke() {
        var store = Store()
        let shared = makeEvent("shared", kind: "SUBSCRIPTION_STARTED", effect: .grant, signed: t, subject: "family-member",
                               validFrom: t, validUntil: t + 30 * day)
        store.apply([shared])
        #expect(store.row(subject: "family-member")?.active == true)
        let revoke = makeEvent("revoke", kind: "FAMILY_SHARING_REVOKED", effect: .revoke, signed: t + 3 * day,
                               subject: "family-member", validUntil: t + 30 * day, notificationType: "REVOKE")
        #expect(store.apply([revoke])["revoke"] == .applied)
        #expect(store.row(subject: "family-member")?.active == false)
        #expect(store.row(subject: "family-member")?.revocationReason == "FAMILY_SHARING_REVOKED")
    }

    func gems(_ id: String, _ effect: EntitlementEffect, _ signed: Int64, revocation: Int64? = nil, pct: Int? = nil) -> EntitlementEvent {
        makeEvent(id, kind: effect == .grant ? "CONSUMABLE_PURCHASED" : effect == .revoke ? "CONSUMABLE_REFUNDED" : "CONSUMABLE_REFUND_REVERSED",
                  effect: effect, signed: signed, product: "com.example.gems.100", productType: "Consumable", entitlement: nil,
                  transactionId: "gem-tx", originalTransactionId: "gem-tx", revocationDate: revocation, revocationPercentage: pct,
                  units: 100, quantity: 2)
    }

    @Test("consumables: credited once however often delivered; a refund debits once; its reversal re-credits once")
    func consumableOnce() {
        var store = Store()
        #expect(store.apply([gems("c1", .grant, t)])["c1"] == .applied)
        for i in 2...5 { #expect(store.apply([gems("c\(i)", .grant, t + Int64(i))])["c\(i)"] == .duplicate) }
        #expect(store.balance("gem-tx") == 100 * 100_000, "the event's units (the mapper multiplied them by the quantity), credited once")
        #expect(store.apply([gems("r1", .revoke, t + day, revocation: t + day)])["r1"] == .applied)
        #expect(store.apply([gems("r1-again", .revoke, t + day + 1, revocation: t + day)])["r1-again"] == .duplicate)
        #expect(store.balance("gem-tx") == 0)
        #expect(store.apply([gems("rr", .restore, t + 2 * day)])["rr"] == .applied)
        #expect(store.apply([gems("rr-again", .restore, t + 2 * day + 1)])["rr-again"] == .duplicate)
        #expect(store.balance("gem-tx") == 100 * 100_000)
        // A partial refund debits its share (revocationPercentage in thousandths of a percent).
        var partial = Store()
        partial.apply([gems("c", .grant, t), gems("half", .revoke, t + day, revocation: t + day, pct: 50_000)])
        #expect(partial.balance("gem-tx") == 50 * 100_000)
    }

    @Test("consumables: a reversal delivered before any refund is stale and credits nothing")
    func consumableReversalFirst() {
        var store = Store()
        store.apply([gems("c", .grant, t)])
        #expect(store.apply([gems("rr", .restore, t + 2 * day)])["rr"] == .stale, "nothing to re-credit yet")
        #expect(store.balance("gem-tx") == 100 * 100_000)
    }
}
