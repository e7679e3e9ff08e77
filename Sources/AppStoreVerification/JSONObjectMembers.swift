// Reading a JSON object's members without building it (`JSONValue.parseObjectMembers`), and the bookkeeping of an
// object's keys that finds a duplicate when an object is checked without being built (`JSONParser.skipObject`) or read
// member by member. The parser itself, its errors and the shared pieces of the syntax are `JSONParser.swift`.

extension JSONValue {
    /// Parses one JSON value from bytes; when it is an object, reads it member by member instead of building it: the
    /// members named in `names` come back by their index there (value, and the byte range in `bytes` of its text), any
    /// other member is checked and dropped. nil when the value is valid JSON but not an object. Every error is the one
    /// `parse(bytes:maxDepth:)` throws, at the same offset (syntax, depth, UTF-8, duplicate keys compared as the
    /// dictionary of a parsed object compares them). For a reader that knows which members it reads: no dictionary is
    /// built, and none of its keys hashed.
    ///
    /// An object under a name `names` skips (`JSONMemberNames.init(_:skippingObjectsOf:)`) is checked exactly as it
    /// would be parsed but not built: its value is `null` and its range the only way to it (a reader that needs an
    /// embedded document only as text saves building and freeing its whole tree).
    public static func parseObjectMembers(
        bytes: [UInt8], maxDepth: Int = JSONValue.defaultMaxDepth, names: JSONMemberNames
    ) throws(JSONParseError) -> JSONObjectMembers? {
        try bytes.withUnsafeBufferPointer { (buf) throws(JSONParseError) in
            var p = JSONParser(buffer: buf, maxDepth: maxDepth)
            return try p.parseNamedMembers(names)
        }
    }
}

/// The member names a reader looks for in JSON objects (`JSONValue.parseObjectMembers`), ready to be matched
/// against a key's bytes.
public struct JSONMemberNames: Sendable {
    public let names: [String]
    /// By index: whether an object under that name is checked, not built.
    let skipsObjects: [Bool]
    private let bytes: [[UInt8]]
    /// For each length, the indexes of the names of that many bytes.
    private let byLength: [[Int]]

    /// `names`, of which those in `skippingObjectsOf` have an object value checked but not built.
    public init(_ names: [String], skippingObjectsOf skipped: Set<String> = []) {
        self.names = names
        skipsObjects = names.map(skipped.contains)
        bytes = names.map { Array($0.utf8) }
        var byLength = Array(repeating: [Int](), count: (bytes.map(\.count).max() ?? 0) + 1)
        for (index, name) in bytes.enumerated() { byLength[name.count].append(index) }
        self.byLength = byLength
    }

    /// The index of the name whose bytes are `key`'s.
    func index(plain key: UnsafeBufferPointer<UInt8>) -> Int? {
        guard key.count < byLength.count else { return nil }
        for index in byLength[key.count] where bytes[index].withUnsafeBufferPointer({ $0.elementsEqual(key) }) {
            return index
        }
        return nil
    }
}

/// The named members of a JSON object (`JSONValue.parseObjectMembers`): for each name, by its index, the member's
/// value and the byte range of its text, or nil where the object has no such member.
public struct JSONObjectMembers: Sendable, Equatable {
    public var values: [JSONValue?]
    public var ranges: [Range<Int>?]

    init(count: Int) {
        values = Array(repeating: nil, count: count)
        ranges = Array(repeating: nil, count: count)
    }

    public subscript(index: Int) -> JSONValue? { values[index] }
}

extension JSONParser {
    /// The document filling the buffer, read as `JSONValue.parseObjectMembers` describes; each member's value is
    /// parsed, then its key checked against those before it, as `parseObject` does.
    mutating func parseNamedMembers(_ names: JSONMemberNames) throws(JSONParseError) -> JSONObjectMembers? {
        skipWhitespace()
        guard i < buf.count, buf[i] == UInt8(ascii: "{") else {
            i = 0
            _ = try parseDocument()
            return nil
        }
        var members = JSONObjectMembers(count: names.names.count)
        var others = SeenKeys()
        if try !opens(closing: UInt8(ascii: "}")) {
            repeat {
                let keyStart = try keyStarts()
                let plain = try skipString()
                let text = (keyStart + 1)..<(i - 1)
                // A plain key (ASCII, no escape) is one of the names exactly when its bytes are; any other key is
                // decoded and compared as a String.
                let name = plain
                    ? names.index(plain: UnsafeBufferPointer(rebasing: buf[text]))
                    : names.names.firstIndex(of: decodedKey(text))
                try colon()
                let valueStart = i
                guard let name else {
                    try skipValue()
                    if !others.insert(text, plain: plain, of: self) { throw fail("duplicate key \"\(decodedKey(text))\"", at: keyStart) }
                    continue
                }
                let value: JSONValue
                if names.skipsObjects[name], i < buf.count, buf[i] == UInt8(ascii: "{") {
                    try skipObject()
                    value = .null
                } else {
                    value = try parseValue()
                }
                if members.ranges[name] != nil { throw fail("duplicate key \"\(decodedKey(text))\"", at: keyStart) }
                members.values[name] = value
                members.ranges[name] = valueStart..<i
            } while try another(closing: UInt8(ascii: "}"))
        }
        skipWhitespace()
        if i != buf.count { throw fail("unexpected data after the JSON value") }
        return members
    }

    /// The keys of one object checked so far. A few are compared one by one, as cheap as it gets for the small
    /// objects of real documents; past `linearLimit` they move into sets, where each is found again in constant time
    /// (an object of many keys must not cost the square of their number).
    struct SeenKeys {
        static let linearLimit = 32
        private var few: [(text: Range<Int>, plain: Bool)] = []
        private var many: ManyKeys?

        /// False when the key is one already seen.
        mutating func insert(_ text: Range<Int>, plain: Bool, of parser: JSONParser) -> Bool {
            if many != nil { return many!.insert(text, plain: plain, of: parser) }
            let key = (text: text, plain: plain)
            if few.contains(where: { parser.sameKey($0, key) }) { return false }
            few.append(key)
            if few.count >= Self.linearLimit {
                var sets = ManyKeys()
                for k in few { _ = sets.insert(k.text, plain: k.plain, of: parser) }
                many = sets
                few = []
            }
            return true
        }
    }

    /// Many keys of one object. Two plain keys (ASCII, no escape) are the same key exactly when their bytes are, so
    /// while every key is plain their bytes are kept; from the first key that is not, every key is kept as its
    /// decoded String, compared as the parser's dictionary compares its keys (canonically equivalent ones equal).
    struct ManyKeys {
        private var plain: Set<KeyBytes> = []
        private var decoded: Set<String>?

        mutating func insert(_ text: Range<Int>, plain isPlain: Bool, of parser: JSONParser) -> Bool {
            if decoded == nil, isPlain { return plain.insert(KeyBytes(buffer: parser.buf, text: text)).inserted }
            if decoded == nil {
                decoded = Set(plain.map { parser.decodedKey($0.text) })
                plain = []
            }
            return decoded!.insert(parser.decodedKey(text)).inserted
        }
    }

    /// Whether two checked keys (their texts between the quotes) are the same key: by their bytes when both are
    /// plain, as decoded Strings otherwise.
    func sameKey(_ a: (text: Range<Int>, plain: Bool), _ b: (text: Range<Int>, plain: Bool)) -> Bool {
        if a.plain && b.plain {
            guard a.text.count == b.text.count else { return false }
            return buf[a.text].elementsEqual(buf[b.text])
        }
        return decodedKey(a.text) == decodedKey(b.text)
    }

    /// A plain key's text, by its bytes in the buffer being parsed.
    struct KeyBytes: Hashable {
        let buffer: UnsafeBufferPointer<UInt8>
        let text: Range<Int>

        func hash(into hasher: inout Hasher) { hasher.combine(bytes: UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: buffer[text]))) }

        static func == (a: KeyBytes, b: KeyBytes) -> Bool {
            a.text.count == b.text.count && a.buffer[a.text].elementsEqual(b.buffer[b.text])
        }
    }
}
