import AppStoreVerification
import EntitlementDomain
import EntitlementRules

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
        var rows: [EntitlementKey: EntitlementRow] = [:]  // as the sink's entitlements table
        var tiers: [SubscriptionKey: Set<EntitlementKey>] = [:]  // the rows of each subscription (auto-renewable)
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
            case .grant where !e.isConsumable: life.starts += 1
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

        // MARK: entitlement state: the sink's own rules (EntitlementRules), one event at a time

        private mutating func applyEntitlement(_ e: EntitlementEvent, limits: Limits) -> Result {
            guard let key = e.entitlementKey else { return Result() }
            if rows[key] == nil && e.effect.changesAccess && rows.count >= limits.maxEntitlementRows {
                return Result(untracked: true)
            }
            let status = EntitlementRules.applyEntitlement(e, current: &rows[key])
            guard status == .applied else { return Result(applied: false) }
            if let original = rows[key]?.originalTransactionId {
                tiers[SubscriptionKey(environment: key.environment, originalTransactionId: original), default: []].insert(key)
            }
            if let subscription = e.subscriptionKey {
                _ = EntitlementRules.supersedeOtherTiers(e, granted: key, candidates: tiers[subscription] ?? [], in: &rows)
            }
            return Result()
        }

        // MARK: revenue and consumables

        private mutating func addRevenue(_ e: EntitlementEvent, day: String, limits: Limits) {
            guard e.effect == .grant || e.effect == .extend, let t = e.transactionPayload,
                  let price = t.price, let currency = t.currency, !currency.isEmpty
            else { return }
            var perCurrency = revenue[day] ?? [:]
            let key = perCurrency[currency] != nil || perCurrency.count < limits.maxKeys ? currency : DashboardAggregator.other
            perCurrency[key, default: 0] += price
            revenue[day] = perCurrency
        }

        private mutating func addConsumables(_ e: EntitlementEvent, limits: Limits) {
            guard e.isConsumable, let product = e.productId else { return }
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

