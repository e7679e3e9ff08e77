// The JSON writer: compact text of a `JSONValue`, object members in a chosen order (`JSONKeyOrder`).

/// The order in which object members are written.
public enum JSONKeyOrder: Sendable {
    /// Whatever order the dictionary yields (fastest).
    case unordered
    /// Byte order of the keys (stable output).
    case bytes
    /// Shorter keys first, then byte order: the order PostgreSQL's jsonb stores members in, so that parsing the text
    /// into jsonb finds every object already sorted.
    case jsonb

    /// Whether key `a` comes before key `b` in jsonb's order.
    public static func jsonbPrecedes(_ a: String, _ b: String) -> Bool {
        let (m, n) = (a.utf8.count, b.utf8.count)
        return m != n ? m < n : a.utf8.lexicographicallyPrecedes(b.utf8)
    }
}

extension JSONValue {
    /// Compact JSON text. With `sortedKeys`, object keys are in byte order (stable output).
    public func serialized(sortedKeys: Bool = true) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(256)
        write(into: &out, sortedKeys: sortedKeys)
        return String(decoding: out, as: UTF8.self)
    }

    /// Compact JSON as UTF-8 bytes.
    public func serializedBytes(sortedKeys: Bool = true) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(256)
        write(into: &out, sortedKeys: sortedKeys)
        return out
    }

    public func write(into out: inout [UInt8], sortedKeys: Bool) {
        write(into: &out, keyOrder: sortedKeys ? .bytes : .unordered)
    }

    /// Compact JSON as UTF-8 bytes, object members in `keyOrder`.
    public func serializedBytes(keyOrder: JSONKeyOrder) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(256)
        write(into: &out, keyOrder: keyOrder)
        return out
    }

    public func write(into out: inout [UInt8], keyOrder: JSONKeyOrder) {
        switch self {
        case .null: out.append(contentsOf: "null".utf8)
        case .bool(let b): out.append(contentsOf: (b ? "true" : "false").utf8)
        case .integer(let v): out.append(contentsOf: String(v).utf8)
        case .number(let d):
            if d.isFinite {
                if d == d.rounded(), abs(d) < 1e15 {
                    // A whole number parsed with a fraction or exponent ("1.0", "1e3") stays a fraction: written as
                    // "1", it would read back as an integer, another value (found by the `event` fuzz target).
                    out.append(contentsOf: String(Int64(d)).utf8)
                    out.append(contentsOf: ".0".utf8)
                } else {
                    out.append(contentsOf: String(d).utf8)
                }
            } else {
                out.append(contentsOf: "null".utf8)
            }
        case .string(let s): JSONValue.writeString(s, into: &out)
        case .array(let a):
            out.append(UInt8(ascii: "["))
            for (k, v) in a.enumerated() {
                if k > 0 { out.append(UInt8(ascii: ",")) }
                v.write(into: &out, keyOrder: keyOrder)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let o):
            out.append(UInt8(ascii: "{"))
            var first = true
            let keys: [String]
            switch keyOrder {
            case .unordered: keys = Array(o.keys)
            case .bytes: keys = o.keys.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
            case .jsonb: keys = o.keys.sorted(by: JSONKeyOrder.jsonbPrecedes)
            }
            for key in keys {
                guard let v = o[key] else { continue }
                if !first { out.append(UInt8(ascii: ",")) }
                first = false
                JSONValue.writeString(key, into: &out)
                out.append(UInt8(ascii: ":"))
                v.write(into: &out, keyOrder: keyOrder)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    static let hexDigits: [UInt8] = Array("0123456789abcdef".utf8)

    public static func writeString(_ s: String, into out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        var s = s
        // Runs of bytes that need no escape are copied whole (most strings are one such run).
        s.withUTF8 { b in
            var start = 0
            for i in 0..<b.count {
                let c = b[i]
                guard c == 0x22 || c == 0x5C || c < 0x20 else { continue }
                if i > start { out.append(contentsOf: UnsafeBufferPointer(rebasing: b[start..<i])) }
                switch c {
                case 0x22: out.append(contentsOf: [0x5C, 0x22])
                case 0x5C: out.append(contentsOf: [0x5C, 0x5C])
                case 0x0A: out.append(contentsOf: [0x5C, UInt8(ascii: "n")])
                case 0x0D: out.append(contentsOf: [0x5C, UInt8(ascii: "r")])
                case 0x09: out.append(contentsOf: [0x5C, UInt8(ascii: "t")])
                default:
                    out.append(contentsOf: [0x5C, UInt8(ascii: "u"), 0x30, 0x30])
                    out.append(hexDigits[Int(c >> 4)])
                    out.append(hexDigits[Int(c & 0xF)])
                }
                start = i + 1
            }
            if start < b.count { out.append(contentsOf: UnsafeBufferPointer(rebasing: b[start..<b.count])) }
        }
        out.append(UInt8(ascii: "\""))
    }
}

extension JSONValue: CustomStringConvertible {
    public var description: String { serialized() }
}

extension JSONValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByBooleanLiteral,
    ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral, ExpressibleByNilLiteral, ExpressibleByFloatLiteral
{
    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int64) { self = .integer(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(arrayLiteral elements: JSONValue...) { self = .array(elements) }
    public init(dictionaryLiteral elements: (String, JSONValue)...) {
        var d: [String: JSONValue] = [:]
        for (k, v) in elements { d[k] = v }
        self = .object(d)
    }
    public init(nilLiteral: ()) { self = .null }
    public init(floatLiteral value: Double) { self = .number(value) }
}
