import AppStoreVerification
import EntitlementDomain
import FleetDevStack
import Foundation
import Logging
import PostgresNIO
import Synchronization
import Testing

@testable import FleetSink

/// One throwaway PostgreSQL server for the whole test process; each test gets a fresh database.
actor TestPostgres {
    static let shared = TestPostgres()
    private var server: ThrowawayPostgres?
    private var counter = 0

    func get() async throws -> ThrowawayPostgres {
        if let server { return server }
        let made = try await ThrowawayPostgres(database: "fleet_tests")
        registerForCleanup(made)
        server = made
        return made
    }

    /// A fresh, migrated database; returns its URL.
    func freshDatabase(migrate: Bool = true) async throws -> String {
        let server = try await get()
        counter += 1
        let url = try await server.createDatabase("t\(counter)_\(UInt32.random(in: 0...UInt32.max))")
        if migrate {
            try await withConnection(url) { c in try await SinkSchema.migrate(connection: c, logger: testLogger) }
        }
        return url
    }
}

let cleanup = Mutex<[ThrowawayPostgres]>([])
func registerForCleanup(_ server: ThrowawayPostgres) {
    let first = cleanup.withLock { list in
        list.append(server)
        return list.count == 1
    }
    if first {
        atexit {
            for server in cleanup.withLock({ $0 }) { server.destroy() }
        }
    }
}

let testLogger: Logger = {
    var l = Logger(label: "fleet-sink-tests")
    l.logLevel = .warning
    return l
}()

@discardableResult
func withConnection<T: Sendable>(_ url: String, _ body: (PostgresConnection) async throws -> T) async throws -> T {
    let config = try DatabaseURL(url).connectionConfiguration()
    let connection = try await PostgresConnection.connect(configuration: config, id: 9, logger: testLogger)
    do {
        let result = try await body(connection)
        try await connection.close()
        return result
    } catch {
        try? await connection.close()
        throw error
    }
}

let dumpedTables = [
    "notifications", "transactions", "transaction_versions", "entitlement_events", "entitlements",
    "consumable_ledger", "schema_migrations",
]

/// Every row of every sink table as text, sorted: equal dumps mean byte-for-byte equal table contents.
func dump(_ connection: PostgresConnection) async throws -> [String: String] {
    var result: [String: String] = [:]
    for table in dumpedTables {
        let rows = try await connection.query(
            PostgresQuery(unsafeSQL: "SELECT coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '') FROM \(table) t"),
            logger: testLogger)
        for try await text in rows.decode(String.self) { result[table] = text }
    }
    return result
}

func scalar<T: PostgresDecodable & Sendable>(_ c: PostgresConnection, _ sql: String, as: T.Type = T.self) async throws -> T {
    let rows = try await c.query(PostgresQuery(unsafeSQL: sql), logger: testLogger).collect()
    guard let row = rows.first else { throw TestFailure("no row for \(sql)") }
    return try row.decode(T.self)
}

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}

let baseTime: Int64 = 1_760_000_000_000
let day: Int64 = 86_400_000

/// A subscription / one-time event shaped like what the workers emit.
func makeEvent(
    _ id: String, kind: String, effect: EntitlementEffect, signed: Int64, subject: String? = "otx-1",
    product: String = "com.example.premium.monthly", productType: String = "Auto-Renewable Subscription",
    entitlement: String? = "premium", transactionId: String? = "tx-1", originalTransactionId: String? = "otx-1",
    environment: String = "Sandbox", validFrom: Int64? = nil, validUntil: Int64? = nil,
    revocationDate: Int64? = nil, revocationPercentage: Int? = nil, units: Int? = nil, quantity: Int? = 1,
    notificationType: String? = nil, subtype: String? = nil, uuid: String? = nil, offset: Int64 = 0
) -> EntitlementEvent {
    var transaction: JSONValue? = nil
    if let transactionId {
        var o: [String: JSONValue] = [
            "transactionId": .string(transactionId), "productId": .string(product), "type": .string(productType),
            "signedDate": .integer(signed), "environment": .string(environment), "inAppOwnershipType": .string("PURCHASED"),
            "purchaseDate": .integer(validFrom ?? signed), "bundleId": .string("com.example.app"),
        ]
        if let originalTransactionId { o["originalTransactionId"] = .string(originalTransactionId) }
        if let quantity { o["quantity"] = .integer(Int64(quantity)) }
        if let validUntil { o["expiresDate"] = .integer(validUntil) }
        if let revocationDate {
            o["revocationDate"] = .integer(revocationDate)
            o["revocationReason"] = .integer(1)
        }
        if let revocationPercentage { o["revocationPercentage"] = .integer(Int64(revocationPercentage)) }
        transaction = .object(o)
    }
    let notification = notificationType.map {
        EventNotification(uuid: uuid ?? "n-\(id)", type: $0, subtype: subtype, signedDate: signed, version: "2.0")
    }
    return EntitlementEvent(
        eventId: id, kind: kind, effect: effect, reason: subtype?.lowercased(), environment: environment,
        bundleId: "com.example.app", appAppleId: 1234, subject: subject, productId: product, productType: productType,
        transactionId: transactionId, originalTransactionId: originalTransactionId,
        quantity: quantity, validFrom: validFrom, validUntil: validUntil, revocationDate: revocationDate,
        revocationReason: revocationDate == nil ? nil : 1, revocationType: revocationDate == nil ? nil : "REFUND_FULL",
        revocationPercentage: revocationPercentage, notification: notification, signedDate: signed,
        verifiedAt: signed + 1_000, source: EventSource(topic: "appstore.raw", partition: 0, offset: offset, inputKind: "notification"),
        units: units, entitlement: entitlement, transaction: transaction)
}

func encode(_ event: EntitlementEvent) -> [UInt8] {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys]
    return Array((try? encoder.encode(event)) ?? Data())
}

/// A mixed stream over several subjects: subscriptions with renewals, refunds, reversals, state changes,
/// consumables (including repeats), and a TEST notification. Delivered in a shuffled order.
func mixedStream(subjects: Int = 6) -> [EntitlementEvent] {
    var events: [EntitlementEvent] = []
    for s in 0..<subjects {
        let otx = "otx-\(s)"
        let t0 = baseTime + Int64(s) * 1000
        events.append(makeEvent("e\(s)-buy", kind: "SUBSCRIPTION_STARTED", effect: .grant, signed: t0, subject: otx,
            transactionId: otx, originalTransactionId: otx, validFrom: t0, validUntil: t0 + 30 * day,
            notificationType: "SUBSCRIBED", subtype: "INITIAL_BUY"))
        events.append(makeEvent("e\(s)-renew", kind: "SUBSCRIPTION_RENEWED", effect: .extend, signed: t0 + 30 * day,
            subject: otx, transactionId: "\(otx)-r1", originalTransactionId: otx, validFrom: t0 + 30 * day,
            validUntil: t0 + 60 * day, notificationType: "DID_RENEW"))
        events.append(makeEvent("e\(s)-autorenew-off", kind: "AUTO_RENEW_DISABLED", effect: .state, signed: t0 + 31 * day,
            subject: otx, transactionId: "\(otx)-r1", originalTransactionId: otx, validUntil: t0 + 60 * day,
            notificationType: "DID_CHANGE_RENEWAL_STATUS", subtype: "AUTO_RENEW_DISABLED"))
        if s % 2 == 0 {
            events.append(makeEvent("e\(s)-refund", kind: "REFUNDED", effect: .revoke, signed: t0 + 35 * day,
                subject: otx, transactionId: "\(otx)-r1", originalTransactionId: otx, validUntil: t0 + 60 * day,
                revocationDate: t0 + 35 * day, notificationType: "REFUND"))
        }
        if s % 4 == 0 {
            events.append(makeEvent("e\(s)-reversed", kind: "REFUND_REVERSED", effect: .restore, signed: t0 + 40 * day,
                subject: otx, transactionId: "\(otx)-r1", originalTransactionId: otx, validUntil: t0 + 60 * day,
                notificationType: "REFUND_REVERSED"))
        }
        // Consumables: a purchase delivered three times (notification + two client JWS), one refunded.
        let ctx = "c-\(s)"
        for copy in 0..<3 {
            events.append(makeEvent("e\(s)-gems-\(copy)", kind: "ONE_TIME_PURCHASED", effect: .grant, signed: t0 + 2 * day,
                subject: "user-\(s)", product: "com.example.gems100", productType: "Consumable", entitlement: nil,
                transactionId: ctx, originalTransactionId: ctx, units: 100,
                notificationType: copy == 0 ? "ONE_TIME_CHARGE" : nil))
        }
        if s % 3 == 0 {
            events.append(makeEvent("e\(s)-gems-refund", kind: "REFUNDED", effect: .revoke, signed: t0 + 3 * day,
                subject: "user-\(s)", product: "com.example.gems100", productType: "Consumable", entitlement: nil,
                transactionId: ctx, originalTransactionId: ctx, revocationDate: t0 + 3 * day, revocationPercentage: 50_000,
                units: 100, notificationType: "REFUND"))
        }
    }
    events.append(makeEvent("test-1", kind: "TEST_RECEIVED", effect: .info, signed: baseTime, subject: nil,
        transactionId: nil, originalTransactionId: nil, notificationType: "TEST"))
    var generator = SplitMix(seed: 42)
    return events.shuffled(using: &generator)
}

struct SplitMix: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

func chunks<T>(_ items: [T], of size: Int) -> [[T]] {
    stride(from: 0, to: items.count, by: size).map { Array(items[$0..<min($0 + size, items.count)]) }
}

/// `withConnection` for multi-statement bodies that return nothing (keeps the closure's `throws` explicit).
func onDatabase(_ url: String, _ body: (PostgresConnection) async throws -> Void) async throws {
    try await withConnection(url) { (c: PostgresConnection) async throws -> Bool in
        try await body(c)
        return true
    }
}
