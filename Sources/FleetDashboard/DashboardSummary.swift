import EntitlementDomain

/// `GET /api/summary`. The first four keys keep their meaning: `events` distinct eventIds read from the result topic,
/// `byKind` the same per kind, `rejected` records of the rejected topic per `reason` header, `activeEntitlements`
/// subjects entitled now per entitlement (all environments; per environment under `environments`).
public struct DashboardSummary: Codable, Sendable, Equatable {
    public var events = 0
    public var byKind: [String: Int] = [:]
    public var rejected: [String: Int] = [:]
    public var activeEntitlements: [String: Int] = [:]
    public var rejectedTotal = 0
    /// Records read (duplicates and undecodable ones included).
    public var records = Records()
    /// Events older than what their entitlement already applied: counted in `events`, changed no entitlement.
    public var stale = 0
    public var untrackedEntitlements = 0
    public var dedupe = Dedupe()
    public var lag = Lag()
    public var rejectedPerMinute: [MinuteCount] = []
    public var environments: [String: EnvironmentSummary] = [:]
    /// Production when it has events, else the first environment seen.
    public var defaultEnvironment: String?
    public var generatedAt: Int64 = 0
    /// Where reading started: `beginning` or the `--since` time (ms).
    public var readingFrom = "beginning"

    public init() {}

    public struct Records: Codable, Sendable, Equatable {
        public var result = 0
        public var rejected = 0
        public var duplicates = 0
        public var undecodable = 0
        /// Records before `--since`, skipped.
        public var skipped = 0
        public init(result: Int = 0, rejected: Int = 0, duplicates: Int = 0, undecodable: Int = 0) {
            self.result = result
            self.rejected = rejected
            self.duplicates = duplicates
            self.undecodable = undecodable
        }
    }

    public struct Dedupe: Codable, Sendable, Equatable {
        /// eventIds remembered exactly.
        public var exactWindow = 0
        public var exactIds = 0
        /// eventIds moved into the Bloom filter (then a new event may, rarely, be taken for a duplicate).
        public var filteredIds = 0
        public var approximate = false
        public init(exactWindow: Int = 0, exactIds: Int = 0, filteredIds: Int = 0, approximate: Bool = false) {
            self.exactWindow = exactWindow
            self.exactIds = exactIds
            self.filteredIds = filteredIds
            self.approximate = approximate
        }
    }

    /// How far behind the topics' ends the dashboard is (records), as last measured.
    public struct Lag: Codable, Sendable, Equatable {
        public var result: Int64?
        public var rejected: Int64?
        public var total: Int64?
        public var measuredAt: Int64?
        public var error: String?
        public init() {}
    }
}

public struct EnvironmentSummary: Codable, Sendable, Equatable {
    public var events: Int
    public var byKind: [String: Int]
    public var activeEntitlements: [String: Int]
    public var activeByProduct: [String: Int]
    public var activeHistory: [ActivePoint]
    public var perMinute: [MinuteKinds]
    public var lifecycleByDay: [LifecycleDay]
    /// Milli-units of the currency (Apple's `price`), gross, once per transaction.
    public var revenueByDay: [RevenueDay]
    public var consumables: [String: ConsumableUnits]
    /// Newest first.
    public var latest: [LatestEvent]
}

public struct MinuteCount: Codable, Sendable, Equatable {
    public var t: Int64
    public var n: Int
}

public struct MinuteKinds: Codable, Sendable, Equatable {
    public var t: Int64
    public var byKind: [String: Int]
}

public struct ActivePoint: Codable, Sendable, Equatable {
    public var t: Int64
    public var counts: [String: Int]
}

public struct LifecycleDay: Codable, Sendable, Equatable {
    public var day: String
    public var starts = 0
    public var renewals = 0
    public var expiries = 0
    public var refunds = 0
    public init(day: String) { self.day = day }
}

public struct RevenueDay: Codable, Sendable, Equatable {
    public var day: String
    public var byCurrency: [String: Int64]
}

public struct ConsumableUnits: Codable, Sendable, Equatable {
    public var credited: Int64 = 0
    public var debited: Int64 = 0
    public var recredited: Int64 = 0
    public init() {}
}

public struct LatestEvent: Codable, Sendable, Equatable {
    public var eventId: String
    public var kind: String
    public var effect: String
    public var productId: String?
    /// Shortened: the first 8 characters and an ellipsis.
    public var subject: String?
    public var validUntil: Int64?
    public var signedDate: Int64
    public var verifiedAt: Int64

    init(_ e: EntitlementEvent) {
        eventId = e.eventId
        kind = e.kind
        effect = e.effect.rawValue
        productId = e.productId
        subject = e.subject.map { $0.count > 10 ? String($0.prefix(8)) + "…" : $0 }
        validUntil = e.validUntil
        signedDate = e.signedDate
        verifiedAt = e.verifiedAt
    }
}
