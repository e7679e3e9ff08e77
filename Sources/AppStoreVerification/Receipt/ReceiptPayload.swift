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

    /// Field 1707 as Apple's JWS transaction `type`; nil when absent or not one of the four.
    public var type: ProductType? {
        switch productType {
        case 0: return .nonConsumable
        case 1: return .consumable
        case 2: return .nonRenewing
        case 3: return .autoRenewable
        default: return nil
        }
    }

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
    /// nil for an app receipt; `transactionReceipt` for a StoreKit 1 transaction receipt (one entry).
    public var form: String?

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
        if let form { o["form"] = .string(form) }
        return .object(o)
    }

    static func fail(_ detail: String) -> VerificationError { VerificationError(.malformedReceipt, detail) }

    typealias Bytes = UnsafeBufferPointer<UInt8>

    /// Parses the receipt content (strict DER). Unknown attribute types are ignored, as Apple documents.
    public init(content: [UInt8]) throws(VerificationError) { try self.init(content: content[...]) }

    /// Parses the receipt content (strict DER) in place: a walk over the attribute SET and its in-app entries
    /// (`StrictDER`), no node tree, no copies, dates parsed from the bytes. Unknown attribute types are ignored, as
    /// Apple documents; at most `maxAttributes` attributes over the receipt and its entries.
    public init(content: ArraySlice<UInt8>) throws(VerificationError) {
        self.init()
        var receipt = self
        try content.withUnsafeBufferPointer { (b) throws(VerificationError) in
            var count = 0
            try Self.attributes(b, 0..<b.count, "receipt payload", count: &count) { (type, v, count) throws(VerificationError) in
                switch type {
                case 0: receipt.receiptType = try Self.string(b, v, "field 0 (receipt type)")
                case 1: receipt.appAppleId = try Self.integer(b, v, "field 1 (app item id)")
                case 2: receipt.bundleId = try Self.string(b, v, "field 2 (bundle id)")
                case 3: receipt.applicationVersion = try Self.string(b, v, "field 3 (application version)")
                case 12: receipt.receiptCreationDate = try Self.date(b, v, "field 12 (receipt creation date)")
                case 19: receipt.originalApplicationVersion = try Self.string(b, v, "field 19 (original application version)")
                case 21: receipt.receiptExpirationDate = try Self.date(b, v, "field 21 (receipt expiration date)")
                case 17:
                    if receipt.inApp.isEmpty { receipt.inApp.reserveCapacity(8) }
                    if receipt.inApp.count >= Self.maxInAppEntries {
                        throw Self.fail("more than \(Self.maxInAppEntries) in-app entries")
                    }
                    receipt.inApp.append(try Self.inAppEntry(b, v, index: receipt.inApp.count, count: &count))
                default: break
                }
            }
        }
        self = receipt
    }

    static func inAppEntry(_ b: Bytes, _ r: Range<Int>, index: Int, count: inout Int) throws(VerificationError) -> AppReceiptInApp {
        var e = AppReceiptInApp()
        try attributes(b, r, "in_app[\(index)]", count: &count) { (type, v, _) throws(VerificationError) in
            switch type {
            case 1701: e.quantity = try integer(b, v, "in_app[\(index)] field 1701 (quantity)")
            case 1702: e.productId = try string(b, v, "in_app[\(index)] field 1702 (product id)")
            case 1703: e.transactionId = try string(b, v, "in_app[\(index)] field 1703 (transaction id)")
            case 1704: e.purchaseDate = try date(b, v, "in_app[\(index)] field 1704 (purchase date)")
            case 1705: e.originalTransactionId = try string(b, v, "in_app[\(index)] field 1705 (original transaction id)")
            case 1706: e.originalPurchaseDate = try date(b, v, "in_app[\(index)] field 1706 (original purchase date)")
            case 1707: e.productType = try integer(b, v, "in_app[\(index)] field 1707 (product type)")
            case 1708: e.expiresDate = try date(b, v, "in_app[\(index)] field 1708 (expires date)")
            case 1711: e.webOrderLineItemId = try integer(b, v, "in_app[\(index)] field 1711 (web order line item id)")
            case 1712: e.cancellationDate = try date(b, v, "in_app[\(index)] field 1712 (cancellation date)")
            case 1713: e.isTrialPeriod = try integer(b, v, "in_app[\(index)] field 1713 (is trial period)").map { $0 != 0 }
            case 1719: e.isInIntroOfferPeriod = try integer(b, v, "in_app[\(index)] field 1719 (intro offer period)").map { $0 != 0 }
            case 1721: e.promotionalOfferId = try string(b, v, "in_app[\(index)] field 1721 (promotional offer id)")
            default: break
            }
        }
        return e
    }

    /// The one element making up `r` (a value must be exactly one DER element), as a root.
    static func node(_ b: Bytes, _ r: Range<Int>, _ what: @autoclosure () -> String) throws(VerificationError) -> StrictDER.Element {
        do { return try StrictDER.root(b, r) } catch { throw fail("\(what()) is not strict DER ASN.1: \(error)") }
    }

    /// Walks a DER `SET OF SEQUENCE { type INTEGER, version INTEGER, value OCTET STRING }` making up `r`; `body` gets
    /// each attribute's type, the range of its value's content, and the attribute count (for nested SETs).
    static func attributes(
        _ b: Bytes, _ r: Range<Int>, _ what: @autoclosure () -> String, count: inout Int,
        _ body: (Int, Range<Int>, inout Int) throws(VerificationError) -> Void
    ) throws(VerificationError) {
        let root = try node(b, r, what())
        guard root.tag == .set, root.isConstructed else { throw fail("\(what()) is not an ASN.1 SET of attributes") }
        var items = StrictDER.children(root, in: b)
        while true {
            let item: StrictDER.Element?
            do { item = try items.next() } catch { throw fail("\(what()) is not strict DER ASN.1: \(error)") }
            guard let item else { break }
            count += 1
            if count > maxAttributes { throw fail("more than \(maxAttributes) receipt attributes") }
            guard item.tag == .sequence, item.isConstructed else { throw fail("\(what()): an attribute is not a SEQUENCE") }
            if let (type, value) = shortAttribute(b, item.content) {
                try body(type, value, &count)
                continue
            }
            var fields = StrictDER.children(item, in: b)
            func field() throws(VerificationError) -> StrictDER.Element? {
                do { return try fields.next() } catch { throw fail("\(what()) is not strict DER ASN.1: \(error)") }
            }
            guard let t = try field() else { throw fail("\(what()): an attribute has no type") }
            guard t.tag == .integer, !t.isConstructed, let type = StrictDER.int64(b, t.content) else {
                throw fail("\(what()): an attribute's type is not an INTEGER")
            }
            guard let ver = try field() else { throw fail("\(what()): attribute \(type) has no version") }
            guard ver.tag == .integer, !ver.isConstructed, StrictDER.int64(b, ver.content) != nil else {
                throw fail("\(what()): attribute \(type)'s version is not an INTEGER")
            }
            guard let value = try field(), value.tag == .octetString, !value.isConstructed else {
                throw fail("\(what()): attribute \(type) has no OCTET STRING value")
            }
            if try field() != nil { throw fail("\(what()): attribute \(type) has trailing elements") }
            try body(Int(type), value.content, &count)
        }
    }

    /// The attribute SEQUENCE's content `r` read directly when it has the shape of every real receipt attribute:
    /// `INTEGER` type of one or two octets (minimal), `INTEGER` version of one octet, `OCTET STRING` value with a
    /// length of at most two octets (minimal), ending exactly at `r`'s end. Anything else is nil and takes the
    /// element-by-element walk, which reports what is wrong; for what it accepts, both give the same result.
    @inline(__always)
    static func shortAttribute(_ b: Bytes, _ r: Range<Int>) -> (Int, Range<Int>)? {
        var i = r.lowerBound
        let end = r.upperBound
        // type: 02 01 t | 02 02 t0 t1
        guard end - i >= 8, b[i] == 0x02 else { return nil }
        let typeLength = Int(b[i + 1])
        let type: Int
        if typeLength == 1 {
            type = Int(Int8(bitPattern: b[i + 2]))
        } else if typeLength == 2 {
            let t0 = b[i + 2], t1 = b[i + 3]
            if (t0 == 0 && t1 & 0x80 == 0) || (t0 == 0xFF && t1 & 0x80 != 0) { return nil }
            type = Int(Int16(bitPattern: UInt16(t0) << 8 | UInt16(t1)))
        } else {
            return nil
        }
        i += 2 + typeLength
        // version: 02 01 v; then 04 and the value's length
        guard end - i >= 5, b[i] == 0x02, b[i + 1] == 0x01, b[i + 3] == 0x04 else { return nil }
        i += 4
        let l0 = Int(b[i])
        let length: Int
        if l0 < 0x80 {
            length = l0
            i += 1
        } else if l0 == 0x81 {
            guard end - i >= 2 else { return nil }
            length = Int(b[i + 1])
            guard length >= 0x80 else { return nil }
            i += 2
        } else if l0 == 0x82 {
            guard end - i >= 3 else { return nil }
            length = Int(b[i + 1]) << 8 | Int(b[i + 2])
            guard length >= 0x100 else { return nil }
            i += 3
        } else {
            return nil
        }
        guard end - i == length else { return nil }
        return (type, i..<end)
    }

    /// The content of the value `r` when it is one primitive element (a UTF8String / IA5String / PrintableString when
    /// `string`, else an INTEGER) with a short-form length, the usual value; nil otherwise (the caller walks it strictly).
    @inline(__always)
    static func shortValue(_ b: Bytes, _ r: Range<Int>, string: Bool) -> Range<Int>? {
        let i = r.lowerBound
        guard r.upperBound - i >= 2 else { return nil }
        let t = b[i]
        if string {
            guard t == 0x0C || t == 0x16 || t == 0x13 else { return nil }
        } else {
            guard t == 0x02 else { return nil }
        }
        let length = Int(b[i + 1])
        guard length < 0x80, r.upperBound - i - 2 == length else { return nil }
        return (i + 2)..<r.upperBound
    }

    /// A UTF8String / IA5String / PrintableString value.
    static func string(_ b: Bytes, _ r: Range<Int>, _ what: @autoclosure () -> String) throws(VerificationError) -> String {
        let text = UnsafeBufferPointer(rebasing: b[try stringContent(b, r, what())])
        // ASCII (every real receipt string) is valid UTF-8 as it is: no generic validation (which looks type metadata
        // up at run time) on the hot path.
        if isASCII(text) { return String(decoding: text, as: UTF8.self) }
        guard let s = String(validating: text, as: UTF8.self) else {
            throw fail("\(what()) is not valid UTF-8")
        }
        return s
    }

    @inline(__always) static func isASCII(_ text: Bytes) -> Bool {
        var high: UInt8 = 0
        for c in text { high |= c }
        return high & 0x80 == 0
    }

    /// The content of a UTF8String / IA5String / PrintableString value.
    @inline(__always)
    static func stringContent(_ b: Bytes, _ r: Range<Int>, _ what: @autoclosure () -> String) throws(VerificationError) -> Range<Int> {
        if let c = shortValue(b, r, string: true) { return c }
        let n = try node(b, r, what())
        guard n.tag == .utf8String || n.tag == .ia5String || n.tag == .printableString, !n.isConstructed else {
            throw fail("\(what()) is not a string (tag \(n.tag))")
        }
        return n.content
    }

    static func integer(_ b: Bytes, _ r: Range<Int>, _ what: @autoclosure () -> String) throws(VerificationError) -> Int64? {
        if let c = shortValue(b, r, string: false), let v = StrictDER.int64(b, c) { return v }
        let n = try node(b, r, what())
        guard n.tag == .integer, !n.isConstructed, let v = StrictDER.int64(b, n.content) else {
            throw fail("\(what()) is not a 64-bit INTEGER")
        }
        return v
    }

    /// An IA5String (or UTF8String) RFC 3339 date; empty = absent.
    static func date(_ b: Bytes, _ r: Range<Int>, _ what: @autoclosure () -> String) throws(VerificationError) -> Int64? {
        let text = UnsafeBufferPointer(rebasing: b[try stringContent(b, r, what())])
        if text.isEmpty { return nil }
        guard let ms = ReceiptDate.parse(text) else {
            throw fail("\(what()) is not an RFC 3339 date: \(String(decoding: text, as: UTF8.self))")
        }
        return ms
    }
}

/// RFC 3339 dates as receipts write them: `2015-08-13T07:50:46Z`, optional fraction, `Z` or `±hh:mm` / `±hhmm`.
enum ReceiptDate {
    static func parse(_ s: String) -> Int64? {
        var s = s
        return s.withUTF8 { parse($0) }
    }

    /// The same from the bytes (ASCII; anything else fails).
    static func parse(_ b: UnsafeBufferPointer<UInt8>) -> Int64? {
        func num(_ i: Int, _ n: Int) -> Int? {
            guard i + n <= b.count else { return nil }
            var v = 0
            for k in i..<(i + n) {
                guard b[k] >= 48, b[k] <= 57 else { return nil }
                v = v * 10 + Int(b[k] - 48)
            }
            return v
        }
        guard b.count >= 20, b[4] == 45, b[7] == 45, b[10] == 84 || b[10] == 116, b[13] == 58, b[16] == 58 else {
            return nil
        }
        // The 14 fixed digits at once: each byte minus '0' must be 0...9 (a wrapped difference is > 9 too).
        var bad: UInt8 = 0
        @inline(__always) func digit(_ k: Int) -> Int {
            let v = b[k] &- 48
            bad |= v > 9 ? 1 : 0
            return Int(v)
        }
        let y = digit(0) * 1000 + digit(1) * 100 + digit(2) * 10 + digit(3)
        let mo = digit(5) * 10 + digit(6), d = digit(8) * 10 + digit(9)
        let h = digit(11) * 10 + digit(12), mi = digit(14) * 10 + digit(15), se = digit(17) * 10 + digit(18)
        guard bad == 0, mo >= 1, mo <= 12, d >= 1, d <= 31, h < 24, mi < 60, se < 61 else { return nil }
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
        return epochMillis(year: y, month: mo, day: d, hour: h, minute: mi, second: se) - Int64(offset) * 1000
            + Int64(millis)
    }

    /// Milliseconds since the epoch of a UTC civil time (days from civil: Howard Hinnant's algorithm).
    static func epochMillis(year y: Int, month mo: Int, day d: Int, hour h: Int, minute mi: Int, second se: Int) -> Int64 {
        let yy = mo <= 2 ? y - 1 : y
        let era = (yy >= 0 ? yy : yy - 399) / 400
        let yoe = yy - era * 400
        let mp = (mo + 9) % 12
        let doy = (153 * mp + 2) / 5 + d - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        let days = era * 146097 + doe - 719468
        let secs = Int64(days) * 86400 + Int64(h * 3600 + mi * 60 + se)
        return secs * 1000
    }
}
