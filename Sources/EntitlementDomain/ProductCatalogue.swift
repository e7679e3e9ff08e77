import AppStoreVerification
import Foundation
import Yams

/// What the business sells, keyed by App Store productId: the App Store only knows ids and prices, so the units a
/// consumable grants, the duration of a non-renewing pass and the entitlement a product unlocks live here.
public struct ProductCatalogue: Sendable, Equatable {
    public enum ProductKind: String, Sendable, Codable, CaseIterable {
        case autoRenewable = "auto-renewable"
        case nonRenewing = "non-renewing"
        case nonConsumable = "non-consumable"
        case consumable = "consumable"

        /// Apple's transaction `type` for this kind.
        public var productType: ProductType {
            switch self {
            case .autoRenewable: return .autoRenewable
            case .nonRenewing: return .nonRenewing
            case .nonConsumable: return .nonConsumable
            case .consumable: return .consumable
            }
        }

        /// The kind of Apple's transaction `type`; nil for a type Apple may add later.
        public init?(productType: ProductType) {
            guard let kind = Self.allCases.first(where: { $0.productType == productType }) else { return nil }
            self = kind
        }
    }

    public struct Product: Sendable, Equatable {
        public var productId: String
        public var kind: ProductKind
        /// Units per purchased item (consumables; default 1).
        public var units: Int
        /// Access length of a non-renewing subscription.
        public var duration: ISODuration?
        /// The entitlement this product unlocks (default: the productId).
        public var entitlement: String

        public init(productId: String, kind: ProductKind, units: Int = 1, duration: ISODuration? = nil, entitlement: String? = nil) {
            self.productId = productId
            self.kind = kind
            self.units = units
            self.duration = duration
            self.entitlement = entitlement ?? productId
        }
    }

    public enum LoadError: Error, CustomStringConvertible, Sendable {
        case unreadable(path: String, reason: String)
        case invalid(path: String, reason: String)

        public var description: String {
            switch self {
            case .unreadable(let path, let reason): return "cannot read product catalogue \(path): \(reason)"
            case .invalid(let path, let reason): return "invalid product catalogue \(path): \(reason)"
            }
        }
    }

    public private(set) var products: [String: Product]

    public init(products: [Product] = []) {
        var map: [String: Product] = [:]
        for p in products { map[p.productId] = p }
        self.products = map
    }

    public subscript(productId: String) -> Product? { products[productId] }

    public var isEmpty: Bool { products.isEmpty }

    /// The largest catalogue parsed (larger ones are refused unread).
    public static let maxBytes = 1024 * 1024

    /// Loads YAML or JSON (JSON is YAML). Accepted layouts:
    /// `products: { <productId>: { type, units, duration, entitlement } }` or
    /// `products: [ { productId, type, units, duration, entitlement } ]`.
    public static func load(path: String) throws(LoadError) -> ProductCatalogue {
        let size = (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)?.intValue ?? 0
        if size > maxBytes { throw .invalid(path: path, reason: "the file is \(size) bytes; the limit is \(maxBytes) bytes") }
        let text: String
        do { text = try String(contentsOfFile: path, encoding: .utf8) } catch {
            throw .unreadable(path: path, reason: "\(error.localizedDescription)")
        }
        do { return try parse(text) } catch let error as LoadError {
            if case .invalid(_, let reason) = error { throw .invalid(path: path, reason: reason) }
            throw error
        } catch { throw .invalid(path: path, reason: "\(error)") }
    }

    /// Yams builds a mapping with a force-unwrapped string key, so a key that is itself a map or a list
    /// (`? {a: 1}: x`) crashed the process that loaded the catalogue (found by the `catalogue` fuzz target): such a
    /// key is found first, without recursion, and refused.
    static func firstNonStringKey(_ root: Node) -> Node.Mapping? {
        var stack = [root]
        while let n = stack.popLast() {
            switch n {
            case .scalar, .alias: continue
            case .sequence(let s): stack.append(contentsOf: s)
            case .mapping(let m):
                for (key, value) in m {
                    if String.construct(from: key) == nil { return m }
                    stack.append(value)
                }
            }
        }
        return nil
    }

    public static func parse(_ text: String) throws -> ProductCatalogue {
        // Bounded before YAML sees it: a catalogue of thousands of products is well under 1 MiB.
        if text.utf8.count > maxBytes {
            throw LoadError.invalid(path: "", reason: "the catalogue is \(text.utf8.count) bytes; the limit is \(maxBytes) bytes")
        }
        let root: Any?
        let node: Node?
        do { node = try Yams.compose(yaml: text) } catch { throw LoadError.invalid(path: "", reason: "not YAML/JSON: \(error)") }
        if let bad = node.flatMap(Self.firstNonStringKey) {
            throw LoadError.invalid(
                path: "", reason: "a mapping key must be a string, not a map or list (line \((bad.mark?.line).map(String.init) ?? "?"))")
        }
        root = node?.any
        guard let top = root as? [String: Any], let productsNode = top["products"] else {
            throw LoadError.invalid(path: "", reason: "expected a top-level 'products' map or list")
        }
        var entries: [(String, [String: Any])] = []
        if let map = productsNode as? [String: Any] {
            for (id, v) in map {
                guard let fields = v as? [String: Any] else {
                    throw LoadError.invalid(path: "", reason: "product '\(id)' must be a map")
                }
                entries.append((id, fields))
            }
        } else if let list = productsNode as? [Any] {
            for (i, v) in list.enumerated() {
                guard let fields = v as? [String: Any], let id = fields["productId"] as? String ?? fields["product-id"] as? String else {
                    throw LoadError.invalid(path: "", reason: "products[\(i)] needs a productId")
                }
                entries.append((id, fields))
            }
        } else {
            throw LoadError.invalid(path: "", reason: "'products' must be a map or a list")
        }
        var products: [Product] = []
        for (id, fields) in entries.sorted(by: { $0.0 < $1.0 }) {
            guard let typeText = fields["type"] as? String else {
                throw LoadError.invalid(path: "", reason: "product '\(id)' has no type")
            }
            guard let kind = ProductKind(rawValue: typeText.lowercased())
                ?? ProductKind.allCases.first(where: { $0.productType.rawValue.lowercased() == typeText.lowercased() })
            else {
                throw LoadError.invalid(path: "", reason: "product '\(id)' has unknown type '\(typeText)' (expected one of \(ProductKind.allCases.map(\.rawValue).joined(separator: ", ")))")
            }
            var units = 1
            if let u = fields["units"] {
                guard let n = u as? Int, n >= 0 else {
                    throw LoadError.invalid(path: "", reason: "product '\(id)' units must be a non-negative integer")
                }
                units = n
            }
            var duration: ISODuration?
            if let d = fields["duration"] {
                guard let s = d as? String, let parsed = ISODuration(s) else {
                    throw LoadError.invalid(path: "", reason: "product '\(id)' duration must be ISO-8601 like P1M or P30D")
                }
                duration = parsed
            }
            if kind == .nonRenewing && duration == nil {
                throw LoadError.invalid(path: "", reason: "non-renewing product '\(id)' needs a duration")
            }
            let entitlement = fields["entitlement"] as? String
            products.append(Product(productId: id, kind: kind, units: units, duration: duration, entitlement: entitlement))
        }
        return ProductCatalogue(products: products)
    }
}

/// An ISO-8601 duration (`P1Y`, `P1M`, `P30D`, `P1W`, `PT12H`), applied in UTC calendar arithmetic.
public struct ISODuration: Sendable, Equatable, CustomStringConvertible {
    public var years = 0, months = 0, weeks = 0, days = 0, hours = 0, minutes = 0, seconds = 0
    public let description: String

    public init?(_ text: String) {
        let s = text.uppercased()
        guard s.hasPrefix("P"), s.count > 1 else { return nil }
        description = s
        var number = ""
        var inTime = false
        var sawAny = false
        for ch in s.dropFirst() {
            if ch == "T" { inTime = true; continue }
            if ch.isNumber { number.append(ch); continue }
            guard let n = Int(number), n >= 0 else { return nil }
            number = ""
            sawAny = true
            switch (ch, inTime) {
            case ("Y", false): years = n
            case ("M", false): months = n
            case ("W", false): weeks = n
            case ("D", false): days = n
            case ("H", true): hours = n
            case ("M", true): minutes = n
            case ("S", true): seconds = n
            default: return nil
            }
        }
        guard number.isEmpty, sawAny else { return nil }
    }

    /// `start + self`, both in milliseconds since the epoch.
    public func adding(toMillis start: Int64) -> Int64 {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        let date = EpochMillis.date(start)
        var c = DateComponents()
        c.year = years
        c.month = months
        c.day = days + 7 * weeks
        c.hour = hours
        c.minute = minutes
        c.second = seconds
        guard let end = calendar.date(byAdding: c, to: date) else { return start }
        return EpochMillis.millis(end)
    }
}
