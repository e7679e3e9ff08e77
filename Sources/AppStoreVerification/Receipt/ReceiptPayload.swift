import SwiftASN1

/// One in-app purchase entry of an app receipt (field 17), names as in Apple's JWS transactions.
public struct AppReceiptInApp: Sendable, Hashable {
    public var transactionId: String?
    public var originalTransactionId: String?
    public var productId: String?
    public var quantity: Int64?
    public var purchaseDate: Int64?
    public var originalPurchaseDate: Int64?
    public var expiresDate: Int64?
    public var cancellationDate: Int64?
    public var webOrderLineItemId: Int64?
    /// Field 1707: 0 non-consumable, 1 consumable, 2 non-renewing, 3 auto-renewable (absent in older receipts).
    public var productType: Int64?
    public var isTrialPeriod: Bool?
    public var isInIntroOfferPeriod: Bool?
    public var promotionalOfferId: String?

    public init() {}

    public var json: JSONValue {
        var o: [String: JSONValue] = [:]
        func put(_ k: String, _ v: String?) { if let v { o[k] = .string(v) } }
        func put(_ k: String, _ v: Int64?) { if let v { o[k] = .integer(v) } }
        func put(_ k: String, _ v: Bool?) { if let v { o[k] = .bool(v) } }
        put("transactionId", transactionId)
        put("originalTransactionId", originalTransactionId)
        put("productId", productId)
        put("quantity", quantity)
        put("purchaseDate", purchaseDate)
        put("originalPurchaseDate", originalPurchaseDate)
        put("expiresDate", expiresDate)
        put("cancellationDate", cancellationDate)
        put("webOrderLineItemId", webOrderLineItemId)
        put("productType", productType)
        put("isTrialPeriod", isTrialPeriod)
        put("isInIntroOfferPeriod", isInIntroOfferPeriod)
        put("promotionalOfferId", promotionalOfferId)
        return .object(o)
    }
}

/// The decoded app receipt payload: the signed content of a PKCS#7 app receipt, a DER `SET OF ReceiptAttribute`
/// (`SEQUENCE { type INTEGER, version INTEGER, value OCTET STRING }`). Dates are ms since the epoch.
public struct AppReceipt: Sendable, Hashable {
    /// Field 0 as Apple spells it (`Production`, `ProductionSandbox`, `Xcode`).
    public var receiptType: String?
    /// Field 1 (app item id; 0 outside Production).
    public var appAppleId: Int64?
    public var bundleId: String?
    public var applicationVersion: String?
    public var originalApplicationVersion: String?
    public var receiptCreationDate: Int64?
    public var receiptExpirationDate: Int64?
    public var inApp: [AppReceiptInApp] = []

    public static let maxAttributes = 100_000
    public static let maxInAppEntries = 20_000

    public init() {}

    /// `Production`, `Sandbox` (for `ProductionSandbox`), `Xcode`, or the raw value.
    public var environment: Environment {
        switch receiptType {
        case "Production": return .production
        case "ProductionSandbox", "Sandbox": return .sandbox
        case "Xcode": return .xcode
        default: return Environment(receiptType ?? "")
        }
    }

    /// The `fleet verify` payload: field names as in Apple's JWS where the meaning is the same; absent fields omitted.
    public var json: JSONValue {
        var o: [String: JSONValue] = [:]
        if let bundleId { o["bundleId"] = .string(bundleId) }
        o["environment"] = .string(environment.rawValue)
        if let appAppleId { o["appAppleId"] = .integer(appAppleId) }
        if let applicationVersion { o["applicationVersion"] = .string(applicationVersion) }
        if let originalApplicationVersion { o["originalApplicationVersion"] = .string(originalApplicationVersion) }
        if let receiptCreationDate { o["receiptCreationDate"] = .integer(receiptCreationDate) }
        if let receiptExpirationDate { o["receiptExpirationDate"] = .integer(receiptExpirationDate) }
        o["inApp"] = .array(inApp.map(\.json))
        return .object(o)
    }

    static func fail(_ detail: String) -> VerificationError { VerificationError(.malformedReceipt, detail) }

    /// The attribute count of one receipt parse (bounded by `maxAttributes` over the receipt and its entries).
    final class Budget {
        var n = 0
    }

    /// Parses the receipt content (strict DER). Unknown attribute types are ignored, as Apple documents.
    public init(content: [UInt8]) throws(VerificationError) {
        let count = Budget()
        try Self.attributes(content, "receipt payload", count: count) { (type, value) throws(VerificationError) in
            switch type {
            case 0: self.receiptType = try Self.string(value, "field 0 (receipt type)")
            case 1: self.appAppleId = try Self.integer(value, "field 1 (app item id)")
            case 2: self.bundleId = try Self.string(value, "field 2 (bundle id)")
            case 3: self.applicationVersion = try Self.string(value, "field 3 (application version)")
            case 12: self.receiptCreationDate = try Self.date(value, "field 12 (receipt creation date)")
            case 19: self.originalApplicationVersion = try Self.string(value, "field 19 (original application version)")
            case 21: self.receiptExpirationDate = try Self.date(value, "field 21 (receipt expiration date)")
            case 17:
                if self.inApp.count >= Self.maxInAppEntries {
                    throw Self.fail("more than \(Self.maxInAppEntries) in-app entries")
                }
                self.inApp.append(try Self.inAppEntry(value, index: self.inApp.count, count: count))
            default: break
            }
        }
    }

    static func inAppEntry(_ bytes: [UInt8], index: Int, count: Budget) throws(VerificationError) -> AppReceiptInApp {
        var e = AppReceiptInApp()
        try attributes(bytes, "in_app[\(index)]", count: count) { (type, v) throws(VerificationError) in
            switch type {
            case 1701: e.quantity = try integer(v, "in_app[\(index)] field 1701 (quantity)")
            case 1702: e.productId = try string(v, "in_app[\(index)] field 1702 (product id)")
            case 1703: e.transactionId = try string(v, "in_app[\(index)] field 1703 (transaction id)")
            case 1704: e.purchaseDate = try date(v, "in_app[\(index)] field 1704 (purchase date)")
            case 1705: e.originalTransactionId = try string(v, "in_app[\(index)] field 1705 (original transaction id)")
            case 1706: e.originalPurchaseDate = try date(v, "in_app[\(index)] field 1706 (original purchase date)")
            case 1707: e.productType = try integer(v, "in_app[\(index)] field 1707 (product type)")
            case 1708: e.expiresDate = try date(v, "in_app[\(index)] field 1708 (expires date)")
            case 1711: e.webOrderLineItemId = try integer(v, "in_app[\(index)] field 1711 (web order line item id)")
            case 1712: e.cancellationDate = try date(v, "in_app[\(index)] field 1712 (cancellation date)")
            case 1713: e.isTrialPeriod = try integer(v, "in_app[\(index)] field 1713 (is trial period)").map { $0 != 0 }
            case 1719: e.isInIntroOfferPeriod = try integer(v, "in_app[\(index)] field 1719 (intro offer period)").map { $0 != 0 }
            case 1721: e.promotionalOfferId = try string(v, "in_app[\(index)] field 1721 (promotional offer id)")
            default: break
            }
        }
        return e
    }

    /// Walks a DER `SET OF SEQUENCE { type INTEGER, version INTEGER, value OCTET STRING }`.
    static func attributes(
        _ bytes: [UInt8], _ what: @autoclosure () -> String, count: Budget,
        _ body: (Int, [UInt8]) throws(VerificationError) -> Void
    ) throws(VerificationError) {
        let root: ASN1Node
        do { root = try DER.parse(bytes) } catch { throw fail("\(what()) is not strict DER ASN.1: \(error)") }
        guard root.identifier == .set, case .constructed(let items) = root.content else {
            throw fail("\(what()) is not an ASN.1 SET of attributes")
        }
        for item in items {
            count.n += 1
            if count.n > maxAttributes { throw fail("more than \(maxAttributes) receipt attributes") }
            guard item.identifier == .sequence, case .constructed(let fields) = item.content else {
                throw fail("\(what()): an attribute is not a SEQUENCE")
            }
            var it = fields.makeIterator()
            let type: Int
            do {
                guard let t = it.next() else { throw fail("\(what()): an attribute has no type") }
                type = try Int(derEncoded: t)
                guard let ver = it.next() else { throw fail("\(what()): attribute \(type) has no version") }
                _ = try Int(derEncoded: ver)
            } catch let e as VerificationError {
                throw e
            } catch {
                throw fail("\(what()): an attribute's type or version is not an INTEGER")
            }
            guard let value = it.next(), value.identifier == .octetString, case .primitive(let v) = value.content else {
                throw fail("\(what()): attribute \(type) has no OCTET STRING value")
            }
            if it.next() != nil { throw fail("\(what()): attribute \(type) has trailing elements") }
            try body(type, Array(v))
        }
    }

    static func node(_ bytes: [UInt8], _ what: @autoclosure () -> String) throws(VerificationError) -> ASN1Node {
        do { return try DER.parse(bytes) } catch { throw fail("\(what()) is not strict DER ASN.1: \(error)") }
    }

    /// A UTF8String / IA5String / PrintableString value.
    static func string(_ bytes: [UInt8], _ what: @autoclosure () -> String) throws(VerificationError) -> String {
        let n = try node(bytes, what())
        guard n.identifier == .utf8String || n.identifier == .ia5String || n.identifier == .printableString,
            case .primitive(let p) = n.content
        else { throw fail("\(what()) is not a string (tag \(n.identifier))") }
        guard let s = String(validating: p, as: UTF8.self) else { throw fail("\(what()) is not valid UTF-8") }
        return s
    }

    static func integer(_ bytes: [UInt8], _ what: @autoclosure () -> String) throws(VerificationError) -> Int64? {
        let n = try node(bytes, what())
        do { return try Int64(derEncoded: n) } catch { throw fail("\(what()) is not a 64-bit INTEGER") }
    }

    /// An IA5String RFC 3339 date; empty = absent.
    static func date(_ bytes: [UInt8], _ what: @autoclosure () -> String) throws(VerificationError) -> Int64? {
        let s = try string(bytes, what())
        if s.isEmpty { return nil }
        guard let ms = ReceiptDate.parse(s) else { throw fail("\(what()) is not an RFC 3339 date: \(s)") }
        return ms
    }
}

/// RFC 3339 dates as receipts write them: `2015-08-13T07:50:46Z`, optional fraction, `Z` or `±hh:mm` / `±hhmm`.
enum ReceiptDate {
    static func parse(_ s: String) -> Int64? {
        let b = Array(s.utf8)
        func num(_ i: Int, _ n: Int) -> Int? {
            guard i + n <= b.count else { return nil }
            var v = 0
            for k in i..<(i + n) {
                guard b[k] >= 48, b[k] <= 57 else { return nil }
                v = v * 10 + Int(b[k] - 48)
            }
            return v
        }
        guard b.count >= 20, b[4] == 45, b[7] == 45, b[10] == 84 || b[10] == 116, b[13] == 58, b[16] == 58,
            let y = num(0, 4), let mo = num(5, 2), let d = num(8, 2), let h = num(11, 2), let mi = num(14, 2),
            let se = num(17, 2), (1...12).contains(mo), (1...31).contains(d), h < 24, mi < 60, se < 61
        else { return nil }
        var i = 19
        var millis = 0
        if i < b.count && b[i] == 46 {
            i += 1
            var digits = 0
            while i < b.count, b[i] >= 48, b[i] <= 57 {
                if digits < 3 { millis = millis * 10 + Int(b[i] - 48) }
                digits += 1
                i += 1
            }
            if digits == 0 { return nil }
            if digits < 3 { for _ in digits..<3 { millis *= 10 } }
        }
        var offset = 0
        guard i < b.count else { return nil }
        if b[i] == 90 || b[i] == 122 {
            i += 1
        } else if b[i] == 43 || b[i] == 45 {
            let sign = b[i] == 43 ? 1 : -1
            guard let oh = num(i + 1, 2) else { return nil }
            var j = i + 3
            if j < b.count && b[j] == 58 { j += 1 }
            guard let om = num(j, 2), oh < 24, om < 60 else { return nil }
            offset = sign * (oh * 3600 + om * 60)
            i = j + 2
        } else {
            return nil
        }
        guard i == b.count else { return nil }
        // Days from civil (Howard Hinnant's algorithm).
        let yy = mo <= 2 ? y - 1 : y
        let era = (yy >= 0 ? yy : yy - 399) / 400
        let yoe = yy - era * 400
        let mp = (mo + 9) % 12
        let doy = (153 * mp + 2) / 5 + d - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        let days = era * 146097 + doe - 719468
        let secs = Int64(days) * 86400 + Int64(h * 3600 + mi * 60 + se) - Int64(offset)
        return secs * 1000 + Int64(millis)
    }
}
