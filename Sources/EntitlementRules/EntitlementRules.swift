import EntitlementDomain

// The entitlement rules: given the current rows of the keys a batch touches and the batch's new events, decide every
// change (applied / stale / duplicate, access windows, supersede, restore, ledger entries). Plain Swift: no
// PostgreSQL, no Kafka; the sink reads the rows, calls `EntitlementRules.fold` and writes what it returns. The rules
// are the design card's entitlement mapping ("Ordering and idempotency", refunds, upgrades, consumables).

/// What the fold decided for one new event.
public enum EventStatus: String, Sendable {
    case applied, stale, duplicate
}

extension EntitlementEffect {
    /// GRANT / EXTEND / REVOKE / RESTORE change access; STATE / INFO never do.
    public var changesAccess: Bool {
        switch self {
        case .grant, .extend, .revoke, .restore: return true
        case .state, .info: return false
        }
    }
}

public struct EntitlementKey: Hashable, Sendable {
    public var environment: String
    public var subject: String
    public var entitlement: String

    public init(environment: String, subject: String, entitlement: String) {
        self.environment = environment
        self.subject = subject
        self.entitlement = entitlement
    }
}

public struct SubscriptionKey: Hashable, Sendable {
    public var environment: String
    public var originalTransactionId: String

    public init(environment: String, originalTransactionId: String) {
        self.environment = environment
        self.originalTransactionId = originalTransactionId
    }
}

public struct EntitlementRow: Sendable {
    public var active: Bool
    public var productId: String?
    public var originalTransactionId: String?
    public var transactionId: String?
    public var validFrom: Int64?
    public var validUntil: Int64?
    public var revokedAt: Int64?
    public var revocationReason: String?
    public var lastSignedDate: Int64
    public var lastEventId: String
    public var lastKind: String
    public var lastEffect: String
    public var updatedAt: Int64

    public init(
        active: Bool, productId: String? = nil, originalTransactionId: String? = nil, transactionId: String? = nil,
        validFrom: Int64? = nil, validUntil: Int64? = nil, revokedAt: Int64? = nil, revocationReason: String? = nil,
        lastSignedDate: Int64, lastEventId: String, lastKind: String, lastEffect: String, updatedAt: Int64
    ) {
        self.active = active
        self.productId = productId
        self.originalTransactionId = originalTransactionId
        self.transactionId = transactionId
        self.validFrom = validFrom
        self.validUntil = validUntil
        self.revokedAt = revokedAt
        self.revocationReason = revocationReason
        self.lastSignedDate = lastSignedDate
        self.lastEventId = lastEventId
        self.lastKind = lastKind
        self.lastEffect = lastEffect
        self.updatedAt = updatedAt
    }
}

public struct LedgerKey: Hashable, Sendable {
    public var environment: String
    public var transactionId: String

    public init(environment: String, transactionId: String) {
        self.environment = environment
        self.transactionId = transactionId
    }
}

public struct LedgerEntry: Sendable {
    public var entry: String  // credit | debit | recredit
    public var revocationKey: String
    /// Amount x 100000 (exact: revocationPercentage is in thousandths of a percent).
    public var scaledAmount: Int64
    public var signedDate: Int64
    public var subject: String
    public var productId: String?
    public var originalTransactionId: String?
    public var eventId: String

    public init(
        entry: String, revocationKey: String, scaledAmount: Int64, signedDate: Int64, subject: String,
        productId: String? = nil, originalTransactionId: String? = nil, eventId: String
    ) {
        self.entry = entry
        self.revocationKey = revocationKey
        self.scaledAmount = scaledAmount
        self.signedDate = signedDate
        self.subject = subject
        self.productId = productId
        self.originalTransactionId = originalTransactionId
        self.eventId = eventId
    }
}

public struct LedgerState: Sendable {
    public var entries: [LedgerEntry] = []
    /// The latest signedDate of any RESTORE seen for the transaction (stored or in this batch).
    public var latestRestore: Int64?

    public init(entries: [LedgerEntry] = [], latestRestore: Int64? = nil) {
        self.entries = entries
        self.latestRestore = latestRestore
    }
}

extension EntitlementEvent {
    public var entitlementKey: EntitlementKey? {
        guard !isConsumable, let subject, let name = entitlement ?? productId else { return nil }
        return EntitlementKey(environment: environment, subject: subject, entitlement: name)
    }

    /// The subscription (environment, originalTransactionId) of an auto-renewable event that grants access:
    /// the tiers of one subscription group share it, and only one of them grants at a time.
    public var subscriptionKey: SubscriptionKey? {
        guard isAutoRenewable, [.grant, .extend, .restore].contains(effect), let originalTransactionId else { return nil }
        return SubscriptionKey(environment: environment, originalTransactionId: originalTransactionId)
    }

    public var ledgerKey: LedgerKey? {
        guard isConsumable, let transactionId else { return nil }
        return LedgerKey(environment: environment, transactionId: transactionId)
    }

    /// Units moved by a consumable credit / debit / re-credit (catalogue units x quantity, else the quantity).
    public var ledgerUnits: Int64 { Int64(units ?? quantity ?? 1) }
}

/// The state machine over one batch.
public enum EntitlementRules {
    /// What a batch changes: every new event's status (in order), the entitlement rows to write, and the ledger
    /// entries to append.
    public struct Decision: Sendable {
        public var statuses: [EventStatus] = []
        public var changedRows: [(EntitlementKey, EntitlementRow)] = []
        public var newLedgerEntries: [(LedgerKey, LedgerEntry)] = []
    }

    /// Applies `events` (new ones, in batch order) to the current rows and ledgers of the keys they touch
    /// (`entitlements` must hold every row of the subscriptions touched, for superseding tiers).
    public static func fold(
        _ events: [EntitlementEvent], entitlements: [EntitlementKey: EntitlementRow], ledgers: [LedgerKey: LedgerState]
    ) -> Decision {
        var entitlements = entitlements, ledgers = ledgers
        let loadedLedgerCounts = ledgers.mapValues(\.entries.count)
        var decision = Decision()
        decision.statuses.reserveCapacity(events.count)
        var changedKeys = Set<EntitlementKey>()
        // The entitlement rows of each subscription (the tiers an applied grant may supersede), kept up to date as
        // rows are created, so that superseding costs the tiers of one subscription, not a scan of every row.
        var tiers: [SubscriptionKey: Set<EntitlementKey>] = [:]
        for (key, row) in entitlements {
            if let original = row.originalTransactionId {
                tiers[SubscriptionKey(environment: key.environment, originalTransactionId: original), default: []].insert(key)
            }
        }
        for event in events {
            let status: EventStatus
            if let key = event.entitlementKey {
                status = applyEntitlement(event, current: &entitlements[key])
                if status == .applied, event.effect.changesAccess { changedKeys.insert(key) }
                if status == .applied, let original = entitlements[key]?.originalTransactionId {
                    tiers[SubscriptionKey(environment: key.environment, originalTransactionId: original), default: []]
                        .insert(key)
                }
                if status == .applied, let subscription = event.subscriptionKey {
                    changedKeys.formUnion(supersedeOtherTiers(
                        event, granted: key, candidates: tiers[subscription] ?? [], in: &entitlements))
                }
            } else if let key = event.ledgerKey {
                status = applyLedger(event, state: &ledgers[key, default: LedgerState()])
            } else {
                status = .applied  // nothing keyed to change (TEST, summaries, app transactions): recorded
            }
            decision.statuses.append(status)
        }
        decision.changedRows = changedKeys.compactMap { key in entitlements[key].map { (key, $0) } }
        for (key, state) in ledgers {
            for entry in state.entries.dropFirst(loadedLedgerCounts[key] ?? 0) { decision.newLedgerEntries.append((key, entry)) }
        }
        return decision
    }


    /// GRANT starts a window, EXTEND moves valid_until later (and resumes access), REVOKE ends access (keeping the
    /// window so RESTORE can undo it), RESTORE undoes a revoke, STATE/INFO never change access. An event signed
    /// before the last applied one is stale.
    public static func applyEntitlement(_ e: EntitlementEvent, current row: inout EntitlementRow?) -> EventStatus {
        if let existing = row, e.signedDate < existing.lastSignedDate { return .stale }
        guard e.effect.changesAccess else { return .applied }
        var next = row ?? EntitlementRow(
            active: false, productId: nil, originalTransactionId: nil, transactionId: nil, validFrom: e.validFrom,
            validUntil: e.validUntil, revokedAt: nil, revocationReason: nil, lastSignedDate: e.signedDate,
            lastEventId: e.eventId, lastKind: e.kind, lastEffect: e.effect.rawValue, updatedAt: e.verifiedAt)
        let existed = row != nil
        switch e.effect {
        case .grant:
            next.active = true
            next.validFrom = e.validFrom
            next.validUntil = e.validUntil
            next.revokedAt = nil
            next.revocationReason = nil
        case .extend, .restore:
            next.active = true
            if existed {
                next.validFrom = next.validFrom ?? e.validFrom
                next.validUntil = laterEnd(next.validUntil, e.validUntil, existed: existed)
            }
            next.revokedAt = nil
            next.revocationReason = nil
        case .revoke:
            if let existing = row, refundsAnEarlierPeriod(e, current: existing) {
                // docs/entitlement-mapping.md: REFUND revokes only if the refunded transaction is the one currently
                // granting; a refund of an earlier billing period is recorded (event log, transactions) and changes
                // no access.
                return .applied
            }
            next.active = false
            next.revokedAt = e.revocationDate ?? e.validUntil ?? e.signedDate
            next.revocationReason = e.reason ?? e.kind
        case .state, .info:
            return .applied
        }
        next.productId = e.productId ?? next.productId
        next.originalTransactionId = e.originalTransactionId ?? next.originalTransactionId
        next.transactionId = e.transactionId ?? next.transactionId
        next.lastSignedDate = max(next.lastSignedDate, e.signedDate)
        next.lastEventId = e.eventId
        next.lastKind = e.kind
        next.lastEffect = e.effect.rawValue
        next.updatedAt = e.verifiedAt
        row = next
        return .applied
    }

    /// An auto-renewable refund (or family revoke) of a transaction other than the one the row's access comes from,
    /// for a period that ended before the row's current access ends.
    public static func refundsAnEarlierPeriod(_ e: EntitlementEvent, current: EntitlementRow) -> Bool {
        guard e.isAutoRenewable, let refunded = e.transactionId, let granting = current.transactionId, refunded != granting,
              current.active, let periodEnd = e.transactionPayload?.expiresDate,
              let currentEnd = current.validUntil
        else { return false }
        return periodEnd < currentEnd
    }

    /// An applied auto-renewable GRANT/EXTEND/RESTORE of one tier ends access to every other tier of the same
    /// subscription (same environment and originalTransactionId): an upgrade (PLAN_UPGRADED), or a downgrade or
    /// cross-grade taking effect at renewal. Rows changed more recently than the event are left alone.
    /// `candidates` holds at least every key whose row belongs to the subscription. Returns the keys it changed.
    public static func supersedeOtherTiers(
        _ e: EntitlementEvent, granted key: EntitlementKey, candidates: Set<EntitlementKey>,
        in rows: inout [EntitlementKey: EntitlementRow]
    ) -> [EntitlementKey] {
        guard let subscription = e.subscriptionKey else { return [] }
        var changed: [EntitlementKey] = []
        for other in candidates where other != key && other.environment == subscription.environment {
            guard let row = rows[other], row.originalTransactionId == subscription.originalTransactionId, row.active,
                  row.lastSignedDate <= e.signedDate
            else { continue }
            var next = row
            next.active = false
            next.revokedAt = e.validFrom ?? e.signedDate
            next.revocationReason = "superseded_by:\(e.productId ?? key.entitlement)"
            next.lastSignedDate = e.signedDate
            next.lastEventId = e.eventId
            next.lastKind = e.kind
            next.lastEffect = EntitlementEffect.revoke.rawValue
            next.updatedAt = e.verifiedAt
            rows[other] = next
            changed.append(other)
        }
        return changed
    }

    /// valid_until only moves later; nil means "no end" (non-consumables) and wins.
    public static func laterEnd(_ current: Int64?, _ incoming: Int64?, existed: Bool) -> Int64? {
        guard let incoming else { return current }
        guard let current else { return existed ? nil : incoming }
        return max(current, incoming)
    }

    /// One credit per (environment, transactionId); one debit per (environment, transactionId, revocation);
    /// a re-credit per debit on REFUND_REVERSED. A refund signed before an already-seen reversal is stale.
    public static func applyLedger(_ e: EntitlementEvent, state: inout LedgerState) -> EventStatus {
        let subject = e.subject ?? e.originalTransactionId ?? e.transactionId ?? ""
        func entry(_ kind: String, _ key: String, _ amount: Int64) -> LedgerEntry {
            LedgerEntry(
                entry: kind, revocationKey: key, scaledAmount: amount, signedDate: e.signedDate, subject: subject,
                productId: e.productId, originalTransactionId: e.originalTransactionId, eventId: e.eventId)
        }
        switch e.effect {
        case .grant, .extend:
            if state.entries.contains(where: { $0.entry == "credit" }) { return .duplicate }
            state.entries.append(entry("credit", "", e.ledgerUnits * 100_000))
            return .applied
        case .revoke:
            let key = String(e.revocationDate ?? e.signedDate)
            if state.entries.contains(where: { $0.entry == "debit" && $0.revocationKey == key }) { return .duplicate }
            if let restored = state.latestRestore, restored > e.signedDate { return .stale }
            let percentage = Int64(max(0, min(100_000, e.revocationPercentage ?? 100_000)))
            state.entries.append(entry("debit", key, -(e.ledgerUnits * percentage)))
            return .applied
        case .restore:
            state.latestRestore = max(state.latestRestore ?? e.signedDate, e.signedDate)
            let recredited = Set(state.entries.filter { $0.entry == "recredit" }.map(\.revocationKey))
            let debits = state.entries.filter { $0.entry == "debit" && $0.signedDate <= e.signedDate }
            guard let debit = debits.filter({ !recredited.contains($0.revocationKey) })
                .max(by: { ($0.signedDate, $0.revocationKey) < ($1.signedDate, $1.revocationKey) })
            else {
                return debits.isEmpty ? .stale : .duplicate
            }
            state.entries.append(entry("recredit", debit.revocationKey, -debit.scaledAmount))
            return .applied
        case .state, .info:
            return .applied
        }
    }
}
