/// The input forms every entry point (worker raw topic, `fleet verify`, the HTTP front door) accepts:
/// - a compact JWS (notification, transaction, renewal info, AppTransaction);
/// - Apple's notification POST body `{"signedPayload": "<JWS>"}`;
/// - a legacy app receipt: a bare standard-base64 line starting with `MI` (DER SEQUENCE), or Apple's `verifyReceipt`
///   request body `{"receipt-data": "<base64>"}` (other keys such as `password` or `exclude-old-transactions` are
///   ignored);
/// - a StoreKit 1 `transactionReceipt` (base64 of an old-style plist with `signature` and `purchase-info`): verified
///   when its issuer is a configured trusted intermediate, else rejected with `LEGACY_TRANSACTION_RECEIPT_UNSUPPORTED`.
extension SignedDataVerifier {
    func verifyTop(_ raw: UnsafeBufferPointer<UInt8>, expected: VerifiedItem.Kind?) throws(VerificationError) -> VerifiedItem {
        // JWS keep their own (smaller) bound, checked in verifyJWS; receipts theirs.
        let bound = max(policy.maxInputBytes, policy.maxReceiptBytes)
        if raw.count > bound {
            throw VerificationError(.payloadTooLarge, "input is \(raw.count) bytes; the limit is \(bound) bytes")
        }
        var lo = 0
        var hi = raw.count
        while lo < hi && Self.isSpace(raw[lo]) { lo += 1 }
        while hi > lo && Self.isSpace(raw[hi - 1]) { hi -= 1 }
        if lo == hi { throw VerificationError(.malformedJWS, "empty input") }
        let buf = UnsafeBufferPointer(rebasing: raw[lo..<hi])

        if buf[0] == UInt8(ascii: "{") {
            // Apple's POST body as Apple sends it: its JWS read without a JSON parse (the same checks as below).
            if let jws = SoleJWSBody.signedPayload.jws(in: buf) {
                if buf.count > policy.maxInputBytes {
                    throw VerificationError(
                        .payloadTooLarge, "input is \(buf.count) bytes; the limit is \(policy.maxInputBytes) bytes")
                }
                if let expected, expected != .notification {
                    throw VerificationError(
                        .malformedJWS, "a signedPayload body holds a notification, expected a \(expected.rawValue)")
                }
                return try verifyItem(UnsafeBufferPointer(rebasing: buf[jws]), expected: .notification)
            }
            // Apple's POST body {"signedPayload": "..."} or a verifyReceipt request body {"receipt-data": "..."}.
            let isReceiptBody = Self.mentionsReceiptData(buf)
            if !isReceiptBody && buf.count > policy.maxInputBytes {
                throw VerificationError(
                    .payloadTooLarge, "input is \(buf.count) bytes; the limit is \(policy.maxInputBytes) bytes")
            }
            let body: JSONValue
            do { body = try JSONValue.parse(buf) } catch {
                let reason: RejectionReason = isReceiptBody ? .malformedReceipt : .malformedJWS
                throw VerificationError(reason, "input starts with '{' but is not valid JSON: \(error)")
            }
            guard case .object(let o) = body else { throw VerificationError(.malformedJWS, "JSON body is not an object") }
            if let sp = o["signedPayload"] {
                guard let jws = sp.stringValue else {
                    throw VerificationError(.malformedJWS, "signedPayload must be a string", field: "signedPayload")
                }
                if let expected, expected != .notification {
                    throw VerificationError(
                        .malformedJWS, "a signedPayload body holds a notification, expected a \(expected.rawValue)")
                }
                return try withUTF8Bytes(jws) { (b) throws(VerificationError) in
                    try verifyItem(b, expected: .notification)
                }
            }
            if let rd = o["receipt-data"] {
                guard let receipt = rd.stringValue else {
                    throw VerificationError(.malformedReceipt, "receipt-data must be a base64 string", field: "receipt-data")
                }
                try Self.requireReceiptExpected(expected)
                return try withUTF8Bytes(receipt) { (b) throws(VerificationError) in try verifyAnyReceipt(b) }
            }
            throw VerificationError(.malformedJWS, "JSON body has neither signedPayload nor receipt-data")
        }
        // The usual app receipt: one base64 line (the fast path, else decoded in one pass; the scan below only runs when
        // it does not decode).
        if expected == nil, buf.count >= 16, buf[0] == UInt8(ascii: "M"), buf[1] == UInt8(ascii: "I"),
            buf.count <= policy.maxReceiptBytes, let receipt = try verifyAppReceiptLine(buf)
        {
            return .appReceipt(receipt)
        }
        if Self.looksLikeLegacyReceipt(buf) {
            try Self.requireReceiptExpected(expected)
            return try verifyAnyReceipt(buf)
        }
        if buf.count > policy.maxInputBytes {
            throw VerificationError(.payloadTooLarge, "input is \(buf.count) bytes; the limit is \(policy.maxInputBytes) bytes")
        }
        return try verifyItem(buf, expected: expected)
    }

    static func requireReceiptExpected(_ expected: VerifiedItem.Kind?) throws(VerificationError) {
        if let expected {
            throw VerificationError(.malformedJWS, "input is a legacy app receipt, expected a \(expected.rawValue) JWS")
        }
    }

    /// An app receipt (`MI...`), or a StoreKit 1 transactionReceipt (base64 of `{ "signature" = ...`: `ew`).
    func verifyAnyReceipt(_ b: UnsafeBufferPointer<UInt8>) throws(VerificationError) -> VerifiedItem {
        var lo = 0
        while lo < b.count && Self.isSpace(b[lo]) { lo += 1 }
        if b.count - lo >= 2, b[lo] == UInt8(ascii: "e"), b[lo + 1] == UInt8(ascii: "w") {
            // Verified only with its issuer configured (TransactionReceipt.swift), else its own code.
            return .appReceipt(try verifyTransactionReceipt(base64: UnsafeBufferPointer(rebasing: b[lo...])))
        }
        return .appReceipt(try verifyAppReceipt(base64: b))
    }

    /// Whether a JSON body has a `"receipt-data"` key (so that its size bound is the receipt's, not the JWS one).
    static func mentionsReceiptData(_ b: UnsafeBufferPointer<UInt8>) -> Bool {
        let needle = Array("\"receipt-data\"".utf8)
        guard b.count >= needle.count else { return false }
        var i = 0
        while i + needle.count <= b.count {
            if b[i] == needle[0] {
                var k = 1
                while k < needle.count && b[i + k] == needle[k] { k += 1 }
                if k == needle.count { return true }
            }
            i += 1
        }
        return false
    }

    /// Legacy receipts: standard base64 (no '.') of a DER SEQUENCE, so they start with "MI"; StoreKit 1
    /// transactionReceipts are base64 of a '{'-plist, so they start with "ew".
    static func looksLikeLegacyReceipt(_ b: UnsafeBufferPointer<UInt8>) -> Bool {
        guard b.count >= 16 else { return false }
        guard (b[0] == UInt8(ascii: "M") && b[1] == UInt8(ascii: "I")) || (b[0] == UInt8(ascii: "e") && b[1] == UInt8(ascii: "w"))
        else { return false }
        for c in b {
            switch c {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "+"), UInt8(ascii: "/"), UInt8(ascii: "="),
                0x0A, 0x0D, 0x20, 0x09:
                continue
            default:
                return false
            }
        }
        return true
    }
}

/// A JSON body that is one JWS member and nothing else, in the form its senders write it: exactly `{"<name>":"`, one or
/// more characters of a compact JWS (base64url letters, digits, `-`, `_`, `.`), then `"}`. No escape, quote, space or
/// control character can be among those characters, so a JSON parse of such a body gives an object with that one
/// string member, the same bytes; `jws(in:)` reads it without the parse (Apple's notification bodies, the apps'
/// `/v1/transactions` bodies). Any other body (whitespace, other members, escapes) is nil and is parsed.
public enum SoleJWSBody: Sendable {
    case signedPayload
    case signedTransaction

    static let signedPayloadPrefix = Array("{\"signedPayload\":\"".utf8)
    static let signedTransactionPrefix = Array("{\"signedTransaction\":\"".utf8)

    /// The JWS's byte range in `body`, or nil when `body` is not exactly this form.
    public func jws(in body: UnsafeBufferPointer<UInt8>) -> Range<Int>? {
        let prefix = self == .signedPayload ? Self.signedPayloadPrefix : Self.signedTransactionPrefix
        let n = body.count
        guard n >= prefix.count + 3, body[n - 2] == UInt8(ascii: "\""), body[n - 1] == UInt8(ascii: "}"),
              body.starts(with: prefix)
        else { return nil }
        let range = prefix.count..<(n - 2)
        return Self.allJWSCharacters(body.baseAddress! + range.lowerBound, range.count) ? range : nil
    }

    /// Whether every byte is `A-Z a-z 0-9 - _ .`. Written without a branch per byte, a block at a time, so the
    /// compiler vectorizes it: a transaction's JWS is ~4.5 KB, and a byte-by-byte `switch` over it cost ~5 us a request.
    static func allJWSCharacters(_ p: UnsafePointer<UInt8>, _ count: Int) -> Bool {
        var i = 0
        while i < count {
            let end = min(i + 512, count)
            var bad: UInt8 = 0
            while i < end {
                let c = p[i]
                let letter = (c | 0x20) &- UInt8(ascii: "a") < 26  // 'A'...'Z' and 'a'...'z'
                let digit = c &- UInt8(ascii: "0") < 10
                let ok = letter || digit || c == UInt8(ascii: "-") || c == UInt8(ascii: "_") || c == UInt8(ascii: ".")
                bad |= ok ? 0 : 1
                i += 1
            }
            if bad != 0 { return false }
        }
        return true
    }
}
