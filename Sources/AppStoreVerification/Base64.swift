// Strict base64 / base64url codecs over raw bytes (canonical encodings only: non-zero trailing bits are rejected,
// so every encoded string maps to exactly one byte string and one byte string to exactly one encoding).

public enum Base64 {
    static let invalid: UInt8 = 0xFF

    static let stdTable: [UInt8] = makeTable(plus: UInt8(ascii: "+"), slash: UInt8(ascii: "/"))
    static let urlTable: [UInt8] = makeTable(plus: UInt8(ascii: "-"), slash: UInt8(ascii: "_"))

    static func makeTable(plus: UInt8, slash: UInt8) -> [UInt8] {
        var t = [UInt8](repeating: invalid, count: 256)
        for (k, c) in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789".utf8.enumerated() { t[Int(c)] = UInt8(k) }
        t[Int(plus)] = 62
        t[Int(slash)] = 63
        return t
    }

    /// Four 256-entry tables of pre-shifted 6-bit values (invalid characters set bit 24), for the 4-character loop.
    static let stdWide: [UInt32] = makeWide(stdTable)
    static let urlWide: [UInt32] = makeWide(urlTable)

    static func makeWide(_ t: [UInt8]) -> [UInt32] {
        var w = [UInt32](repeating: 0, count: 1024)
        for c in 0..<256 {
            let v = t[c]
            for k in 0..<4 {
                w[k * 256 + c] = v == invalid ? 0x0100_0000 : UInt32(v) << (18 - 6 * UInt32(k))
            }
        }
        return w
    }

    /// Decodes unpadded base64url (JWS segments). Returns nil on any invalid character, padding, or non-canonical tail.
    public static func decodeURL(_ src: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        urlTable.withUnsafeBufferPointer { t in
            urlWide.withUnsafeBufferPointer { w in decode(src, table: t, wide: w, padded: false) }
        }
    }

    /// Decodes padded standard base64 (x5c certificates).
    public static func decodeStandard(_ src: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        stdTable.withUnsafeBufferPointer { t in
            stdWide.withUnsafeBufferPointer { w in decode(src, table: t, wide: w, padded: true) }
        }
    }

    public static func decodeStandard(_ s: String) -> [UInt8]? {
        var s = s
        return s.withUTF8 { decodeStandard($0) }
    }

    public static func decodeURL(_ s: String) -> [UInt8]? {
        var s = s
        return s.withUTF8 { decodeURL($0) }
    }

    static func decode(
        _ src: UnsafeBufferPointer<UInt8>, table t: UnsafeBufferPointer<UInt8>, wide w: UnsafeBufferPointer<UInt32>,
        padded: Bool
    ) -> [UInt8]? {
        var ok = true
        // Two spare bytes: the 8-character loop stores 8 bytes, of which 6 are output.
        let out = [UInt8](unsafeUninitializedCapacity: decodedCapacity(src.count)) { dst, initialized in
            guard let d = dst.baseAddress, let n = decode(src, table: t, wide: w, padded: padded, into: d) else {
                ok = false
                initialized = 0
                return
            }
            initialized = n
        }
        return ok ? out : nil
    }

    /// Room `decode(_:table:wide:padded:into:)` may write for `count` characters (the output and two spare bytes).
    @inline(__always) static func decodedCapacity(_ count: Int) -> Int { count / 4 * 3 + 4 }

    /// Decodes padded standard base64 into `dst` (which must have room for `decodedCapacity(src.count)` bytes, and
    /// may be written two bytes past the output); returns the output's length, nil when the input is not valid.
    static func decodeStandard(_ src: UnsafeBufferPointer<UInt8>, padded: Bool, into dst: UnsafeMutablePointer<UInt8>) -> Int? {
        stdTable.withUnsafeBufferPointer { t in
            stdWide.withUnsafeBufferPointer { w in decode(src, table: t, wide: w, padded: padded, into: dst) }
        }
    }

    @inline(__always)
    static func decode(
        _ src: UnsafeBufferPointer<UInt8>, table t: UnsafeBufferPointer<UInt8>, wide w: UnsafeBufferPointer<UInt32>,
        padded: Bool, into d: UnsafeMutablePointer<UInt8>
    ) -> Int? {
        var n = src.count
        if padded {
            guard n % 4 == 0 else { return nil }
            if n > 0 && src[n - 1] == UInt8(ascii: "=") {
                n -= 1
                if src[n - 1] == UInt8(ascii: "=") { n -= 1 }
            }
        }
        let rem = n % 4
        if rem == 1 { return nil }
        let full = n / 4
        guard let s = src.baseAddress, let wp = w.baseAddress else { return 0 }
        var bad: UInt8 = 0
        var wideBad: UInt32 = 0
        var o = 0
        var k = 0
        // Two 4-character groups per step: 6 bytes written with one 8-byte store.
        for _ in 0..<(full / 2) {
            let x = wp[Int(s[k])] | wp[256 + Int(s[k + 1])] | wp[512 + Int(s[k + 2])] | wp[768 + Int(s[k + 3])]
            let y = wp[Int(s[k + 4])] | wp[256 + Int(s[k + 5])] | wp[512 + Int(s[k + 6])] | wp[768 + Int(s[k + 7])]
            wideBad |= x | y
            let v = UInt64(x) << 40 | UInt64(y & 0x00FF_FFFF) << 16
            UnsafeMutableRawPointer(d + o).storeBytes(of: v.bigEndian, as: UInt64.self)
            o += 6
            k += 8
        }
        if full & 1 != 0 {
            let x = wp[Int(s[k])] | wp[256 + Int(s[k + 1])] | wp[512 + Int(s[k + 2])] | wp[768 + Int(s[k + 3])]
            wideBad |= x
            d[o] = UInt8(truncatingIfNeeded: x >> 16)
            d[o + 1] = UInt8(truncatingIfNeeded: x >> 8)
            d[o + 2] = UInt8(truncatingIfNeeded: x)
            o += 3
            k += 4
        }
        if wideBad & 0xFF00_0000 != 0 { bad |= 0x80 }
        if rem == 2 {
            let a = t[Int(s[k])], b = t[Int(s[k + 1])]
            bad |= a | b
            if b & 0x0F != 0 { bad |= 0x80 }
            d[o] = a << 2 | b >> 4
            o += 1
        } else if rem == 3 {
            let a = t[Int(s[k])], b = t[Int(s[k + 1])], c = t[Int(s[k + 2])]
            bad |= a | b | c
            if c & 0x03 != 0 { bad |= 0x80 }
            d[o] = a << 2 | b >> 4
            d[o + 1] = b << 4 | c >> 2
            o += 2
        }
        // Any invalid character maps to 0xFF, which sets bits above the 6 valid ones.
        return bad & 0xC0 != 0 ? nil : o
    }

    static let stdAlphabet: [UInt8] = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    static let urlAlphabet: [UInt8] = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// Unpadded base64url.
    public static func encodeURL(_ bytes: some Collection<UInt8>) -> String { encode(Array(bytes), alphabet: urlAlphabet, pad: false) }

    /// Padded standard base64.
    public static func encodeStandard(_ bytes: some Collection<UInt8>) -> String {
        encode(Array(bytes), alphabet: stdAlphabet, pad: true)
    }

    static func encode(_ b: [UInt8], alphabet a: [UInt8], pad: Bool) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((b.count + 2) / 3 * 4)
        var k = 0
        while k + 3 <= b.count {
            let v = UInt32(b[k]) << 16 | UInt32(b[k + 1]) << 8 | UInt32(b[k + 2])
            out.append(a[Int(v >> 18 & 63)])
            out.append(a[Int(v >> 12 & 63)])
            out.append(a[Int(v >> 6 & 63)])
            out.append(a[Int(v & 63)])
            k += 3
        }
        let r = b.count - k
        if r == 1 {
            let v = UInt32(b[k]) << 16
            out.append(a[Int(v >> 18 & 63)])
            out.append(a[Int(v >> 12 & 63)])
            if pad { out.append(contentsOf: "==".utf8) }
        } else if r == 2 {
            let v = UInt32(b[k]) << 16 | UInt32(b[k + 1]) << 8
            out.append(a[Int(v >> 18 & 63)])
            out.append(a[Int(v >> 12 & 63)])
            out.append(a[Int(v >> 6 & 63)])
            if pad { out.append(UInt8(ascii: "=")) }
        }
        return String(decoding: out, as: UTF8.self)
    }
}
