/// A strict DER reader (X.690 §10) that walks elements in place over a byte buffer instead of building a node tree.
///
/// Receipts are parsed on every message, and SwiftASN1's `DER.parse` materialises a node for every element of its input
/// (the certificate set's hundreds included) before anything can be read. This reader accepts exactly the TLV
/// structure `DER.parse` accepts: definite lengths in the fewest octets (short form below 128), short-form tags below
/// 31 and minimal long-form tags (at most 9 octets), no `[UNIVERSAL 0]` (end-of-contents), at most 50 levels of
/// nesting, one root element covering the whole input. Contents are only descended into where the caller asks
/// (`children`) or validates (`validate`): the PKCS#7 walk validates everything but the certificate set, whose bytes
/// are validated on a chain-cache miss (a hit means the very same bytes were validated before).
/// `StrictDERTests` checks it against `DER.parse` on the fixtures, generated receipts and thousands of mutations.
enum StrictDER {
    enum Failure: Error, Equatable, CustomStringConvertible {
        case truncated, indefiniteLength, nonMinimalLength, lengthTooLarge, badTag, endOfContents, tooDeep, trailingData

        var description: String {
            switch self {
            case .truncated: return "truncated element"
            case .indefiniteLength: return "indefinite length (BER, not DER)"
            case .nonMinimalLength: return "length not encoded in the fewest octets"
            case .lengthTooLarge: return "length too large"
            case .badTag: return "invalid tag encoding"
            case .endOfContents: return "unexpected end-of-contents octets or [UNIVERSAL 0] tag"
            case .tooDeep: return "more than 50 levels of nesting"
            case .trailingData: return "trailing data after the element"
            }
        }
    }

    /// Nesting bound of `DER.parse` (the root is at depth 1).
    static let maximumDepth = 50

    /// A tag without its constructed bit, like SwiftASN1's `ASN1Identifier`: the class bits (0x00 universal,
    /// 0x40 application, 0x80 context-specific, 0xC0 private) and the number.
    struct Tag: Equatable, CustomStringConvertible {
        let classBits: UInt8
        let number: UInt

        static let integer = Tag(classBits: 0, number: 2)
        static let octetString = Tag(classBits: 0, number: 4)
        static let objectIdentifier = Tag(classBits: 0, number: 6)
        static let utf8String = Tag(classBits: 0, number: 12)
        static let sequence = Tag(classBits: 0, number: 16)
        static let set = Tag(classBits: 0, number: 17)
        static let printableString = Tag(classBits: 0, number: 19)
        static let ia5String = Tag(classBits: 0, number: 22)
        static let context0 = Tag(classBits: 0x80, number: 0)
        static let context1 = Tag(classBits: 0x80, number: 1)

        var description: String {
            let cls = ["universal", "application", "context", "private"][Int(classBits >> 6)]
            return "[\(cls) \(number)]"
        }
    }

    /// One element: where its identifier, content and end are in the buffer.
    struct Element {
        let tag: Tag
        let isConstructed: Bool
        /// Index of the identifier octet.
        let start: Int
        let contentStart: Int
        let end: Int
        /// 1 for the root.
        let depth: Int

        var content: Range<Int> { contentStart..<end }
        var encoded: Range<Int> { start..<end }
        var contentCount: Int { end - contentStart }
    }

    /// Reads consecutive elements of one level (the root level, or an element's contents).
    struct Cursor {
        let bytes: UnsafeBufferPointer<UInt8>
        var position: Int
        let end: Int
        /// Depth of the elements this cursor yields.
        let depth: Int

        var isAtEnd: Bool { position >= end }

        /// The next element, or nil at the end of this level.
        mutating func next() throws(Failure) -> Element? {
            if position >= end { return nil }
            let e = try StrictDER.element(bytes, at: position, limit: end, depth: depth)
            position = e.end
            return e
        }
    }

    /// The single element covering all of `bytes` (as `DER.parse` requires), at depth 1.
    static func root(_ bytes: UnsafeBufferPointer<UInt8>) throws(Failure) -> Element {
        let e = try element(bytes, at: 0, limit: bytes.count, depth: 1)
        if e.end != bytes.count { throw .trailingData }
        return e
    }

    /// The single element covering all of `r` (a value nested in an OCTET STRING), as a root at depth 1.
    static func root(_ bytes: UnsafeBufferPointer<UInt8>, _ r: Range<Int>) throws(Failure) -> Element {
        let e = try element(bytes, at: r.lowerBound, limit: r.upperBound, depth: 1)
        if e.end != r.upperBound { throw .trailingData }
        return e
    }

    /// The elements inside a constructed element.
    static func children(_ e: Element, in bytes: UnsafeBufferPointer<UInt8>) -> Cursor {
        Cursor(bytes: bytes, position: e.contentStart, end: e.end, depth: e.depth + 1)
    }

    /// Checks everything inside `e` the way `DER.parse` would (every nested element of a constructed one).
    static func validate(_ e: Element, in bytes: UnsafeBufferPointer<UInt8>) throws(Failure) {
        guard e.isConstructed else { return }
        var c = children(e, in: bytes)
        while let child = try c.next() { try validate(child, in: bytes) }
    }

    /// Reads one element header at `i` whose element must end by `limit`.
    @inline(__always)
    static func element(
        _ b: UnsafeBufferPointer<UInt8>, at start: Int, limit: Int, depth: Int
    ) throws(Failure) -> Element {
        if depth > maximumDepth { throw .tooDeep }
        var i = start
        guard i < limit else { throw .truncated }
        let first = b[i]
        i += 1
        let number: UInt
        if first & 0x1F == 0x1F {
            // Long form: base-128, no leading 0x80, at most 9 octets, and only for numbers >= 31.
            guard i < limit, b[i] != 0x80 else { throw .badTag }
            var n: UInt = 0
            var octets = 0
            while true {
                guard i < limit else { throw .badTag }
                let o = b[i]
                i += 1
                octets += 1
                if octets > 9 { throw .badTag }
                n = n << 7 | UInt(o & 0x7F)
                if o & 0x80 == 0 { break }
            }
            guard n >= 0x1F else { throw .badTag }
            number = n
        } else {
            number = UInt(first & 0x1F)
        }
        guard i < limit else { throw .truncated }
        let l0 = b[i]
        i += 1
        let length: Int
        if l0 < 0x80 {
            length = Int(l0)
        } else if l0 == 0x80 {
            throw .indefiniteLength
        } else {
            let count = Int(l0 & 0x7F)
            guard limit - i >= count else { throw .truncated }
            guard count <= 8 else { throw .lengthTooLarge }
            var v: UInt = 0
            for k in 0..<count { v = v << 8 | UInt(b[i + k]) }
            i += count
            // Fewest octets: the long form only from 128, and no leading zero octet.
            if v < 0x80 || (UInt.bitWidth - v.leadingZeroBitCount + 7) / 8 < count { throw .nonMinimalLength }
            guard v <= UInt(Int.max) else { throw .lengthTooLarge }
            length = Int(v)
        }
        if first & 0xC0 == 0 && number == 0 { throw .endOfContents }
        guard limit - i >= length else { throw .truncated }
        return Element(
            tag: Tag(classBits: first & 0xC0, number: number), isConstructed: first & 0x20 != 0, start: start,
            contentStart: i, end: i + length, depth: depth)
    }

    // MARK: - Primitive values (the rules of SwiftASN1's decoders)

    /// A DER INTEGER's content as a signed 64-bit value: not empty, fewest octets, at most 8 octets.
    static func int64(_ b: UnsafeBufferPointer<UInt8>, _ r: Range<Int>) -> Int64? {
        let n = r.count
        guard n > 0, n <= 8 else { return nil }
        let first = b[r.lowerBound]
        if n > 1 {
            let second = b[r.lowerBound + 1]
            if (first == 0xFF && second & 0x80 != 0) || (first == 0 && second & 0x80 == 0) { return nil }
        }
        var v: Int64 = first & 0x80 != 0 ? -1 : 0
        for k in r { v = v << 8 | Int64(b[k]) }
        return v
    }

    /// Whether an OBJECT IDENTIFIER's content is well formed: at least one subidentifier, each in base 128 with no
    /// leading 0x80 octet, at most 9 octets, and the last one terminated.
    static func isValidOID(_ b: UnsafeBufferPointer<UInt8>, _ r: Range<Int>) -> Bool {
        guard !r.isEmpty else { return false }
        var i = r.lowerBound
        while i < r.upperBound {
            if b[i] == 0x80 { return false }
            var octets = 0
            while true {
                guard i < r.upperBound else { return false }
                let o = b[i]
                i += 1
                octets += 1
                if octets > 9 { return false }
                if o & 0x80 == 0 { break }
            }
        }
        return true
    }
}
