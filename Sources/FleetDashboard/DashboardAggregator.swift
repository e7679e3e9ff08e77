import AppStoreVerification
import EntitlementDomain
import EntitlementRules
import Foundation

/// The dashboard's in-memory aggregates of the result and rejected topics, as plain Swift (no Kafka, no HTTP).
///
/// Counting: `events`/`byKind` count distinct eventIds (a replayed input yields the same eventId and is counted once,
/// see `SeenFilter` for what is exact). `rejected` counts records of the rejected topic by their `reason` header.
/// Entitlement state follows the sink's ordering rules (`EventApplier.applyEntitlement`): per (environment, subject,
/// entitlement), an event signed before the last applied one is stale and changes nothing; GRANT starts a window,
/// EXTEND/RESTORE resume and move `validUntil` later, REVOKE ends access (a refund of an earlier billing period does
/// not), an auto-renewable GRANT/EXTEND/RESTORE of one tier ends the other tiers of the same subscription. "Active now"
/// is judged like `entitlements_current.entitled_now`: active and (`validUntil` absent or later than now).
///
/// Memory is bounded: fixed time buckets (the last `minutes` minutes, the last `days` days), at most `maxKeys` distinct
/// kinds, products, currencies and reasons (the rest is counted under `(other)`), a ring of the latest events, the
/// dedupe filter's fixed size, and at most `maxEntitlementRows` tracked entitlements (further ones are counted in
/// `untrackedEntitlements` and not shown as active).
public struct DashboardAggregator: Sendable {
    public struct Limits: Sendable {
        public var minutes = 60
        public var days = 31
        public var maxKeys = 200
        public var latest = 25
        public var historyPoints = 60
        public var maxEntitlementRows = 2_000_000
        public var seenExactCapacity = 250_000
        public var seenBloomBits = 1 << 25
        public init() {}
    }

    public static let other = "(other)"

    public let limits: Limits
    private var seen: SeenFilter
    private var revenueSeen: SeenFilter
    private var ledgerSeen: SeenFilter
    private var envs: [String: EnvState] = [:]
    private var rejected: [String: Int] = [:]
    private var rejectedPerMinute: [Int64: Int] = [:]
    public private(set) var resultRecords = 0
    public private(set) var rejectedRecords = 0
    public private(set) var duplicates = 0
    public private(set) var stale = 0
    public private(set) var undecodable = 0
    public private(set) var untrackedEntitlements = 0
    private var maxMinute: Int64 = 0

    public init(limits: Limits = Limits()) {
        self.limits = limits
        seen = SeenFilter(exactCapacity: limits.seenExactCapacity, bloomBits: limits.seenBloomBits)
        revenueSeen = SeenFilter(exactCapacity: limits.seenExactCapacity, bloomBits: limits.seenBloomBits)
        ledgerSeen = SeenFilter(exactCapacity: limits.seenExactCapacity, bloomBits: limits.seenBloomBits)
    }

    public var distinctEvents: Int { envs.values.reduce(0) { $0 + $1.events } }

    // MARK: input

    /// A record of the result topic that did not decode as an entitlement event.
    public mutating func recordUndecodable() {
        resultRecords += 1
        undecodable += 1
    }

    /// A record of the rejected topic; `reason` is its `reason` header (`(missing)` when absent).
    public mutating func ingestRejected(reason: String?, timestamp: Int64?) {
        rejectedRecords += 1
        let r = (reason?.isEmpty == false) ? reason! : "(missing)"
        let maxKeys = limits.maxKeys
        Self.bump(&rejected, r, maxKeys)
        if let timestamp {
            let m = minute(timestamp)
            advanceMinutes(to: m)
            if m > maxMinute - Int64(limits.minutes) * 60_000 { rejectedPerMinute[m, default: 0] += 1 }
        }
    }

    /// Outcome of one event, for tests and metrics.
    public enum Outcome: Sendable, Equatable { case counted, duplicate, stale }

    /// One decoded event of the result topic.
    @discardableResult
    public mutating func ingest(_ e: EntitlementEvent) -> Outcome {
        resultRecords += 1
        guard seen.insert(e.eventId) else {
            duplicates += 1
            return .duplicate
        }
        let m = minute(e.verifiedAt)
        advanceMinutes(to: m)
        let inWindow = m > maxMinute - Int64(limits.minutes) * 60_000
        // One purchase can reach the topic as several events (a notification and the transaction itself).
        let isSale = (e.effect == .grant || e.effect == .extend) && e.transactionPayload?.price != nil
        var newRevenue = false
        if isSale, let txn = e.transactionId { newRevenue = revenueSeen.insert(e.environment + "\u{1}" + txn) }
        // Consumable units like the sink's ledger: one credit per transaction, one debit per (transaction, revocation),
        // one re-credit per reversal, whichever events carry them.
        var newLedgerEntry = false
        if e.isConsumable {
            let base = e.environment + "\u{1}" + (e.transactionId ?? e.eventId) + "\u{1}"
            switch e.effect {
            case .grant, .extend: newLedgerEntry = ledgerSeen.insert(base + "credit")
            case .revoke: newLedgerEntry = ledgerSeen.insert(base + "debit\u{1}" + String(e.revocationDate ?? e.signedDate))
            case .restore: newLedgerEntry = ledgerSeen.insert(base + "recredit\u{1}" + String(e.signedDate))
            case .state, .info: break
            }
        }
        if envs[e.environment] == nil { envs[e.environment] = EnvState() }
        // In place (`envs[k]!`): a copy of the state would copy every entitlement row.
        let result = envs[e.environment]!.ingest(e, minute: inWindow ? m : nil, countRevenue: newRevenue,
                                                     countUnits: newLedgerEntry, limits: limits)
        if result.untracked { untrackedEntitlements += 1 }
        if !result.applied { stale += 1 }
        return result.applied ? .counted : .stale
    }

    // MARK: buckets

    private func minute(_ ms: Int64) -> Int64 { ms - ((ms % 60_000) + 60_000) % 60_000 }

    static func day(_ ms: Int64) -> String {
        var seconds = ms / 1000
        if ms < 0 && ms % 1000 != 0 { seconds -= 1 }
        var t = time_t(seconds)
        var parts = tm()
        gmtime_r(&t, &parts)
        return String(format: "%04d-%02d-%02d", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1, Int(parts.tm_mday))
    }

    private mutating func advanceMinutes(to m: Int64) {
        guard m > maxMinute else { return }
        maxMinute = m
        let cutoff = m - Int64(limits.minutes) * 60_000
        for k in Array(envs.keys) {
            envs[k]!.perMinute = envs[k]!.perMinute.filter { $0.key > cutoff }
        }
        rejectedPerMinute = rejectedPerMinute.filter { $0.key > cutoff }
    }

    static func bump(_ d: inout [String: Int], _ key: String, _ maxKeys: Int) {
        if d[key] != nil || d.count < maxKeys { d[key, default: 0] += 1 } else { d[other, default: 0] += 1 }
    }

    // MARK: output

    /// Active entitlements now, per entitlement and per product.
    func active(_ env: EnvState, now: Int64) -> (byEntitlement: [String: Int], byProduct: [String: Int]) {
        var byEntitlement: [String: Int] = [:]
        var byProduct: [String: Int] = [:]
        for (key, row) in env.rows where row.active && (row.validUntil.map { $0 > now } ?? true) {
            let name = key.entitlement
            byEntitlement[name, default: 0] += 1
            byProduct[row.productId ?? name, default: 0] += 1
        }
        return (byEntitlement, byProduct)
    }

    /// The summary served at `/api/summary`. Records a point of the active-entitlements history per minute.
    public mutating func summary(now: Int64) -> DashboardSummary {
        var out = DashboardSummary()
        out.generatedAt = now
        out.events = distinctEvents
        out.rejected = rejected
        out.rejectedTotal = rejectedRecords
        out.records = .init(result: resultRecords, rejected: rejectedRecords, duplicates: duplicates, undecodable: undecodable)
        out.stale = stale
        out.untrackedEntitlements = untrackedEntitlements
        out.dedupe = .init(exactWindow: seen.exactCapacity, exactIds: seen.exactCount, filteredIds: seen.filtered,
                           approximate: seen.approximate)
        let nowMinute = minute(now)
        let lastMinute = max(maxMinute, nowMinute)
        let minutes = (0..<limits.minutes).map { lastMinute - Int64(limits.minutes - 1 - $0) * 60_000 }
        out.rejectedPerMinute = minutes.map { MinuteCount(t: $0, n: rejectedPerMinute[$0] ?? 0) }
        for name in envs.keys.sorted() {
            var env = envs[name]!
            let act = active(env, now: now)
            if env.history.last.map({ minute($0.t) != nowMinute }) ?? true {
                env.history.append(ActivePoint(t: now, counts: act.byEntitlement))
                if env.history.count > limits.historyPoints { env.history.removeFirst(env.history.count - limits.historyPoints) }
            } else {
                env.history[env.history.count - 1] = ActivePoint(t: now, counts: act.byEntitlement)
            }
            envs[name] = env
            for (k, n) in env.byKind { out.byKind[k, default: 0] += n }
            for (k, n) in act.byEntitlement { out.activeEntitlements[k, default: 0] += n }
            out.environments[name] = EnvironmentSummary(
                events: env.events, byKind: env.byKind, activeEntitlements: act.byEntitlement, activeByProduct: act.byProduct,
                activeHistory: env.history,
                perMinute: minutes.map { MinuteKinds(t: $0, byKind: env.perMinute[$0] ?? [:]) },
                lifecycleByDay: env.lifecycle.keys.sorted().map { env.lifecycle[$0]! },
                revenueByDay: env.revenue.keys.sorted().map { RevenueDay(day: $0, byCurrency: env.revenue[$0]!) },
                consumables: env.consumables, latest: env.latest.reversed())
        }
        out.defaultEnvironment = envs["Production"] != nil ? "Production" : envs.keys.sorted().first
        return out
    }
}
