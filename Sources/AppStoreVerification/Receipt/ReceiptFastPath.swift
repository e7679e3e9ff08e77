/// The receipt fast path: on a chain-cache hit, the base64 of the SignedData's certificate set (about 70 % of a
/// receipt's bytes) is never decoded.
///
/// For a one-line receipt (no whitespace, length a multiple of 4), the DER headers up to the end of encapContentInfo
/// give the offset P of the certificate set [0]; only the base64 through P + 6 (the receipt payload and the set's
/// header) and from the set's end (the signerInfos) is decoded, into a buffer of the receipt's full length whose
/// middle stays zero, and walked by the strict-DER PKCS#7 walk without the set's elements. The chain-cache key
/// (`receiptSpanKey`) holds the signer's issuer and sid, P mod 3, the set's length and the exact base64 characters of
/// every 3-byte group the set touches, compared byte for byte on a hit: equal characters at the same alignment are
/// the same certificate set, which was walked, validated and chain-verified when that entry was made (entries are
/// only made by the full path, see `receiptChain`). Anything else (no cache, an odd length, whitespace, `=` inside,
/// an unexpected header, a failed walk, a miss, an untrusted root) falls back to the full path, which on a miss also
/// caches the chain under this key. After a hit the checks are the full path's own (`verifyAppReceipt(_:...)`).
extension SignedDataVerifier {
    static let receiptSpanTag: UInt8 = 0x72  // 'r': sid + base64 span of a receipt's certificate set

    enum FastReceipt {
        case verified(VerifiedAppReceipt)
        /// Verify by the full path; `cacheSpan`: the fast path looked its key up and missed.
        case fallBack(cacheSpan: Bool)
    }

    /// A one-line base64 receipt: the fast path, else the full path; nil when `input` is not padded standard base64
    /// (the caller then tries without whitespace).
    func verifyAppReceiptLine(_ input: UnsafeBufferPointer<UInt8>) throws(VerificationError) -> VerifiedAppReceipt? {
        var cacheSpan = false
        if chainCache != nil {
            switch try fastAppReceipt(input) {
            case .verified(let r): return r
            case .fallBack(let c): cacheSpan = c
            }
        }
        guard let der = Base64.decodeStandard(input) else { return nil }
        return try verifyAppReceipt(der: der, spanKeyInput: cacheSpan ? input : nil)
    }

    func fastAppReceipt(_ input: UnsafeBufferPointer<UInt8>) throws(VerificationError) -> FastReceipt {
        guard let cache = chainCache, let signed = Self.spliceReceipt(input, maxBytes: policy.maxReceiptBytes),
            let key = Self.receiptSpanKey(input, signed.certificateSetDER.indices, signed.signerInfo)
        else { return .fallBack(cacheSpan: false) }
        guard let chain = cache.lookup(key, countHit: false, countMiss: false), isTrusted(chain.rootFingerprint) else {
            return .fallBack(cacheSpan: true)  // The full path counts its own lookup.
        }
        cache.recordHit()
        return .verified(try verifyAppReceipt(signed, cachedChain: chain, spanKeyInput: nil))
    }

    /// The chain-cache key of a certificate set by its base64 (`input` is the one-line base64 of the whole receipt,
    /// `set` the set's byte range in the decoded receipt); nil when there is no set.
    static func receiptSpanKey(
        _ input: UnsafeBufferPointer<UInt8>, _ set: Range<Int>, _ si: PKCS7SignedData.SignerInfo
    ) -> ChainCacheKey? {
        let lo = set.lowerBound / 3 * 4
        let hi = (set.upperBound + 2) / 3 * 4
        guard !set.isEmpty, hi <= input.count else { return nil }
        // The span's length follows from the alignment and the set's length.
        var keyBytes = receiptKeyPrefix(receiptSpanTag, si, reserving: 5 + hi - lo)
        keyBytes.append(UInt8(set.lowerBound % 3))
        withUnsafeBytes(of: UInt32(set.count).bigEndian) { keyBytes.append(contentsOf: $0) }
        keyBytes.append(contentsOf: UnsafeBufferPointer(rebasing: input[lo..<hi]))
        return ChainCacheKey(bytes: keyBytes)
    }

    /// One DER header (low tag numbers, lengths of at most 3 octets; the walk checks the rules): the tag octet and
    /// where the content starts and ends. Nil when it does not fit in `limit`.
    static func spliceHeader(_ b: UnsafeBufferPointer<UInt8>, _ i: Int, _ limit: Int) -> (tag: UInt8, content: Int, end: Int)? {
        guard i >= 0, i + 2 <= limit else { return nil }
        let tag = b[i]
        guard tag & 0x1F != 0x1F else { return nil }
        let l0 = b[i + 1]
        if l0 < 0x80 { return (tag, i + 2, i + 2 + Int(l0)) }
        let c = Int(l0 & 0x7F)
        guard c >= 1, c <= 3, i + 2 + c <= limit else { return nil }
        var v = 0
        for k in 0..<c { v = v << 8 | Int(b[i + 2 + k]) }
        return (tag, i + 2 + c, i + 2 + c + v)
    }

    /// The receipt's SignedData walked without decoding its certificate set; nil for anything unusual.
    static func spliceReceipt(_ input: UnsafeBufferPointer<UInt8>, maxBytes: Int) -> PKCS7SignedData? {
        let n = input.count
        guard n >= 128, n % 4 == 0 else { return nil }
        let eq = UInt8(ascii: "=")
        let pad = input[n - 1] != eq ? 0 : input[n - 2] != eq ? 1 : 2
        let total = n / 4 * 3 - pad
        guard total <= maxBytes else { return nil }
        // 1. The headers through encapContentInfo, from the first 96 characters (never the last group: no padding).
        let headChars = min(96, n - 4)
        var head = [UInt8](repeating: 0, count: Base64.decodedCapacity(headChars))
        let certStart: Int? = head.withUnsafeMutableBufferPointer { h in
            guard let hb = Base64.decodeStandard(UnsafeBufferPointer(rebasing: input[0..<headChars]), padded: false, into: h.baseAddress!)
            else { return nil }
            let b = UnsafeBufferPointer(h)
            guard let ci = spliceHeader(b, 0, hb), ci.tag == 0x30, let ct = spliceHeader(b, ci.content, hb), ct.tag == 0x06,
                let e0 = spliceHeader(b, ct.end, hb), e0.tag == 0xA0, let sd = spliceHeader(b, e0.content, hb), sd.tag == 0x30,
                let v = spliceHeader(b, sd.content, hb), v.tag == 0x02, let algs = spliceHeader(b, v.end, hb), algs.tag == 0x31,
                let eci = spliceHeader(b, algs.end, hb), eci.tag == 0x30
            else { return nil }
            return eci.end
        }
        // 2. Everything through the certificate set's header; 3. everything from the set's end.
        guard let p = certStart, p + 6 <= total else { return nil }
        let prefixChars = (p + 6 + 2) / 3 * 4
        guard prefixChars <= n - 4 else { return nil }
        // Zeroed in one memset (the middle, the certificate set, stays zero).
        var der = [UInt8](unsafeUninitializedCapacity: total + 4) { b, count in
            b.initialize(repeating: 0)
            count = b.count
        }
        let ok: Bool = der.withUnsafeMutableBufferPointer { d in
            let base = d.baseAddress!
            guard
                Base64.decodeStandard(UnsafeBufferPointer(rebasing: input[0..<prefixChars]), padded: false, into: base)
                    == prefixChars / 4 * 3
            else { return false }
            let b = UnsafeBufferPointer(d)
            guard let set = spliceHeader(b, p, prefixChars / 4 * 3), set.tag == 0xA0, set.end <= total - 2 else { return false }
            let suffixChars = set.end / 3 * 4
            guard suffixChars >= prefixChars else { return false }
            let at = set.end / 3 * 3
            return Base64.decodeStandard(UnsafeBufferPointer(rebasing: input[suffixChars..<n]), padded: true, into: base + at)
                == total - at
        }
        guard ok else { return nil }
        der.removeLast(4)
        guard let signed = try? PKCS7SignedData(der: der, skippingCertificates: true),
            signed.certificateSetDER.startIndex == p, !signed.certificateSetDER.isEmpty
        else { return nil }
        return signed
    }
}
