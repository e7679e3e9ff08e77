import AppStoreVerification
import EntitlementDomain
import Foundation
import PostgresNIO

// The SQL of a batch's writes that need no database state: notifications, transaction facts and versions, events.
// Built before the transaction (`BatchPlan.init`), executed by `BatchPlan.execute`.
extension BatchPlan {
    /// `stored`: what a notification already stored does to the insert (`StoredRows`).
    static func notificationsQuery(
        _ events: [EntitlementEvent], texts: [String: EventTexts], stored: StoredRows
    ) -> PostgresQuery? {
        let (picked, received) = pickNotifications(events)
        guard !picked.isEmpty else { return nil }
        var b = ColumnBinds()
        b.column(picked.map(\.1.uuid), "text", as: "u")
        b.column(picked.map { events[$0.0].environment }, "text", as: "env")
        b.column(picked.map(\.1.type), "text", as: "t")
        b.column(picked.map(\.1.subtype), "text", as: "st")
        b.column(picked.map(\.1.version), "text", as: "v")
        b.column(picked.map { events[$0.0].bundleId }, "text", as: "bu")
        b.column(picked.map { events[$0.0].appAppleId }, "bigint", as: "aai")
        b.column(picked.map { events[$0.0].originalTransactionId }, "text", as: "ot")
        b.column(picked.map { events[$0.0].transactionId }, "text", as: "tr")
        b.column(picked.map(\.1.signedDate), "bigint", as: "sd")
        b.column(picked.map { texts[events[$0.0].eventId]?.notification ?? notificationPayload(events[$0.0], $0.1) }, "text", as: "p")
        b.column(picked.map { events[$0.0].source.topic }, "text", as: "tp")
        b.column(picked.map { events[$0.0].source.partition }, "integer", as: "pa")
        b.column(picked.map { events[$0.0].source.offset }, "bigint", as: "o")
        b.column(picked.map { received[$0.1.uuid] ?? events[$0.0].verifiedAt }, "bigint", as: "ra")
        return b.query("""
            WITH ins AS (
                INSERT INTO notifications (\(notificationColumns.joined(separator: ", ")))
                SELECT u, env, t, st, v, bu, aai, ot, tr, fleet_ms(sd), sd, p::jsonb, tp, pa, o, fleet_ms(ra), now()
                FROM \(b.rows())
                \(stored == .skip ? "ON CONFLICT (notification_uuid) DO NOTHING" : "")
                RETURNING 1
            ) SELECT count(*) FROM ins
            """)
    }

    /// Each notification of a batch once, as (index of its first event, notification), and its received_at: the
    /// earliest verification time of that notification within the batch. The events are picked by index: an element
    /// of `events` is read in place, never copied whole.
    static func pickNotifications(_ events: [EntitlementEvent]) -> ([(Int, EventNotification)], [String: Int64]) {
        var seen = Set<String>()
        var picked: [(Int, EventNotification)] = []
        for (i, event) in events.enumerated() {
            guard let n = event.notification, seen.insert(n.uuid).inserted else { continue }
            picked.append((i, n))
        }
        var received: [String: Int64] = [:]
        for event in events { if let n = event.notification { received[n.uuid] = min(received[n.uuid] ?? .max, event.verifiedAt) } }
        return (picked, received)
    }

    /// The notifications of a batch whose rows are all assumed new, for a binary COPY. `applied_at`, the batch
    /// transaction's start (`now()` in the insert), is left out: the column's default fills it (migration 8). nil:
    /// nothing to write, or a date outside `CopyBinary.isWritable` (then `notificationsQuery`).
    static func notificationsCopy(_ events: [EntitlementEvent], texts: [String: EventTexts]) -> CopyRows? {
        let (picked, received) = pickNotifications(events)
        guard !picked.isEmpty else { return nil }
        var size = CopySize()
        guard notificationRows(picked, received, events, texts, into: &size) else { return nil }
        var t = CopyBinary(columns: notificationCopyColumns.count, capacity: size.byteCount)
        _ = notificationRows(picked, received, events, texts, into: &t)
        return CopyRows(table: "notifications", columns: notificationCopyColumns, rows: t)
    }

    /// Writes the rows of `notificationsCopy`; false for a date outside `CopyBinary.isWritable`.
    private static func notificationRows<W: CopyFields>(
        _ picked: [(Int, EventNotification)], _ received: [String: Int64], _ events: [EntitlementEvent],
        _ texts: [String: EventTexts], into t: inout W
    ) -> Bool {
        for (i, n) in picked {
            let e = events[i]
            let ra = received[n.uuid] ?? e.verifiedAt
            guard CopyBinary.isWritable(n.signedDate), CopyBinary.isWritable(ra) else { return false }
            t.text(n.uuid); t.text(e.environment); t.text(n.type); t.text(n.subtype); t.text(n.version)
            t.text(e.bundleId); t.int64(e.appAppleId); t.text(e.originalTransactionId); t.text(e.transactionId)
            t.timestamp(n.signedDate); t.int64(n.signedDate)
            t.jsonb(texts[e.eventId]?.notification ?? notificationPayload(e, n))
            t.text(e.source.topic); t.int32(e.source.partition); t.int64(e.source.offset); t.timestamp(ra)
            t.endRow()
        }
        return true
    }

    /// The columns the COPY of notifications fills: all but `applied_at`, which PostgreSQL fills with `now()`.
    static let notificationCopyColumns = notificationColumns.filter { $0 != "applied_at" }

    /// The notifications columns the insert fills, in their order (`applied_at` last).
    static let notificationColumns = [
        "notification_uuid", "environment", "notification_type", "subtype", "version", "bundle_id", "app_apple_id",
        "original_transaction_id", "transaction_id", "signed_date", "signed_date_ms", "payload", "source_topic",
        "source_partition", "source_offset", "received_at", "applied_at",
    ]

    /// The decoded notification stored in `notifications.payload`: its header fields plus the transaction, renewal
    /// info, AppTransaction and details documents, whose JSON text (`parts`, when already written for the other
    /// columns) is spliced in rather than serialized again.
    static func notificationPayload(_ e: EntitlementEvent, _ n: EventNotification, parts: EventTexts? = nil) -> String {
        let parts = parts ?? EventTexts(
            transaction: jsonText(e.transaction), renewalInfo: jsonText(e.renewalInfo),
            appTransaction: jsonText(e.appTransaction), details: jsonText(e.details))
        func quoted(_ s: String) -> String { jsonText(.string(s)) ?? "null" }
        var members: [(String, String)] = [
            ("notificationUUID", quoted(n.uuid)), ("notificationType", quoted(n.type)),
            ("signedDate", String(n.signedDate)), ("environment", quoted(e.environment)),
        ]
        if let s = n.subtype { members.append(("subtype", quoted(s))) }
        if let v = n.version { members.append(("version", quoted(v))) }
        if let b = e.bundleId { members.append(("bundleId", quoted(b))) }
        if let a = e.appAppleId { members.append(("appAppleId", String(a))) }
        for (key, text) in [
            ("transaction", parts.transaction), ("renewalInfo", parts.renewalInfo),
            ("appTransaction", parts.appTransaction), ("details", parts.details),
        ] {
            if let text { members.append((key, text)) }
        }
        // Members in jsonb's order, like every nested document.
        members.sort { JSONKeyOrder.jsonbPrecedes($0.0, $1.0) }
        var bytes: [UInt8] = [UInt8(ascii: "{")]
        bytes.reserveCapacity(members.reduce(2) { $0 + $1.0.utf8.count + $1.1.utf8.count + 4 })
        for (i, (key, text)) in members.enumerated() {
            if i > 0 { bytes.append(UInt8(ascii: ",")) }
            JSONValue.writeString(key, into: &bytes)
            bytes.append(UInt8(ascii: ":"))
            bytes.append(contentsOf: text.utf8)
        }
        bytes.append(UInt8(ascii: "}"))
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Serializes a JSONValue to JSON text for a jsonb column (which normalizes key order itself). Not JSONEncoder:
    /// it costs ~100 us per transaction object on Linux, which dominated the batch time. NUL characters are dropped
    /// (jsonb rejects `\u0000`); non-finite numbers (impossible from parsed JSON) become null.
    static func jsonText(_ value: JSONValue?) -> String? {
        guard let value else { return nil }
        // The byte-level writer of the verification core (several times faster than building a String scalar by
        // scalar); the rare document with an escaped NUL is written again without its NUL characters.
        // Members in jsonb's own order: PostgreSQL then finds each object already sorted.
        let bytes = value.serializedBytes(keyOrder: .jsonb)
        if !containsEscapedNUL(bytes) { return String(decoding: bytes, as: UTF8.self) }
        return String(decoding: droppingNUL(value).serializedBytes(keyOrder: .jsonb), as: UTF8.self)
    }

    /// The text for a jsonb column of a document the event's record carried as `text` (the document: `value`, read
    /// only when needed): that text as it came, unless it holds an escaped NUL (jsonb refuses those; `jsonText` drops
    /// them). Without a text, `value` written out; nil when the event has neither.
    static func jsonText(_ text: String?, _ value: @autoclosure () -> JSONValue?) -> String? {
        guard var text else { return jsonText(value()) }
        if !(text.withUTF8 { containsEscapedNUL($0) }) { return text }
        return jsonText(value() ?? (try? JSONValue.parse(text, maxDepth: 64)))
    }

    /// Whether `\u0000` occurs in JSON text (possibly preceded by an escaped backslash: then it is a false
    /// positive, which only costs the slower writer).
    static func containsEscapedNUL(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBufferPointer(containsEscapedNUL)
    }

    static func containsEscapedNUL(_ b: UnsafeBufferPointer<UInt8>) -> Bool {
        guard b.count >= 6 else { return false }
        var i = 0
        while i <= b.count - 6 {
            if b[i] == 0x5C && b[i + 1] == 0x75 && b[i + 2] == 0x30 && b[i + 3] == 0x30 && b[i + 4] == 0x30
                && b[i + 5] == 0x30 { return true }
            i += 1
        }
        return false
    }

    /// The same document with NUL characters removed from every string and key (jsonb cannot store `\u0000`).
    static func droppingNUL(_ value: JSONValue) -> JSONValue {
        switch value {
        case .string(let s): return .string(s.replacingOccurrences(of: "\u{0}", with: ""))
        case .array(let a): return .array(a.map(droppingNUL))
        case .object(let o):
            var out: [String: JSONValue] = [:]
            for (k, v) in o { out[k.replacingOccurrences(of: "\u{0}", with: "")] = droppingNUL(v) }
            return .object(out)
        default: return value
        }
    }

    /// The transaction versions of a batch, each (environment, transactionId, signedDate) once, and which of them is
    /// the newest of its transaction in the batch (the candidate current fact).
    struct TransactionVersions: Sendable {
        struct Version: Sendable {
            var environment: String, transactionId: String, signedDate: Int64, payload: String
            var eventId: String
            var columns: TransactionColumns
        }
        var versions: [Version] = []
        var isNewest: [Bool] = []

        /// `texts`: by event id, each event's transaction text and columns (`BatchPlan.init`).
        init?(_ events: [EntitlementEvent], texts: [String: EventTexts]) {
            var seen = Set<VersionKey>()
            versions.reserveCapacity(events.count)
            for event in events {
                guard let t = texts[event.eventId], let payload = t.transaction, let c = t.transactionColumns else { continue }
                guard let transactionId = c.transactionId ?? event.transactionId else { continue }
                let signed = c.signedDate ?? event.signedDate
                guard seen.insert(VersionKey(environment: event.environment, transactionId: transactionId, signedDate: signed)).inserted
                else { continue }
                versions.append(Version(
                    environment: event.environment, transactionId: transactionId, signedDate: signed, payload: payload,
                    eventId: event.eventId, columns: c))
            }
            guard !versions.isEmpty else { return nil }
            // The newest version of each (environment, transactionId) in the batch is the candidate current fact
            // (chosen here rather than by a DISTINCT ON sort of the whole batch in the statement). Ties are
            // impossible: versions are distinct by (environment, transactionId, signedDate).
            var newest: [VersionKey: Int] = [:]
            for (i, v) in versions.enumerated() {
                let key = VersionKey(environment: v.environment, transactionId: v.transactionId, signedDate: 0)
                if let j = newest[key], versions[j].signedDate >= v.signedDate { continue }
                newest[key] = i
            }
            isNewest = [Bool](repeating: false, count: versions.count)
            for i in newest.values { isNewest[i] = true }
        }
    }

    static let transactionColumns = [
        "environment", "transaction_id", "signed_date_ms", "signed_date", "original_transaction_id",
        "web_order_line_item_id", "bundle_id", "product_id", "product_type", "app_account_token", "ownership_type",
        "quantity", "purchase_date", "original_purchase_date", "expires_date", "revocation_date", "revocation_reason",
        "revocation_type", "revocation_percentage", "is_upgraded", "payload", "event_id",
    ]

    /// Returns one row: (versions inserted, current facts inserted or replaced). `stored`: what a transaction version
    /// already stored does to its insert (`StoredRows`); the current fact is an upsert either way. (A batch whose
    /// versions are copied writes its current facts with `currentFactsFromCopiedVersions`.)
    static func transactionsQuery(_ all: TransactionVersions, stored: StoredRows) -> PostgresQuery {
        let versions = all.versions
        func column<T>(_ value: (TransactionColumns) -> T?) -> [T?] { versions.map { value($0.columns) } }
        func int32(_ value: Int64?) -> Int32? { value.flatMap { Int32(exactly: $0) } }
        var b = ColumnBinds()
        b.column(versions.map(\.environment), "text", as: "env")
        b.column(versions.map(\.transactionId), "text", as: "txn")
        b.column(versions.map(\.signedDate), "bigint", as: "sd")
        b.column(column(\.originalTransactionId), "text", as: "ot")
        b.column(column(\.webOrderLineItemId), "text", as: "wo")
        b.column(column(\.bundleId), "text", as: "bu")
        b.column(column(\.productId), "text", as: "pr")
        b.column(column(\.type), "text", as: "ty")
        b.column(column(\.appAccountToken), "text", as: "tok")
        b.column(column(\.inAppOwnershipType), "text", as: "own")
        b.column(column { int32($0.quantity) }, "integer", as: "qty")
        b.column(column(\.purchaseDate), "bigint", as: "pd")
        b.column(column(\.originalPurchaseDate), "bigint", as: "opd")
        b.column(column(\.expiresDate), "bigint", as: "ex")
        b.column(column(\.revocationDate), "bigint", as: "rd")
        b.column(column { int32($0.revocationReason) }, "integer", as: "rr")
        b.column(column(\.revocationType), "text", as: "rt")
        b.column(column { int32($0.revocationPercentage) }, "integer", as: "rp")
        b.column(column(\.isUpgraded), "boolean", as: "up")
        b.column(versions.map(\.payload), "text", as: "p")
        b.column(versions.map(\.eventId), "text", as: "ev")
        b.column(all.isNewest, "boolean", as: "cur")
        let columns = transactionColumns.joined(separator: ", ")
        let select = """
            env, txn, sd, fleet_ms(sd), ot, wo, bu, pr, ty, tok, own, qty, fleet_ms(pd), fleet_ms(opd), fleet_ms(ex),
            fleet_ms(rd), rr, rt, rp, up, pj, ev
            """
        let current = currentFactsUpsert("SELECT \(select) FROM v WHERE v.cur")
        return b.query("""
            WITH v AS (
                -- Materialized once (used twice): the payload is parsed into jsonb once per version.
                SELECT x.*, x.p::jsonb AS pj FROM \(b.rows())
            ), ver AS (
                INSERT INTO transaction_versions (\(columns))
                SELECT \(select) FROM v
                \(stored == .skip ? "ON CONFLICT (environment, transaction_id, signed_date_ms) DO NOTHING" : "")
                RETURNING 1
            ), \(current) SELECT (SELECT count(*) FROM ver), (SELECT count(*) FROM cur)
            """)
    }

    /// The current facts of a batch whose versions were just copied into `transaction_versions` (in the same
    /// transaction, before this statement): each row is read back from its version, by its key, instead of being
    /// bound again. Every column is the version's, so the payload is not parsed into jsonb a second time (it was
    /// ~8 % of the backend's time in `bench sink`), and three arrays are bound instead of twenty-two. The
    /// `LIMIT 1` keeps the lateral subquery from being flattened into a join the planner might run as a hash join
    /// over the whole table: each key is one probe of the version's primary key.
    static func currentFactsFromCopiedVersions(_ all: TransactionVersions) -> PostgresQuery {
        let versions = all.versions.indices.filter { all.isNewest[$0] }.map { all.versions[$0] }
        var b = ColumnBinds()
        b.column(versions.map(\.environment), "text", as: "env")
        b.column(versions.map(\.transactionId), "text", as: "txn")
        b.column(versions.map(\.signedDate), "bigint", as: "sd")
        let upsert = currentFactsUpsert("""
            SELECT v.* FROM \(b.rows()) CROSS JOIN LATERAL (
                SELECT \(transactionColumns.joined(separator: ", ")) FROM transaction_versions
                WHERE environment = x.env AND transaction_id = x.txn AND signed_date_ms = x.sd LIMIT 1
            ) AS v
            """)
        return b.query("WITH \(upsert) SELECT 0::bigint, (SELECT count(*) FROM cur)")
    }

    /// `cur AS (...)`: the upsert of current transaction facts from the rows `select` gives (every column of
    /// `transactionColumns`, in order), a stored fact replaced only by a newer one; returns a row per fact written.
    static func currentFactsUpsert(_ select: String) -> String {
        let updates = transactionColumns.filter { $0 != "environment" && $0 != "transaction_id" }
            .map { "\($0) = EXCLUDED.\($0)" }.joined(separator: ", ")
        return """
            cur AS (
                INSERT INTO transactions (\(transactionColumns.joined(separator: ", ")))
                \(select)
                ON CONFLICT (environment, transaction_id) DO UPDATE SET \(updates)
                WHERE transactions.signed_date_ms < EXCLUDED.signed_date_ms
                RETURNING 1
            )
            """
    }

    /// Every transaction version of a batch whose rows are all assumed new, for a binary COPY; nil when a date is
    /// outside `CopyBinary.isWritable` (then `transactionsQuery` writes them).
    static func transactionVersionsCopy(_ all: TransactionVersions) -> CopyRows? {
        var size = CopySize()
        guard versionRows(all, into: &size) else { return nil }
        var t = CopyBinary(columns: transactionColumns.count, capacity: size.byteCount)
        _ = versionRows(all, into: &t)
        return CopyRows(table: "transaction_versions", columns: transactionColumns, rows: t)
    }

    /// Writes the rows of `transactionVersionsCopy`; false for a date outside `CopyBinary.isWritable`.
    private static func versionRows<W: CopyFields>(_ all: TransactionVersions, into t: inout W) -> Bool {
        for v in all.versions {
            let c = v.columns
            guard CopyBinary.isWritable(v.signedDate), CopyBinary.isWritable(c.purchaseDate),
                  CopyBinary.isWritable(c.originalPurchaseDate), CopyBinary.isWritable(c.expiresDate),
                  CopyBinary.isWritable(c.revocationDate) else { return false }
            t.text(v.environment); t.text(v.transactionId); t.int64(v.signedDate); t.timestamp(v.signedDate)
            t.text(c.originalTransactionId); t.text(c.webOrderLineItemId); t.text(c.bundleId); t.text(c.productId)
            t.text(c.type); t.text(c.appAccountToken); t.text(c.inAppOwnershipType)
            t.int32(c.quantity.flatMap { Int32(exactly: $0) }); t.timestamp(c.purchaseDate)
            t.timestamp(c.originalPurchaseDate); t.timestamp(c.expiresDate); t.timestamp(c.revocationDate)
            t.int32(c.revocationReason.flatMap { Int32(exactly: $0) }); t.text(c.revocationType)
            t.int32(c.revocationPercentage.flatMap { Int32(exactly: $0) }); t.boolean(c.isUpgraded)
            t.jsonb(v.payload); t.text(v.eventId)
            t.endRow()
        }
        return true
    }

    /// The statuses (bound last, `statuses[i]` being the status of `events[i]`) are known only inside the
    /// transaction.
    static func eventsStatement(
        _ events: [EntitlementEvent], texts: [String: EventTexts], stored: StoredRows
    ) -> EventsStatement? {
        guard !events.isEmpty else { return nil }
        var b = ColumnBinds()
        b.column(events.map(\.eventId), "text", as: "id")
        b.column(events.map(\.environment), "text", as: "env")
        b.column(events.map(\.kind), "text", as: "k")
        b.column(events.map(\.effect.rawValue), "text", as: "ef")
        b.column(events.map(\.reason), "text", as: "r")
        b.column(events.map(\.subject), "text", as: "su")
        b.column(events.map(\.entitlementColumn), "text", as: "en")
        b.column(events.map(\.productId), "text", as: "pr")
        b.column(events.map(\.productType), "text", as: "pt")
        b.column(events.map(\.transactionId), "text", as: "tr")
        b.column(events.map(\.originalTransactionId), "text", as: "ot")
        b.column(events.map(\.webOrderLineItemId), "text", as: "wo")
        b.column(events.map(\.appAccountToken), "text", as: "tok")
        b.column(events.map(\.ownershipType), "text", as: "own")
        b.column(events.map { $0.quantity.flatMap { Int32(exactly: $0) } }, "integer", as: "q")
        b.column(events.map { $0.units.flatMap { Int32(exactly: $0) } }, "integer", as: "un")
        b.column(events.map(\.validFrom), "bigint", as: "vf")
        b.column(events.map(\.validUntil), "bigint", as: "vu")
        b.column(events.map(\.revocationDate), "bigint", as: "rd")
        b.column(events.map { $0.revocationReason.flatMap { Int32(exactly: $0) } }, "integer", as: "rr")
        b.column(events.map(\.revocationType), "text", as: "rt")
        b.column(events.map { $0.revocationPercentage.flatMap { Int32(exactly: $0) } }, "integer", as: "rp")
        b.column(events.map { $0.notification?.uuid }, "text", as: "nu")
        b.column(events.map { $0.notification?.type }, "text", as: "nt")
        b.column(events.map { $0.notification?.subtype }, "text", as: "ns")
        b.column(events.map(\.signedDate), "bigint", as: "sd")
        b.column(events.map(\.verifiedAt), "bigint", as: "va")
        b.column(events.map(\.source.topic), "text", as: "tp")
        b.column(events.map(\.source.partition), "integer", as: "pa")
        b.column(events.map(\.source.offset), "bigint", as: "o")
        b.column(events.map(\.source.inputKind), "text", as: "ik")
        let eventTexts = events.map { texts[$0.eventId] }
        b.column(eventTexts.map { $0?.renewalInfo }, "text", as: "ri")
        b.column(eventTexts.map { $0?.appTransaction }, "text", as: "at")
        b.column(eventTexts.map { $0?.details }, "text", as: "de")
        let status = b.nextPlaceholder
        let sql = """
            WITH ins AS (
                INSERT INTO entitlement_events (\(eventColumns.joined(separator: ", ")))
                SELECT id, env, k, ef, r, su, en, pr, pt, tr, ot, wo, tok, own, q, un, fleet_ms(vf), fleet_ms(vu),
                       fleet_ms(rd), rr, rt, rp, nu, nt, ns, fleet_ms(sd), sd, fleet_ms(va), tp, pa, o, ik,
                       ri::jsonb, at::jsonb, de::jsonb, st
                FROM \(b.rows("unnest(\(status)::text[]) AS st"))
                \(stored == .skip ? "ON CONFLICT (event_id) DO NOTHING" : "")
                RETURNING 1
            ) SELECT count(*) FROM ins
            """
        return EventsStatement(binds: b, sql: sql, statusPlaceholder: status)
    }
}

extension BatchPlan {
    /// The entitlement_events rows of a batch whose events are all assumed new, for a binary COPY, the status (known
    /// after the fold) to be appended. nil when a date is outside `CopyBinary.isWritable` (then `eventsStatement`).
    static func eventsCopy(_ events: [EntitlementEvent], texts: [String: EventTexts]) -> CopyRows? {
        guard !events.isEmpty else { return nil }
        var size = CopySize()
        var noEnds: [Int]? = nil
        guard eventRows(events, texts, ends: &noEnds, into: &size) else { return nil }
        var t = CopyBinary(columns: eventColumns.count, capacity: size.byteCount)
        var ends: [Int]? = []
        _ = eventRows(events, texts, ends: &ends, into: &t)
        return CopyRows(table: "entitlement_events", columns: eventColumns, rows: t, rowEnds: ends ?? [])
    }

    /// Writes the rows of `eventsCopy` but their status, and where each ends (when `ends` is not nil: the sizing
    /// pass needs no ends); false for a date outside `CopyBinary.isWritable`.
    private static func eventRows<W: CopyFields>(
        _ events: [EntitlementEvent], _ texts: [String: EventTexts], ends: inout [Int]?, into t: inout W
    ) -> Bool {
        ends?.reserveCapacity(events.count)
        for e in events {
            guard CopyBinary.isWritable(e.validFrom), CopyBinary.isWritable(e.validUntil),
                  CopyBinary.isWritable(e.revocationDate), CopyBinary.isWritable(e.signedDate),
                  CopyBinary.isWritable(e.verifiedAt) else { return false }
            let x = texts[e.eventId]
            t.text(e.eventId); t.text(e.environment); t.text(e.kind); t.text(e.effect.rawValue); t.text(e.reason)
            t.text(e.subject); t.text(e.entitlementColumn); t.text(e.productId)
            t.text(e.productType); t.text(e.transactionId); t.text(e.originalTransactionId); t.text(e.webOrderLineItemId)
            t.text(e.appAccountToken); t.text(e.ownershipType)
            t.int32(e.quantity.flatMap { Int32(exactly: $0) }); t.int32(e.units.flatMap { Int32(exactly: $0) })
            t.timestamp(e.validFrom); t.timestamp(e.validUntil); t.timestamp(e.revocationDate)
            t.int32(e.revocationReason.flatMap { Int32(exactly: $0) }); t.text(e.revocationType)
            t.int32(e.revocationPercentage.flatMap { Int32(exactly: $0) })
            t.text(e.notification?.uuid); t.text(e.notification?.type); t.text(e.notification?.subtype)
            t.timestamp(e.signedDate); t.int64(e.signedDate); t.timestamp(e.verifiedAt)
            t.text(e.source.topic); t.int32(e.source.partition); t.int64(e.source.offset); t.text(e.source.inputKind)
            t.jsonb(x?.renewalInfo); t.jsonb(x?.appTransaction); t.jsonb(x?.details)
            t.endRow(pending: 1)
            ends?.append(t.byteCount)
        }
        return true
    }

    /// The entitlement_events columns both writes fill, in their order; the status (known after the fold) last.
    static let eventColumns = [
        "event_id", "environment", "kind", "effect", "reason", "subject", "entitlement", "product_id", "product_type",
        "transaction_id", "original_transaction_id", "web_order_line_item_id", "app_account_token", "ownership_type",
        "quantity", "units", "valid_from", "valid_until", "revocation_date", "revocation_reason", "revocation_type",
        "revocation_percentage", "notification_uuid", "notification_type", "notification_subtype", "signed_date",
        "signed_date_ms", "verified_at", "source_topic", "source_partition", "source_offset", "input_kind",
        "renewal_info", "app_transaction", "details", "status",
    ]
}

extension EntitlementEvent {
    /// `entitlement_events.entitlement`: the event's entitlement, else a non-consumable's product.
    var entitlementColumn: String? { entitlement ?? (isConsumable ? nil : productId) }
}

/// A transaction version's key within a batch (`signedDate` 0 for the key of its transaction).
private struct VersionKey: Hashable {
    var environment: String, transactionId: String, signedDate: Int64
}

/// The columns of `transaction_versions` / `transactions` read from a verified transaction document in one pass over
/// its members, with the conversions of `JWSTransactionDecodedPayload`'s accessors (a member of another JSON type
/// reads as nil). One pass instead of a hashed lookup per column: this runs for every event of every batch.
struct TransactionColumns {
    var transactionId, originalTransactionId, webOrderLineItemId, bundleId, productId, type: String?
    var appAccountToken, inAppOwnershipType, revocationType: String?
    var signedDate, quantity, purchaseDate, originalPurchaseDate, expiresDate, revocationDate: Int64?
    var revocationReason, revocationPercentage: Int64?
    var isUpgraded: Bool?

    init(_ members: [String: JSONValue]) {
        for (key, value) in members { set(key, value) }
    }

    /// From the text of a transaction document already checked by the sink's decoder, member by member, without
    /// building the document. Text that is not a JSON object gives no columns.
    init(json text: String) {
        try? JSONValue.forEachMember(ofObject: text, maxDepth: 64) { set($0, $1) }
    }

    private mutating func set(_ key: String, _ value: JSONValue) {
        switch key {
        case "transactionId": transactionId = value.stringValue
        case "originalTransactionId": originalTransactionId = value.stringValue
        case "webOrderLineItemId": webOrderLineItemId = value.stringValue
        case "bundleId": bundleId = value.stringValue
        case "productId": productId = value.stringValue
        case "type": type = value.stringValue
        case "appAccountToken": appAccountToken = value.stringValue
        case "inAppOwnershipType": inAppOwnershipType = value.stringValue
        case "revocationType": revocationType = value.stringValue
        case "signedDate": signedDate = value.int64Value
        case "quantity": quantity = value.int64Value
        case "purchaseDate": purchaseDate = value.int64Value
        case "originalPurchaseDate": originalPurchaseDate = value.int64Value
        case "expiresDate": expiresDate = value.int64Value
        case "revocationDate": revocationDate = value.int64Value
        case "revocationReason": revocationReason = value.int64Value
        case "revocationPercentage": revocationPercentage = value.int64Value
        case "isUpgraded": isUpgraded = value.boolValue
        default: break
        }
    }
}
