// A small, strict, fast JSON parser into `JSONValue` (RFC 8259); the writer is `JSONWriter.swift`.
// Bounded nesting depth; duplicate object keys are rejected (they make signed data ambiguous); strings must be valid
// UTF-8; errors carry the byte offset.

/// Why a JSON text could not be parsed.
public struct JSONParseError: Error, Sendable, Hashable, CustomStringConvertible {
    public var offset: Int
    public var message: String
    public init(offset: Int, message: String) {
        self.offset = offset
        self.message = message
    }
    public var description: String { "\(message) at byte \(offset)" }
}

extension JSONValue {
    public static let defaultMaxDepth = 32

    /// Parses one JSON value filling the whole buffer (surrounding whitespace allowed).
    public static func parse(
        _ buffer: UnsafeBufferPointer<UInt8>, maxDepth: Int = JSONValue.defaultMaxDepth
    ) throws(JSONParseError) -> JSONValue {
        var p = JSONParser(buffer: buffer, maxDepth: maxDepth)
        return try p.parseDocument()
    }

    /// Parses one JSON value from bytes.
    public static func parse(
        bytes: some Collection<UInt8>, maxDepth: Int = JSONValue.defaultMaxDepth
    ) throws(JSONParseError) -> JSONValue {
        try withContiguousBytes(bytes) { (buf) throws(JSONParseError) in try parse(buf, maxDepth: maxDepth) }
    }

    /// Calls `body` with each member of the JSON object `text`, in the order they occur, without building the object
    /// itself (nested values are built). For text already checked (e.g. a member skipped by
    /// `parse(bytes:maxDepth:recordingTopLevel:skippingRecordedObjects:)`): duplicate keys are not looked for.
    public static func forEachMember(
        ofObject text: String, maxDepth: Int = JSONValue.defaultMaxDepth, _ body: (String, JSONValue) -> Void
    ) throws(JSONParseError) {
        try withUTF8Bytes(text) { (buf) throws(JSONParseError) in
            var p = JSONParser(buffer: buf, maxDepth: maxDepth)
            try p.parseMembers(body)
        }
    }

    /// Parses one JSON value from a string.
    public static func parse(_ text: String, maxDepth: Int = JSONValue.defaultMaxDepth) throws(JSONParseError) -> JSONValue {
        try withUTF8Bytes(text) { (buf) throws(JSONParseError) in try parse(buf, maxDepth: maxDepth) }
    }
}

struct JSONParser {
    let buf: UnsafeBufferPointer<UInt8>
    var i: Int = 0
    let maxDepth: Int
    var depth = 0

    init(buffer: UnsafeBufferPointer<UInt8>, maxDepth: Int) {
        self.buf = buffer
        self.maxDepth = maxDepth
    }

    @inline(__always) func fail(_ message: String, at offset: Int? = nil) -> JSONParseError {
        JSONParseError(offset: offset ?? i, message: message)
    }

    @inline(__always) mutating func skipWhitespace() {
        while i < buf.count {
            let c = buf[i]
            if c == 0x20 || c == 0x0A || c == 0x0D || c == 0x09 { i += 1 } else { break }
        }
    }

    mutating func parseDocument() throws(JSONParseError) -> JSONValue {
        skipWhitespace()
        let v = try parseValue()
        skipWhitespace()
        if i != buf.count { throw fail("unexpected data after the JSON value") }
        return v
    }

    mutating func parseValue() throws(JSONParseError) -> JSONValue {
        guard i < buf.count else { throw fail("unexpected end of JSON") }
        switch buf[i] {
        case UInt8(ascii: "{"): return try parseObject()
        case UInt8(ascii: "["): return try parseArray()
        case UInt8(ascii: "\""): return .string(try parseString())
        case UInt8(ascii: "t"):
            try expectLiteral("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try expectLiteral("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try expectLiteral("null")
            return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return try parseNumber()
        default:
            throw fail("unexpected character '\(printable(buf[i]))'")
        }
    }

    func printable(_ c: UInt8) -> String {
        (c >= 0x20 && c < 0x7F) ? String(UnicodeScalar(c)) : "\\x" + String(c, radix: 16)
    }

    mutating func expectLiteral(_ lit: StaticString) throws(JSONParseError) {
        let n = lit.utf8CodeUnitCount
        guard i + n <= buf.count else { throw fail("invalid literal") }
        let p = lit.utf8Start
        for k in 0..<n where buf[i + k] != p[k] { throw fail("invalid literal") }
        i += n
    }

    mutating func enter() throws(JSONParseError) {
        depth += 1
        if depth > maxDepth { throw fail("nesting deeper than \(maxDepth)") }
    }

    mutating func parseObject() throws(JSONParseError) -> JSONValue {
        if try opens(closing: UInt8(ascii: "}")) { return .object([:]) }
        var dict: [String: JSONValue] = [:]
        dict.reserveCapacity(16)
        repeat {
            let keyStart = try keyStarts()
            let key = try parseString()
            try colon()
            let value = try parseValue()
            if dict.updateValue(value, forKey: key) != nil {
                throw fail("duplicate key \"\(key)\"", at: keyStart)
            }
        } while try another(closing: UInt8(ascii: "}"))
        return .object(dict)
    }

    mutating func parseArray() throws(JSONParseError) -> JSONValue {
        if try opens(closing: UInt8(ascii: "]")) { return .array([]) }
        var arr: [JSONValue] = []
        repeat {
            skipWhitespace()
            arr.append(try parseValue())
        } while try another(closing: UInt8(ascii: "]"))
        return .array(arr)
    }

    // The pieces of an object's and an array's syntax, shared by parsing, checking and member-by-member reading.

    /// At an object's or array's opening byte: one level deeper (bounded); true when it is empty (then consumed).
    @inline(__always) mutating func opens(closing: UInt8) throws(JSONParseError) -> Bool {
        try enter()
        i += 1
        skipWhitespace()
        guard i < buf.count, buf[i] == closing else { return false }
        i += 1
        depth -= 1
        return true
    }

    /// Before a member: the offset of its key's opening quote.
    @inline(__always) mutating func keyStarts() throws(JSONParseError) -> Int {
        skipWhitespace()
        guard i < buf.count, buf[i] == UInt8(ascii: "\"") else { throw fail("expected a string key") }
        return i
    }

    /// Between a member's key and its value.
    @inline(__always) mutating func colon() throws(JSONParseError) {
        skipWhitespace()
        guard i < buf.count, buf[i] == UInt8(ascii: ":") else { throw fail("expected ':'") }
        i += 1
        skipWhitespace()
    }

    /// After a member or an element: true at ',', false at `closing` (the container then ends, one level up).
    @inline(__always) mutating func another(closing: UInt8) throws(JSONParseError) -> Bool {
        let object = closing == UInt8(ascii: "}")
        skipWhitespace()
        guard i < buf.count else { throw fail(object ? "unterminated object" : "unterminated array") }
        let c = buf[i]
        i += 1
        if c == UInt8(ascii: ",") { return true }
        guard c == closing else { throw fail(object ? "expected ',' or '}'" : "expected ',' or ']'", at: i - 1) }
        depth -= 1
        return false
    }

    // MARK: checking without building (the same checks, in the same order, with the same errors as parsing)

    mutating func skipValue() throws(JSONParseError) {
        guard i < buf.count else { throw fail("unexpected end of JSON") }
        switch buf[i] {
        case UInt8(ascii: "{"): try skipObject()
        case UInt8(ascii: "["): try skipArray()
        case UInt8(ascii: "\""): _ = try skipString()
        default: _ = try parseValue()  // a number or a literal: nothing to free
        }
    }

    mutating func skipObject() throws(JSONParseError) {
        if try opens(closing: UInt8(ascii: "}")) { return }
        var keys = SeenKeys()
        repeat {
            let keyStart = try keyStarts()
            let plain = try skipString()
            let text = (keyStart + 1)..<(i - 1)
            try colon()
            try skipValue()
            if !keys.insert(text, plain: plain, of: self) {
                throw fail("duplicate key \"\(decodedKey(text))\"", at: keyStart)
            }
        } while try another(closing: UInt8(ascii: "}"))
    }

    /// The string whose text (between its quotes) is `text`, already checked.
    func decodedKey(_ text: Range<Int>) -> String {
        var p = JSONParser(buffer: buf, maxDepth: maxDepth)
        p.i = text.lowerBound - 1
        return (try? p.parseString()) ?? ""
    }

    mutating func skipArray() throws(JSONParseError) {
        if try opens(closing: UInt8(ascii: "]")) { return }
        repeat {
            skipWhitespace()
            try skipValue()
        } while try another(closing: UInt8(ascii: "]"))
    }

    /// Checks the string starting at the opening quote; true when it is plain (ASCII, no escape), whose text is then
    /// its bytes. Anything else goes through `parseString`, which throws the parser's own error.
    mutating func skipString() throws(JSONParseError) -> Bool {
        if let end = plainStringEnd(from: i + 1) {
            i = end + 1
            return true
        }
        _ = try parseString()
        return false
    }

    /// The index of the closing quote of a plain string whose text starts at `start`: nil at an escape, a control
    /// or non-ASCII byte, or the end of the buffer.
    func plainStringEnd(from start: Int) -> Int? {
        var j = start
        let n = buf.count
        let raw = UnsafeRawPointer(buf.baseAddress!)
        while j + 8 <= n, Self.isPlain(raw.loadUnaligned(fromByteOffset: j, as: UInt64.self)) { j += 8 }
        while j < n {
            let c = buf[j]
            if c == UInt8(ascii: "\"") { return j }
            if c == UInt8(ascii: "\\") || c < 0x20 || c >= 0x80 { return nil }
            j += 1
        }
        return nil
    }

    /// The members of the object filling the buffer (surrounding whitespace allowed), in order.
    mutating func parseMembers(_ body: (String, JSONValue) -> Void) throws(JSONParseError) {
        skipWhitespace()
        guard i < buf.count, buf[i] == UInt8(ascii: "{") else { throw fail("expected an object") }
        if try !opens(closing: UInt8(ascii: "}")) {
            repeat {
                _ = try keyStarts()
                let key = try parseString()
                try colon()
                body(key, try parseValue())
            } while try another(closing: UInt8(ascii: "}"))
        }
        skipWhitespace()
        if i != buf.count { throw fail("unexpected data after the JSON value") }
    }

    /// Whether none of the 8 bytes of `w` is '"', '\\', a control byte or a non-ASCII byte (SWAR; "any byte
    /// matches" is exact for these bit tricks).
    @inline(__always) static func isPlain(_ w: UInt64) -> Bool {
        let ones: UInt64 = 0x0101_0101_0101_0101
        let q = w ^ (ones &* 0x22)
        let b = w ^ (ones &* 0x5C)
        let special = ((q &- ones) & ~q) | ((b &- ones) & ~b) | ((w &- ones &* 0x20) & ~w) | w
        return special & 0x8080_8080_8080_8080 == 0
    }

    /// Parses a string starting at the opening quote.
    mutating func parseString() throws(JSONParseError) -> String {
        let start = i + 1
        var j = start
        var highBit: UInt8 = 0
        let n = buf.count
        // Fast scan, 8 bytes at a time (`isPlain`), then the chunk that stopped it byte by byte.
        let raw = UnsafeRawPointer(buf.baseAddress!)
        scan: while true {
            while j + 8 <= n, Self.isPlain(raw.loadUnaligned(fromByteOffset: j, as: UInt64.self)) { j += 8 }
            let end = Swift.min(j + 8, n)
            while j < end {
                let c = buf[j]
                if c == UInt8(ascii: "\"") {
                    let slice = UnsafeBufferPointer(rebasing: buf[start..<j])
                    i = j + 1
                    if highBit & 0x80 == 0 { return String(decoding: slice, as: UTF8.self) }
                    guard let s = String(validating: slice, as: UTF8.self) else {
                        throw fail("string is not valid UTF-8", at: start)
                    }
                    return s
                }
                if c == UInt8(ascii: "\\") { break scan }
                if c < 0x20 { throw fail("control character in string", at: j) }
                highBit |= c
                j += 1
            }
            if j >= n { break }
        }
        guard j < n else { throw fail("unterminated string", at: start - 1) }
        // Slow path with escapes.
        var out: [UInt8] = Array(buf[start..<j])
        while j < n {
            let c = buf[j]
            if c == UInt8(ascii: "\"") {
                i = j + 1
                guard let s = String(validating: out, as: UTF8.self) else {
                    throw fail("string is not valid UTF-8", at: start)
                }
                return s
            }
            if c < 0x20 { throw fail("control character in string", at: j) }
            if c != UInt8(ascii: "\\") {
                out.append(c)
                j += 1
                continue
            }
            j += 1
            guard j < n else { break }
            let e = buf[j]
            j += 1
            switch e {
            case UInt8(ascii: "\""): out.append(0x22)
            case UInt8(ascii: "\\"): out.append(0x5C)
            case UInt8(ascii: "/"): out.append(0x2F)
            case UInt8(ascii: "b"): out.append(0x08)
            case UInt8(ascii: "f"): out.append(0x0C)
            case UInt8(ascii: "n"): out.append(0x0A)
            case UInt8(ascii: "r"): out.append(0x0D)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "u"):
                var scalar = try hex4(at: j)
                j += 4
                if scalar >= 0xD800 && scalar <= 0xDBFF {
                    guard j + 6 <= n, buf[j] == UInt8(ascii: "\\"), buf[j + 1] == UInt8(ascii: "u") else {
                        throw fail("unpaired surrogate in string", at: j)
                    }
                    let low = try hex4(at: j + 2)
                    guard low >= 0xDC00 && low <= 0xDFFF else { throw fail("invalid surrogate pair", at: j) }
                    j += 6
                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                } else if scalar >= 0xDC00 && scalar <= 0xDFFF {
                    throw fail("unpaired surrogate in string", at: j - 6)
                }
                guard let u = Unicode.Scalar(scalar) else { throw fail("invalid \\u escape", at: j - 6) }
                out.append(contentsOf: UTF8.encode(u)!)
            default:
                throw fail("invalid escape '\\\(printable(e))'", at: j - 2)
            }
        }
        throw fail("unterminated string", at: start - 1)
    }

    func hex4(at k: Int) throws(JSONParseError) -> UInt32 {
        guard k + 4 <= buf.count else { throw fail("truncated \\u escape", at: k) }
        var v: UInt32 = 0
        for m in 0..<4 {
            let c = buf[k + m]
            let d: UInt8
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): d = c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): d = c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): d = c - UInt8(ascii: "A") + 10
            default: throw fail("invalid hex digit in \\u escape", at: k + m)
            }
            v = v << 4 | UInt32(d)
        }
        return v
    }

    mutating func parseNumber() throws(JSONParseError) -> JSONValue {
        let start = i
        let n = buf.count
        var negative = false
        if buf[i] == UInt8(ascii: "-") {
            negative = true
            i += 1
        }
        guard i < n, buf[i] >= UInt8(ascii: "0"), buf[i] <= UInt8(ascii: "9") else { throw fail("invalid number", at: start) }
        if buf[i] == UInt8(ascii: "0"), i + 1 < n, buf[i + 1] >= UInt8(ascii: "0"), buf[i + 1] <= UInt8(ascii: "9") {
            throw fail("leading zero in number", at: start)
        }
        var value: Int64 = 0
        var overflow = false
        while i < n, buf[i] >= UInt8(ascii: "0"), buf[i] <= UInt8(ascii: "9") {
            let d = Int64(buf[i] - UInt8(ascii: "0"))
            let (m, o1) = value.multipliedReportingOverflow(by: 10)
            let (s, o2) = negative ? m.subtractingReportingOverflow(d) : m.addingReportingOverflow(d)
            if o1 || o2 { overflow = true }
            value = s
            i += 1
        }
        var isInteger = !overflow
        if i < n, buf[i] == UInt8(ascii: ".") {
            isInteger = false
            i += 1
            guard i < n, buf[i] >= UInt8(ascii: "0"), buf[i] <= UInt8(ascii: "9") else { throw fail("invalid fraction", at: i) }
            while i < n, buf[i] >= UInt8(ascii: "0"), buf[i] <= UInt8(ascii: "9") { i += 1 }
        }
        if i < n, buf[i] == UInt8(ascii: "e") || buf[i] == UInt8(ascii: "E") {
            isInteger = false
            i += 1
            if i < n, buf[i] == UInt8(ascii: "+") || buf[i] == UInt8(ascii: "-") { i += 1 }
            guard i < n, buf[i] >= UInt8(ascii: "0"), buf[i] <= UInt8(ascii: "9") else { throw fail("invalid exponent", at: i) }
            while i < n, buf[i] >= UInt8(ascii: "0"), buf[i] <= UInt8(ascii: "9") { i += 1 }
        }
        if isInteger { return .integer(value) }
        let text = String(decoding: UnsafeBufferPointer(rebasing: buf[start..<i]), as: UTF8.self)
        guard let d = Double(text), d.isFinite else { throw fail("number out of range", at: start) }
        return .number(d)
    }
}
