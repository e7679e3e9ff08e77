import AppStoreVerification
import FleetTestPKI
import Foundation

/// Realistic App Store traffic signed by a local Apple-shaped test CA: subscribers living through simulated months
/// (subscribe, renew, billing retry, grace, expire, upgrade, refund, refund reversed, family revoke), client-sent
/// consumable purchases with replays (the seeds' ticket flow), and a share of forged, tampered, wrong-app and
/// malformed inputs. Deterministic for a given seed.
public struct DemoTraffic: Sendable {
    /// One raw-topic message.
    public struct Item: Sendable {
        public var value: [UInt8]
        public var key: String?
        /// What the generator intended, for the summary: `valid`, `replay`, or the expected rejection reason.
        public var expectation: String
        /// When the generator delivers it (inputs are published in this order; Apple's retries arrive late).
        public var deliverAt: Int64
    }

    public struct Options: Sendable {
        public var subscribers = 300
        public var months = 6
        public var ticketBuyers = 120
        /// Share of bad inputs (forged, tampered, wrong app, malformed, legacy receipt).
        public var badShare = 0.04
        public var seed: UInt64 = 42
        public var bundleId = "com.example.fleet"
        public var appAppleId: Int64 = 1_234_567_890
        public var environment: AppStoreVerification.Environment = .sandbox
        /// End of the simulated timeline (default: now).
        public var end = EpochMillis.now()
        /// Deliver each recent refund request (the purchase, then its CONSUMPTION_REQUEST) at a random point of the
        /// traffic instead of at its end. Their dates stay within Apple's answer window; only the publishing order
        /// changes, so a chaos soak's App Store API outages (`api_down`) meet some of them while they are answered.
        public var spreadRecentRequests = false
        /// How many recent refund requests (answerable CONSUMPTION_REQUESTs); nil: one per 20 ticket buyers, at least 1.
        public var recentRequests: Int?
        public init() {}
    }

    /// The demo's product catalogue (also written to products.yaml for the workers).
    public static let catalogueYAML = """
    # Demo product catalogue: productId -> type, units, duration, entitlement.
    products:
      com.example.pro.monthly:      { type: auto-renewable, entitlement: pro }
      com.example.pro.yearly:       { type: auto-renewable, entitlement: pro }
      com.example.premium.monthly:  { type: auto-renewable, entitlement: premium }
      com.example.lifetime:         { type: non-consumable, entitlement: lifetime }
      com.example.pass.30d:         { type: non-renewing, duration: P30D, entitlement: pro }
      com.example.tickets.10:       { type: consumable, units: 10, entitlement: tickets }
      com.example.tickets.50:       { type: consumable, units: 50, entitlement: tickets }

    """

    public let items: [Item]

    /// A transaction as the App Store keeps it: what its Server API answers about (a consumption request's answer is
    /// refused with 404 for a transaction it does not know).
    public struct StoredTransaction: Sendable {
        public var transactionId: String
        public var originalTransactionId: String
        public var signedTransaction: String
    }

    /// Every purchase the apps sent as a signed transaction, in the order they were made.
    public let storedTransactions: [StoredTransaction]

    public init(pki: TestPKI, options o: Options = Options()) throws {
        var g = Generator(pki: pki, forged: try TestPKI.forged(), o: o)
        g.receiptPKI = try TestReceiptPKI(under: pki)
        g.run()
        items = g.items
        storedTransactions = g.stored
    }
}

private let minute: Int64 = 60_000
private let hour: Int64 = 3_600_000
private let day: Int64 = 86_400_000
private let month: Int64 = 30 * day

/// SplitMix64: small, fast, deterministic.
private struct Rng {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    mutating func chance(_ p: Double) -> Bool { Double(next() % 1_000_000) / 1_000_000 < p }
    mutating func int(_ range: Range<Int64>) -> Int64 { range.lowerBound + Int64(next() % UInt64(range.upperBound - range.lowerBound)) }
    mutating func uuid() -> String {
        let a = next(), b = next()
        let hex = String(format: "%016llx%016llx", a, b)
        let c = Array(hex)
        return "\(String(c[0..<8]))-\(String(c[8..<12]))-4\(String(c[13..<16]))-8\(String(c[17..<20]))-\(String(c[20..<32]))"
    }
}

private struct Generator {
    let pki: TestPKI
    let forged: TestPKI
    /// Legacy app receipts (older app versions), anchored at the same test root.
    var receiptPKI: TestReceiptPKI?
    let o: DemoTraffic.Options
    var rng: Rng
    /// Where `spreadRecentRequests` puts each recent request (a sequence of its own, so it changes no input).
    var spreadRng: Rng
    var items: [DemoTraffic.Item] = []
    var stored: [DemoTraffic.StoredTransaction] = []
    var lastNotification = ""
    var nextTransaction: UInt64 = 2_000_000_100_000_000

    init(pki: TestPKI, forged: TestPKI, o: DemoTraffic.Options) {
        self.pki = pki
        self.forged = forged
        self.o = o
        self.rng = Rng(state: o.seed)
        self.spreadRng = Rng(state: o.seed ^ 0x5350_5245_4144)
    }

    mutating func newTransactionId() -> String {
        nextTransaction += 1 + rng.next() % 7
        return String(nextTransaction)
    }

    var start: Int64 { o.end - Int64(o.months) * month }

    // MARK: - Building blocks

    func txn(_ productId: String, id: String, original: String, purchase: Int64, expires: Int64?, signed: Int64,
             type: ProductType = .autoRenewable, token: String?, quantity: Int64 = 1,
             ownership: InAppOwnershipType = .purchased, revocation: (Int64, RevocationType, Int64?)? = nil,
             upgraded: Bool? = nil, wol: String? = nil, offer: OfferType? = nil) -> JSONValue {
        TestPayloads.transaction(
            productId: productId, transactionId: id, originalTransactionId: original, purchaseDate: purchase,
            expiresDate: expires, type: type, environment: o.environment, bundleId: o.bundleId, signedDate: signed,
            webOrderLineItemId: wol ?? (type == .autoRenewable ? "5" + id.dropFirst() : nil), quantity: quantity,
            inAppOwnershipType: ownership, appAccountToken: token, revocationDate: revocation?.0,
            revocationReason: revocation.map { _ in RevocationReason.other }, revocationType: revocation?.1,
            revocationPercentage: revocation?.2, isUpgraded: upgraded, offerType: offer,
            appTransactionId: nil)
    }

    func renewal(_ original: String, product: String, autoRenew: Bool = true, signed: Int64, grace: Int64? = nil,
                 retry: Bool? = nil, intent: ExpirationIntent? = nil, autoRenewProduct: String? = nil, token: String?) -> JSONValue {
        TestPayloads.renewalInfo(
            originalTransactionId: original, productId: product, autoRenewProductId: autoRenewProduct,
            autoRenewStatus: autoRenew ? .on : .off, environment: o.environment, signedDate: signed,
            expirationIntent: intent, isInBillingRetryPeriod: retry, gracePeriodExpiresDate: grace,
            appAccountToken: token)
    }

    mutating func notify(_ type: NotificationTypeV2, _ subtype: Subtype? = nil, txn: JSONValue?, renewal: JSONValue?,
                         signed: Int64, key: String) {
        let uuid = rng.uuid()
        let jws = pki.signNotification(
            type: type, subtype: subtype, transaction: txn, renewal: renewal, environment: o.environment,
            bundleId: o.bundleId, appAppleId: o.appAppleId, signedDate: signed, notificationUUID: uuid)
        items.append(.init(value: Array(jws.utf8), key: key, expectation: "valid", deliverAt: signed))
        lastNotification = jws
        // Apple retries a notification it thinks failed: same UUID, same signedDate, delivered later.
        if rng.chance(0.02) {
            items.append(.init(value: Array(jws.utf8), key: key, expectation: "replay", deliverAt: signed + rng.int(day..<3 * day)))
        }
    }

    mutating func client(_ payload: JSONValue, signed: Int64, key: String, replays: Int = 0) {
        let jws = pki.sign(payload)
        items.append(.init(value: Array(jws.utf8), key: key, expectation: "valid", deliverAt: signed))
        if let id = payload["transactionId"]?.stringValue, let original = payload["originalTransactionId"]?.stringValue {
            stored.append(.init(transactionId: id, originalTransactionId: original, signedTransaction: jws))
        }
        for r in 0..<replays {
            items.append(.init(value: Array(jws.utf8), key: key, expectation: "replay", deliverAt: signed + Int64(r + 1) * 60_000))
        }
    }

    // MARK: - Lives

    mutating func run() {
        let products = ["com.example.pro.monthly", "com.example.pro.monthly", "com.example.pro.monthly",
                        "com.example.premium.monthly", "com.example.premium.monthly", "com.example.pro.yearly"]
        for _ in 0..<o.subscribers {
            subscriberLife(product: products[Int(rng.next() % UInt64(products.count))])
        }
        for _ in 0..<o.ticketBuyers { ticketBuyer() }
        for _ in 0..<(o.recentRequests ?? max(1, o.ticketBuyers / 20)) { recentRefundRequest() }
        for _ in 0..<max(1, o.subscribers / 20) { lifetimeBuyer() }
        // Operational notifications.
        notify(.test, txn: nil, renewal: nil, signed: o.end - day, key: "test")
        let summary = TestPayloads.summaryNotification(
            environment: o.environment, bundleId: o.bundleId, appAppleId: o.appAppleId, signedDate: o.end - 2 * day,
            productId: "com.example.pro.monthly", succeededCount: Int64(o.subscribers / 2), failedCount: 1)
        items.append(.init(value: Array(pki.sign(summary).utf8), key: "summary", expectation: "valid", deliverAt: o.end - 2 * day))
        badInputs()
        // Roughly time-ordered, as Apple sends them, with retries landing late.
        items.sort { $0.deliverAt < $1.deliverAt }
    }

    mutating func subscriberLife(product startProduct: String) {
        let token = rng.uuid()
        let original = newTransactionId()
        var product = startProduct
        let yearly = product.hasSuffix("yearly")
        let period = yearly ? 12 * month : month
        var purchase = start + rng.int(0..<month)
        var expires = purchase + period
        var txnId = original
        let trial = rng.chance(0.2)
        notify(.subscribed, .initialBuy,
               txn: txn(product, id: txnId, original: original, purchase: purchase, expires: expires, signed: purchase + 1000,
                        token: token, offer: trial ? .introductoryOffer : nil),
               renewal: renewal(original, product: product, signed: purchase + 1000, token: token),
               signed: purchase + 2000, key: original)
        // StoreKit 2: the app also sends its transaction (converges with the notification).
        if rng.chance(0.3) {
            client(txn(product, id: txnId, original: original, purchase: purchase, expires: expires, signed: purchase + 500, token: token),
                   signed: purchase + 500, key: original)
        }
        var alive = true
        while alive && expires < o.end {
            let at = expires
            let roll = rng.next() % 1000
            switch roll {
            case 0..<40:  // billing problem: grace period, then recovery or expiry
                let grace = at + 16 * day
                notify(.didFailToRenew, .gracePeriod,
                       txn: txn(product, id: txnId, original: original, purchase: purchase, expires: expires, signed: at + 1000, token: token),
                       renewal: renewal(original, product: product, signed: at + 1000, grace: grace, retry: true, token: token),
                       signed: at + 2000, key: original)
                if rng.chance(0.6) {
                    txnId = newTransactionId()
                    purchase = at + rng.int(day..<10 * day)
                    expires = purchase + period
                    notify(.didRenew, .billingRecovery,
                           txn: txn(product, id: txnId, original: original, purchase: purchase, expires: expires, signed: purchase + 1000, token: token),
                           renewal: renewal(original, product: product, signed: purchase + 1000, token: token),
                           signed: purchase + 2000, key: original)
                } else {
                    notify(.gracePeriodExpired,
                           txn: txn(product, id: txnId, original: original, purchase: purchase, expires: expires, signed: grace + 1000, token: token),
                           renewal: renewal(original, product: product, signed: grace + 1000, retry: true, token: token),
                           signed: grace + 2000, key: original)
                    notify(.expired, .billingRetry,
                           txn: txn(product, id: txnId, original: original, purchase: purchase, expires: expires, signed: at + 60 * day, token: token),
                           renewal: renewal(original, product: product, autoRenew: false, signed: at + 60 * day, retry: false, intent: .billingError, token: token),
                           signed: at + 60 * day + 1000, key: original)
                    alive = false
                }
            case 40..<80:  // customer cancels, then it expires; some come back
                let cancelAt = at - rng.int(day..<10 * day)
                notify(.didChangeRenewalStatus, .autoRenewDisabled,
                       txn: txn(product, id: txnId, original: original, purchase: purchase, expires: expires, signed: cancelAt, token: token),
                       renewal: renewal(original, product: product, autoRenew: false, signed: cancelAt, token: token),
                       signed: cancelAt + 1000, key: original)
                notify(.expired, .voluntary,
                       txn: txn(product, id: txnId, original: original, purchase: purchase, expires: expires, signed: at + 1000, token: token),
                       renewal: renewal(original, product: product, autoRenew: false, signed: at + 1000, intent: .customerCancelled, token: token),
                       signed: at + 2000, key: original)
                if rng.chance(0.3) && at + 20 * day < o.end {
                    txnId = newTransactionId()
                    purchase = at + rng.int(5 * day..<20 * day)
                    expires = purchase + period
                    notify(.subscribed, .resubscribe,
                           txn: txn(product, id: txnId, original: original, purchase: purchase, expires: expires, signed: purchase + 1000, token: token),
                           renewal: renewal(original, product: product, signed: purchase + 1000, token: token),
                           signed: purchase + 2000, key: original)
                } else {
                    alive = false
                }
            case 80..<110 where product == "com.example.pro.monthly":  // upgrade to premium, immediately
                let upAt = at - rng.int(day..<20 * day)
                let newId = newTransactionId()
                product = "com.example.premium.monthly"
                notify(.didChangeRenewalPref, .upgrade,
                       txn: txn(product, id: newId, original: original, purchase: upAt, expires: upAt + month, signed: upAt + 1000, token: token),
                       renewal: renewal(original, product: product, signed: upAt + 1000, token: token),
                       signed: upAt + 2000, key: original)
                if rng.chance(0.5) {
                    // The app sends the old, now upgraded transaction too.
                    client(txn("com.example.pro.monthly", id: txnId, original: original, purchase: purchase, expires: expires, signed: upAt + 3000, token: token, upgraded: true),
                           signed: upAt + 3000, key: original)
                }
                txnId = newId
                purchase = upAt
                expires = upAt + month
            case 110..<125:  // refund of the current period; some reversed
                let refundAt = at - rng.int(day..<15 * day)
                let beforeRefund = lastNotification
                let refunded = txn(product, id: txnId, original: original, purchase: purchase, expires: expires, signed: refundAt,
                                   token: token, revocation: (refundAt, .refundFull, nil))
                notify(.refund, txn: refunded, renewal: renewal(original, product: product, autoRenew: false, signed: refundAt, token: token),
                       signed: refundAt + 1000, key: original)
                if rng.chance(0.3) {
                    let back = refundAt + rng.int(day..<5 * day)
                    notify(.refundReversed,
                           txn: txn(product, id: txnId, original: original, purchase: purchase, expires: expires, signed: back, token: token),
                           renewal: renewal(original, product: product, signed: back, token: token), signed: back + 1000, key: original)
                } else {
                    // Apple retries the notification signed before the refund; it lands after it and must not
                    // re-activate anything (the sink records it as stale).
                    if rng.chance(0.5) {
                        items.append(.init(value: Array(beforeRefund.utf8), key: original, expectation: "replay", deliverAt: refundAt + 2 * day))
                    }
                    alive = false
                }
            case 125..<140:  // downgrade scheduled, takes effect at renewal
                let at2 = at - rng.int(day..<10 * day)
                let target = product == "com.example.premium.monthly" ? "com.example.pro.monthly" : product
                notify(.didChangeRenewalPref, .downgrade,
                       txn: txn(product, id: txnId, original: original, purchase: purchase, expires: expires, signed: at2, token: token),
                       renewal: renewal(original, product: product, signed: at2, autoRenewProduct: target, token: token),
                       signed: at2 + 1000, key: original)
                product = target
                fallthrough
            default:  // ordinary renewal
                txnId = newTransactionId()
                purchase = at
                expires = at + period
                let renewalTxn = txn(product, id: txnId, original: original, purchase: purchase, expires: expires, signed: at + 1000, token: token)
                notify(.didRenew, txn: renewalTxn, renewal: renewal(original, product: product, signed: at + 1000, token: token),
                       signed: at + 2000, key: original)
                if rng.chance(0.05) {
                    notify(.priceIncrease, .accepted, txn: renewalTxn,
                           renewal: renewal(original, product: product, signed: at + 5 * day, token: token), signed: at + 5 * day, key: original)
                }
            }
        }
        // Family sharing: a family member's own FAMILY_SHARED transaction, revoked when they leave the family.
        if rng.chance(0.05) {
            let memberOriginal = newTransactionId()
            let at = start + rng.int(month..<Int64(max(2, o.months)) * month)
            guard at < o.end else { return }
            let shared = txn(product, id: memberOriginal, original: memberOriginal, purchase: at - month, expires: at + month,
                             signed: at, token: nil, ownership: .familyShared, revocation: (at, .familyRevoke, nil))
            notify(.revoke, txn: shared, renewal: renewal(memberOriginal, product: product, signed: at, token: nil),
                   signed: at + 1000, key: memberOriginal)
        }
    }

    /// The seeds' consumable flow: the app sends each ticket purchase; some are sent again (replays); a few refunds.
    mutating func ticketBuyer() {
        let token = rng.uuid()
        let purchases = 1 + Int(rng.next() % 4)
        for _ in 0..<purchases {
            let id = newTransactionId()
            let pack = rng.chance(0.7) ? "com.example.tickets.10" : "com.example.tickets.50"
            let at = start + rng.int(0..<Int64(o.months) * month)
            let payload = txn(pack, id: id, original: id, purchase: at, expires: nil, signed: at + 300, type: .consumable, token: token)
            if rng.chance(0.25), let receipt = legacyReceipt(pack, id: id, at: at) {
                // An older app version sends its app receipt (the verifyReceipt flow of the seeds) instead of the JWS.
                items.append(.init(value: receipt, key: id, expectation: "valid", deliverAt: at + 300))
                if rng.chance(0.3) {
                    items.append(.init(value: receipt, key: id, expectation: "replay", deliverAt: at + 60_300))
                }
            } else {
                client(payload, signed: at + 300, key: id, replays: rng.chance(0.15) ? 1 + Int(rng.next() % 3) : 0)
            }
            if rng.chance(0.5) {
                notify(.oneTimeCharge, txn: payload, renewal: nil, signed: at + 1000, key: id)
            }
            if rng.chance(0.06) && at + 5 * day < o.end {
                notify(.consumptionRequest, txn: payload, renewal: nil, signed: at + 2 * day, key: id)
                let refunded = txn(pack, id: id, original: id, purchase: at, expires: nil, signed: at + 4 * day, type: .consumable,
                                   token: token, revocation: (at + 4 * day, .refundFull, nil))
                notify(.refund, txn: refunded, renewal: nil, signed: at + 4 * day + 1000, key: id)
            }
        }
    }

    /// A ticket pack bought a few hours ago whose buyer has just asked Apple for a refund: the CONSUMPTION_REQUEST
    /// arrives inside Apple's 12-hour answer window, so `fleet responder` answers it (the ticket buyers' older requests
    /// above are past it and expire unanswered, as they would after an outage that long).
    mutating func recentRefundRequest() {
        let token = rng.uuid()
        let id = newTransactionId()
        let at = o.end - rng.int(2 * hour..<8 * hour)
        let payload = txn("com.example.tickets.10", id: id, original: id, purchase: at, expires: nil, signed: at + 300,
                          type: .consumable, token: token)
        let first = items.count
        client(payload, signed: at + 300, key: id)
        notify(.consumptionRequest, txn: payload, renewal: nil, signed: at + rng.int(30 * minute..<90 * minute), key: id)
        guard o.spreadRecentRequests else { return }
        // Delivered together, in their own order, somewhere in the timeline (1 ms apart, so the sort keeps them so).
        // Drawn from its own sequence: the inputs themselves are the same with and without the option.
        let point = start + spreadRng.int(0..<Int64(o.months) * month)
        for i in first..<items.count { items[i].deliverAt = point + Int64(i - first) }
    }

    /// A one-entry consumable app receipt for a purchase, in Apple's verifyReceipt request body.
    func legacyReceipt(_ product: String, id: String, at: Int64) -> [UInt8]? {
        guard let receiptPKI else { return nil }
        let production = o.environment == .production
        let receipt = TestReceipt(
            receiptType: production ? "Production" : "ProductionSandbox", appAppleId: production ? o.appAppleId : 0,
            bundleId: o.bundleId, applicationVersion: "1.9", creationDate: at + 300,
            inApp: [TestReceipt.InApp(productId: product, transactionId: id, purchaseDate: at, productType: 1)])
        guard let b64 = try? receiptPKI.signBase64(receipt) else { return nil }
        return Array(JSONValue.object(["receipt-data": .string(b64), "password": "demo-shared-secret"]).serialized().utf8)
    }

    mutating func lifetimeBuyer() {
        let id = newTransactionId()
        let at = start + rng.int(0..<Int64(o.months) * month)
        let payload = txn("com.example.lifetime", id: id, original: id, purchase: at, expires: nil, signed: at + 300,
                          type: .nonConsumable, token: rng.uuid())
        notify(.oneTimeCharge, txn: payload, renewal: nil, signed: at + 1000, key: id)
    }

    /// A share of inputs that must all be rejected, each for its own reason.
    mutating func badInputs() {
        let valid = items.filter { $0.expectation == "valid" }
        let count = max(6, Int(Double(valid.count) * o.badShare))
        for i in 0..<count {
            let at = start + rng.int(0..<Int64(o.months) * month)
            let sample = txn("com.example.pro.monthly", id: newTransactionId(), original: newTransactionId(), purchase: at,
                             expires: at + month, signed: at, token: nil)
            switch i % 6 {
            case 0:  // Apple's names, another key: a forged chain
                items.append(.init(value: Array(forged.sign(sample).utf8), key: nil, expectation: "UNTRUSTED_CHAIN", deliverAt: at))
            case 1:  // a valid JWS whose payload was edited afterwards (more tickets, longer access): signature mismatch
                let jws = pki.sign(sample)
                let parts = jws.split(separator: ".").map(String.init)
                var edited = sample.objectValue ?? [:]
                edited["expiresDate"] = .integer(at + 120 * month)
                let forgedPayload = Base64.encodeURL(JSONValue.object(edited).serializedBytes())
                let tampered = parts[0] + "." + forgedPayload + "." + parts[2]
                items.append(.init(value: Array(tampered.utf8), key: nil, expectation: "INVALID_SIGNATURE", deliverAt: at))
            case 2:  // another app's purchase, properly signed
                let other = TestPayloads.transaction(productId: "com.other.coins", transactionId: newTransactionId(), purchaseDate: at,
                                                     type: .consumable, environment: o.environment, bundleId: "com.other.app", signedDate: at)
                items.append(.init(value: Array(pki.sign(other).utf8), key: nil, expectation: "WRONG_BUNDLE_ID", deliverAt: at))
            case 3:
                items.append(.init(value: Array("this is not a JWS at all".utf8), key: nil, expectation: "MALFORMED_JWS", deliverAt: at))
            case 4:  // a garbage "receipt" in the legacy verifyReceipt flow of the seeds
                let receipt = "MIIT" + Base64.encodeStandard((0..<600).map { _ in UInt8(truncatingIfNeeded: rng.next()) })
                items.append(.init(value: Array(receipt.utf8), key: nil, expectation: "MALFORMED_RECEIPT", deliverAt: at))
            default:  // alg none
                let none = pki.signer.sign(sample, header: .init(alg: "none"))
                items.append(.init(value: Array(none.utf8), key: nil, expectation: "UNSUPPORTED_ALGORITHM", deliverAt: at))
            }
        }
    }
}
