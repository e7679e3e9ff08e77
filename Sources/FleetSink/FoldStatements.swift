import EntitlementDomain
import EntitlementRules
import Foundation
import PostgresNIO

// The statements of a batch that the fold needs or makes: the reads of the current rows of the keys touched, and the
// writes of the rows the fold changed (`EntitlementRules.fold`). The rest of the batch's statements are built before
// the transaction (`BatchStatements.swift`).
extension BatchPlan {
    // MARK: reads

    /// The rows of the keys touched, plus every row of the subscriptions touched (for `supersedeOtherTiers`).
    static func entitlementsRead(_ fresh: [EntitlementEvent]) -> PostgresQuery? {
        let list = Array(Set(fresh.compactMap(\.entitlementKey)))
        guard !list.isEmpty else { return nil }
        let subs = Array(Set(fresh.compactMap(\.subscriptionKey)))
        var b = ColumnBinds()
        let env = b.add(list.map(\.environment))
        let subject = b.add(list.map(\.subject))
        let name = b.add(list.map(\.entitlement))
        let subEnv = b.add(subs.map(\.environment))
        let subOriginal = b.add(subs.map(\.originalTransactionId))
        let columns = """
            e.environment, e.subject, e.entitlement, e.active, e.product_id, e.original_transaction_id,
            e.transaction_id, \(Self.ms("e.valid_from")), \(Self.ms("e.valid_until")), \(Self.ms("e.revoked_at")),
            e.revocation_reason, e.last_signed_date_ms, e.last_event_id, e.last_kind, e.last_effect,
            \(Self.ms("e.updated_at"))
            """
        // One index probe per key (LATERAL ... OFFSET 0 keeps the planner from hashing the whole table, which it
        // prefers for a few thousand keys and which made every batch slower as the table grew).
        return b.query("""
            SELECT \(columns)
            FROM unnest(\(env)::text[], \(subject)::text[], \(name)::text[]) AS k(environment, subject, entitlement)
            CROSS JOIN LATERAL (
                SELECT * FROM entitlements x
                WHERE x.environment = k.environment AND x.subject = k.subject AND x.entitlement = k.entitlement OFFSET 0
            ) AS e
            UNION ALL
            SELECT \(columns)
            FROM unnest(\(subEnv)::text[], \(subOriginal)::text[]) AS s(environment, original_transaction_id)
            CROSS JOIN LATERAL (
                SELECT * FROM entitlements x
                WHERE x.environment = s.environment AND x.original_transaction_id = s.original_transaction_id OFFSET 0
            ) AS e
            """)
    }

    func decodeEntitlements(_ rows: [PostgresRow]) throws -> [EntitlementKey: EntitlementRow] {
        var result: [EntitlementKey: EntitlementRow] = [:]
        result.reserveCapacity(rows.count)
        for row in rows {
            let (environment, subject, entitlement, active, productId, original, transaction) =
                try row.decode((String, String, String, Bool, String?, String?, String?).self)
            let r = row.makeRandomAccess()
            result[EntitlementKey(environment: environment, subject: subject, entitlement: entitlement)] = EntitlementRow(
                active: active, productId: productId, originalTransactionId: original, transactionId: transaction,
                validFrom: try r[7].decode(Int64?.self), validUntil: try r[8].decode(Int64?.self),
                revokedAt: try r[9].decode(Int64?.self), revocationReason: try r[10].decode(String?.self),
                lastSignedDate: try r[11].decode(Int64.self), lastEventId: try r[12].decode(String.self),
                lastKind: try r[13].decode(String.self), lastEffect: try r[14].decode(String.self),
                updatedAt: try r[15].decode(Int64.self))
        }
        return result
    }

    /// The ledger entries of the keys touched, and the newest consumable RESTORE event of each.
    static func ledgerReads(_ fresh: [EntitlementEvent]) -> (entries: PostgresQuery, restores: PostgresQuery)? {
        let list = Array(Set(fresh.compactMap(\.ledgerKey)))
        guard !list.isEmpty else { return nil }
        var b = ColumnBinds()
        let env = b.add(list.map(\.environment))
        let txn = b.add(list.map(\.transactionId))
        let entries = b.query("""
            SELECT l.environment, l.transaction_id, l.entry, l.revocation_key, (l.amount * 100000)::bigint,
                   l.signed_date_ms, l.subject, l.product_id, l.original_transaction_id, l.event_id
            FROM unnest(\(env)::text[], \(txn)::text[]) AS k(environment, transaction_id)
            CROSS JOIN LATERAL (
                SELECT * FROM consumable_ledger x
                WHERE x.environment = k.environment AND x.transaction_id = k.transaction_id OFFSET 0
            ) AS l
            ORDER BY l.signed_date_ms, l.entry, l.revocation_key
            """)
        let restores = b.query("""
            SELECT ev.environment, ev.transaction_id, max(ev.signed_date_ms)
            FROM unnest(\(env)::text[], \(txn)::text[]) AS k(environment, transaction_id)
            CROSS JOIN LATERAL (
                SELECT x.environment, x.transaction_id, x.signed_date_ms FROM entitlement_events x
                WHERE x.environment = k.environment AND x.transaction_id = k.transaction_id
                  AND x.effect = 'RESTORE' AND x.product_type = 'Consumable' OFFSET 0
            ) AS ev
            GROUP BY ev.environment, ev.transaction_id
            """)
        return (entries, restores)
    }

    func decodeLedgers(_ rows: (entries: [PostgresRow], restores: [PostgresRow])) throws -> [LedgerKey: LedgerState] {
        var result: [LedgerKey: LedgerState] = [:]
        for row in rows.entries {
            let (environment, transactionId, entry, key, amount, signed, subject, product, original, eventId) =
                try row.decode((String, String, String, String, Int64, Int64, String, String?, String?, String).self)
            result[LedgerKey(environment: environment, transactionId: transactionId), default: LedgerState()]
                .entries.append(LedgerEntry(
                    entry: entry, revocationKey: key, scaledAmount: amount, signedDate: signed, subject: subject,
                    productId: product, originalTransactionId: original, eventId: eventId))
        }
        for row in rows.restores {
            let (environment, transactionId, signed) = try row.decode((String, String, Int64).self)
            result[LedgerKey(environment: environment, transactionId: transactionId), default: LedgerState()]
                .latestRestore = signed
        }
        return result
    }

    private static func ms(_ column: String) -> String { "(extract(epoch FROM \(column)) * 1000)::bigint" }

    // MARK: writes

    /// The upsert of the entitlement rows the fold changed (nothing changed: nil).
    static func entitlementsWrite(_ rows: [(EntitlementKey, EntitlementRow)]) -> PostgresQuery? {
        guard !rows.isEmpty else { return nil }
        var b = ColumnBinds()
        b.column(rows.map(\.0.environment), "text", as: "env")
        b.column(rows.map(\.0.subject), "text", as: "su")
        b.column(rows.map(\.0.entitlement), "text", as: "en")
        b.column(rows.map(\.1.active), "boolean", as: "ac")
        b.column(rows.map(\.1.productId), "text", as: "pr")
        b.column(rows.map(\.1.originalTransactionId), "text", as: "ot")
        b.column(rows.map(\.1.transactionId), "text", as: "tr")
        b.column(rows.map(\.1.validFrom), "bigint", as: "vf")
        b.column(rows.map(\.1.validUntil), "bigint", as: "vu")
        b.column(rows.map(\.1.revokedAt), "bigint", as: "rv")
        b.column(rows.map(\.1.revocationReason), "text", as: "rr")
        b.column(rows.map(\.1.lastSignedDate), "bigint", as: "sd")
        b.column(rows.map(\.1.lastEventId), "text", as: "ev")
        b.column(rows.map(\.1.lastKind), "text", as: "k")
        b.column(rows.map(\.1.lastEffect), "text", as: "ef")
        b.column(rows.map(\.1.updatedAt), "bigint", as: "ua")
        return b.query("""
            WITH up AS (
                INSERT INTO entitlements (environment, subject, entitlement, active, product_id,
                    original_transaction_id, transaction_id, valid_from, valid_until, revoked_at, revocation_reason,
                    last_signed_date, last_signed_date_ms, last_event_id, last_kind, last_effect, updated_at)
                SELECT env, su, en, ac, pr, ot, tr, fleet_ms(vf), fleet_ms(vu), fleet_ms(rv), rr, fleet_ms(sd), sd,
                       ev, k, ef, fleet_ms(ua)
                FROM \(b.rows())
                ON CONFLICT (environment, subject, entitlement) DO UPDATE SET
                    active = EXCLUDED.active, product_id = EXCLUDED.product_id,
                    original_transaction_id = EXCLUDED.original_transaction_id,
                    transaction_id = EXCLUDED.transaction_id, valid_from = EXCLUDED.valid_from,
                    valid_until = EXCLUDED.valid_until, revoked_at = EXCLUDED.revoked_at,
                    revocation_reason = EXCLUDED.revocation_reason, last_signed_date = EXCLUDED.last_signed_date,
                    last_signed_date_ms = EXCLUDED.last_signed_date_ms, last_event_id = EXCLUDED.last_event_id,
                    last_kind = EXCLUDED.last_kind, last_effect = EXCLUDED.last_effect,
                    updated_at = EXCLUDED.updated_at
                RETURNING 1
            ) SELECT count(*) FROM up
            """)
    }

    /// The insert of the ledger entries the fold added (none: nil).
    static func ledgerWrite(_ entries: [(LedgerKey, LedgerEntry)]) -> PostgresQuery? {
        guard !entries.isEmpty else { return nil }
        var b = ColumnBinds()
        b.column(entries.map(\.0.environment), "text", as: "env")
        b.column(entries.map(\.0.transactionId), "text", as: "tr")
        b.column(entries.map(\.1.entry), "text", as: "en")
        b.column(entries.map(\.1.revocationKey), "text", as: "rk")
        b.column(entries.map(\.1.subject), "text", as: "su")
        b.column(entries.map(\.1.productId), "text", as: "pr")
        b.column(entries.map(\.1.originalTransactionId), "text", as: "ot")
        b.column(entries.map(\.1.scaledAmount), "bigint", as: "am")
        b.column(entries.map(\.1.eventId), "text", as: "ev")
        b.column(entries.map(\.1.signedDate), "bigint", as: "sd")
        return b.query("""
            WITH ins AS (
                INSERT INTO consumable_ledger (environment, transaction_id, entry, revocation_key, subject, product_id,
                    original_transaction_id, amount, event_id, signed_date, signed_date_ms)
                SELECT env, tr, en, rk, su, pr, ot, trim_scale(am::numeric / 100000), ev, fleet_ms(sd), sd
                FROM \(b.rows())
                ON CONFLICT (environment, transaction_id, entry, revocation_key) DO NOTHING
                RETURNING 1
            ) SELECT count(*) FROM ins
            """)
    }
}
