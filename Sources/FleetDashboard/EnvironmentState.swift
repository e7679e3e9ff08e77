import AppStoreVerification
import EntitlementDomain

extension DashboardAggregator {
    /// The aggregates of one environment (Production, Sandbox, ...).
    struct EnvState: Sendable {
        var events = 0
        var byKind: [String: Int] = [:]
        var perMinute: [Int64: [String: Int]] = [:]  // minute start (ms) -> kind -> n
        var lifecycle: [String: LifecycleDay] = [:]  // yyyy-MM-dd -> counts
        var revenue: [String: [String: Int64]] = [:]  // day -> currency -> milli-units
        var consumables: [String: ConsumableUnits] = [:]
        var latest: [LatestEvent] = []
        var rows: [String: Row] = [:]  // entitlement \u{1} subject -> state
        var tiers: [String: Set<String>] = [:]  // originalTransactionId -> row keys (auto-renewable)
        var history: [ActivePoint] = []

        struct Result { var applied = true, untracked = false }

        /// Counts a new (not duplicate) event; `minute` is its verifiedAt minute when inside the per-minute window.
        mutating func ingest(_ e: EntitlementEvent, minute: Int64?, countRevenue: Bool, countUnits: Bool, limits: Limits) -> Result {
            events += 1
            DashboardAggregator.bump(&byKind, e.kind, limits.maxKeys)
            if let minute { DashboardAggregator.bump(&perMinute[minute, default: [:]], e.kind, limits.maxKeys) }
            let day = DashboardAggregator.day(e.signedDate)
            var life = lifecycle[day] ?? LifecycleDay(day: day)
            switch e.effect {
            case .grant where !e.isConsumableProduct: life.starts += 1
            case .extend: life.renewals += 1
            default: break
            }
            if e.kind.contains("EXPIRED") { life.expiries += 1 }
            if e.effect == .revoke && e.kind.contains("REFUND") { life.refunds += 1 }
            lifecycle[day] = life
            if countRevenue { addRevenue(e, day: day, limits: limits) }
            trimDays(limits.days)
            if countUnits { addConsumables(e, limits: limits) }
            latest.append(LatestEvent(e))
            if latest.count > limits.latest { latest.removeFirst(latest.count - limits.latest) }
            return applyEntitlement(e, limits: limits)
        }

        // MARK: entitlement state (the sink's rules)

        private mutating func applyEntitlement(_ e: EntitlementEvent, limits: Limits) -> Result {
            guard !e.isConsumableProduct, let subject = e.subject, let name = e.entitlement ?? e.productId else { return Result() }
            let key = name + "\u{1}" + subject
            let existing = rows[key]
            if let existing, e.signedDate < existing.lastSignedDate { return Result(applied: false) }
            guard [.grant, .extend, .revoke, .restore].contains(e.effect) else { return Result() }
            if existing == nil && rows.count >= limits.maxEntitlementRows { return Result(untracked: true) }
            var next = existing ?? Row(active: false, validUntil: e.validUntil, lastSignedDate: e.signedDate)
            switch e.effect {
            case .grant:
                next.active = true
                next.validUntil = e.validUntil
            case .extend, .restore:
                next.active = true
                // valid_until only moves later; nil ("no end") wins.
                if let existing, let incoming = e.validUntil, let current = existing.validUntil {
                    next.validUntil = max(current, incoming)
                }
            case .revoke:
                if let existing, Self.refundsAnEarlierPeriod(e, current: existing) { return Result() }
                next.active = false
            case .state, .info:
                return Result()
            }
            next.productId = e.productId ?? next.productId
            next.transactionId = e.transactionId ?? next.transactionId
            next.originalTransactionId = e.originalTransactionId ?? next.originalTransactionId
            next.lastSignedDate = max(next.lastSignedDate, e.signedDate)
            rows[key] = next
            if e.isAutoRenewableProduct, let otid = e.originalTransactionId {
                if [.grant, .extend, .restore].contains(e.effect) {
                    // An upgrade, or a downgrade/cross-grade taking effect: the other tiers of the subscription end.
                    for other in tiers[otid] ?? [] where other != key {
                        guard var row = rows[other], row.active, row.lastSignedDate <= e.signedDate else { continue }
                        row.active = false
                        row.lastSignedDate = e.signedDate
                        rows[other] = row
                    }
                }
                tiers[otid, default: []].insert(key)
            }
            return Result()
        }

        /// A refund of an auto-renewable period that ended before the access currently granted changes no access.
        static func refundsAnEarlierPeriod(_ e: EntitlementEvent, current: Row) -> Bool {
            guard e.isAutoRenewableProduct, let refunded = e.transactionId, let granting = current.transactionId,
                  refunded != granting, current.active, let periodEnd = e.transaction?["expiresDate"]?.int64Value,
                  let currentEnd = current.validUntil
            else { return false }
            return periodEnd < currentEnd
        }

        // MARK: revenue and consumables

        private mutating func addRevenue(_ e: EntitlementEvent, day: String, limits: Limits) {
            guard e.effect == .grant || e.effect == .extend, let t = e.transaction,
                  let price = t["price"]?.int64Value, let currency = t["currency"]?.stringValue, !currency.isEmpty
            else { return }
            var perCurrency = revenue[day] ?? [:]
            let key = perCurrency[currency] != nil || perCurrency.count < limits.maxKeys ? currency : DashboardAggregator.other
            perCurrency[key, default: 0] += price
            revenue[day] = perCurrency
        }

        private mutating func addConsumables(_ e: EntitlementEvent, limits: Limits) {
            guard e.isConsumableProduct, let product = e.productId else { return }
            let units = Int64(e.units ?? e.quantity ?? 1)
            let key = consumables[product] != nil || consumables.count < limits.maxKeys ? product : DashboardAggregator.other
            var c = consumables[key] ?? ConsumableUnits()
            switch e.effect {
            case .grant, .extend: c.credited += units
            case .restore: c.recredited += units
            case .revoke:
                let pct = Int64(max(0, min(100_000, e.revocationPercentage ?? 100_000)))
                c.debited += units * pct / 100_000
            case .state, .info: return
            }
            consumables[key] = c
        }

        private mutating func trimDays(_ days: Int) {
            if lifecycle.count > days {
                let keep = Set(lifecycle.keys.sorted().suffix(days))
                lifecycle = lifecycle.filter { keep.contains($0.key) }
            }
            if revenue.count > days {
                let keep = Set(revenue.keys.sorted().suffix(days))
                revenue = revenue.filter { keep.contains($0.key) }
            }
        }
    }
}

extension EntitlementEvent {
    var isConsumableProduct: Bool { productType == "Consumable" }
    var isAutoRenewableProduct: Bool { productType == "Auto-Renewable Subscription" }
}
