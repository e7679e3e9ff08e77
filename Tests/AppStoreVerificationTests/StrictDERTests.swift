@testable import AppStoreVerification
import FleetTestPKI
import Foundation
import SwiftASN1
import Testing

/// The in-place receipt parser (`StrictDER`, `PKCS7SignedData`, `AppReceipt(content:)`) against SwiftASN1: the same
/// inputs accepted and the same fields read as the `DER.parse`-based parser it replaced (`ReferenceReceiptParser`),
/// on the real receipts, generated ones and thousands of mutations of them; and `StrictDER`'s TLV rules against
/// `DER.parse` on random short inputs built from the bytes that matter to DER (tags, lengths, end-of-contents).
@Suite struct StrictDERTests {
    /// What a parse read, comparable across the two parsers.
    struct Parsed: Equatable, CustomStringConvertible {
        var content: [UInt8]
        var certificates: [[UInt8]]
        var certificateSet: [UInt8]
        var issuer: [UInt8]?
        var serial: [UInt8]?
        var ski: [UInt8]?
        var algorithms: [[UInt8]]
        var signedAttributesDER: [UInt8]?
        var signedAttributes: [[UInt8]]
        var signature: [UInt8]
        var receipt: AppReceipt
        var description: String { "receipt \(receipt.bundleId ?? "-") with \(receipt.inApp.count) entries" }
    }

    static func oidDER(_ oid: ASN1ObjectIdentifier) -> [UInt8] {
        var s = DER.Serializer()
        try! s.serialize(oid)
        return s.serializedBytes
    }

    static func reference(_ der: [UInt8]) -> Parsed? {
        guard let p = try? ReferencePKCS7(der: der), let r = try? ReferenceReceipt.parse(content: p.content) else { return nil }
        let si = p.signerInfo
        var algorithms = p.digestAlgorithms.map { oidDER($0.oid) + ($0.parameters ?? [0xEE]) }
        algorithms.append(oidDER(si.digestAlgorithm.oid) + (si.digestAlgorithm.parameters ?? [0xEE]))
        algorithms.append(oidDER(si.signatureAlgorithm.oid) + (si.signatureAlgorithm.parameters ?? [0xEE]))
        return Parsed(
            content: p.content, certificates: p.certificates, certificateSet: p.certificateSetDER, issuer: si.issuerDER,
            serial: si.serialNumber, ski: si.subjectKeyIdentifier, algorithms: algorithms,
            signedAttributesDER: si.signedAttributesDER,
            signedAttributes: si.signedAttributes.flatMap { [oidDER($0.0)] + $0.1 }, signature: si.signature, receipt: r)
    }

    static func current(_ der: [UInt8]) -> Parsed? {
        guard let p = try? PKCS7SignedData(der: der), (try? p.validateCertificates()) != nil,
            let r = try? AppReceipt(content: p.content)
        else { return nil }
        let si = p.signerInfo
        var algorithms = p.digestAlgorithms.map { Array($0.oid.der) + ($0.parameters.map(Array.init) ?? [0xEE]) }
        algorithms.append(Array(si.digestAlgorithm.oid.der) + (si.digestAlgorithm.parameters.map(Array.init) ?? [0xEE]))
        algorithms.append(Array(si.signatureAlgorithm.oid.der) + (si.signatureAlgorithm.parameters.map(Array.init) ?? [0xEE]))
        return Parsed(
            content: Array(p.content), certificates: p.certificates.map(Array.init),
            certificateSet: Array(p.certificateSetDER), issuer: si.issuerDER.map(Array.init),
            serial: si.serialNumber.map(Array.init), ski: si.subjectKeyIdentifier.map(Array.init), algorithms: algorithms,
            signedAttributesDER: si.signedAttributesDER,
            signedAttributes: si.signedAttributes.flatMap { [Array($0.0.der)] + $0.1.map(Array.init) },
            signature: Array(si.signature), receipt: r)
    }

    static func generated() throws -> [(String, [UInt8])] {
        let pki = ReceiptFixtures.pki
        var out: [(String, [UInt8])] = []
        for (digest, attrs) in [(TestReceiptPKI.Digest.sha1, false), (.sha256, false), (.sha256, true)] {
            out.append(("generated \(digest) attrs=\(attrs)", try pki.sign(ReceiptFixtures.receipt(), digest: digest, signedAttributes: attrs)))
        }
        out.append(("generated, 0 entries", try pki.sign(ReceiptFixtures.receipt(entries: 0))))
        return out
    }

    static func fixtures() throws -> [(String, [UInt8])] {
        guard AppleReceipts.available else { return [] }
        return try ["production-subscriptions.b64", "sandbox-consumable.b64", "sandbox-sha1-many.b64"].map {
            ($0, try AppleReceipts.der($0))
        }
    }

    @Test func unmodifiedReceiptsReadTheSame() throws {
        let inputs = try Self.generated() + Self.fixtures()
        for (name, der) in inputs {
            let ref = Self.reference(der)
            #expect(ref != nil, "\(name): the reference parser rejects it")
            #expect(Self.current(der) == ref, "\(name)")
        }
        // The Xcode receipt (BER) is refused by both.
        if AppleReceipts.available {
            let xcode = try AppleReceipts.der("xcode.b64")
            #expect(Self.reference(xcode) == nil && Self.current(xcode) == nil)
        }
    }

    @Test func mutationsAreAcceptedAndReadExactlyAsBefore() throws {
        var rng = SplitMix(seed: 2026)
        var agreedAccepted = 0
        var agreedRejected = 0
        for (name, der) in try Self.generated() + Self.fixtures() {
            let rounds = der.count > 20_000 ? 60 : 700
            for round in 0..<rounds {
                var d = der
                switch round % 5 {
                case 0:  // one byte anywhere
                    d[Int(rng.next() % UInt64(d.count))] = UInt8(truncatingIfNeeded: rng.next())
                case 1:  // a header byte near the start (lengths and tags of the container)
                    d[Int(rng.next() % UInt64(min(d.count, 80)))] = UInt8(truncatingIfNeeded: rng.next())
                case 2:  // truncation
                    d = Array(d[0..<Int(rng.next() % UInt64(d.count))])
                case 3:  // one byte inserted
                    d.insert(UInt8(truncatingIfNeeded: rng.next()), at: Int(rng.next() % UInt64(d.count)))
                default:  // a byte of the signed content (the receipt attribute SET), +-1 (lengths, tags, dates)
                    let at = Int(rng.next() % UInt64(d.count / 2)) + d.count / 4
                    d[at] = rng.next() % 2 == 0 ? d[at] &+ 1 : d[at] &- 1
                }
                let ref = Self.reference(d)
                let cur = Self.current(d)
                if cur != ref { Issue.record("\(name) mutation \(round): \(String(describing: cur)) vs \(String(describing: ref))") }
                if ref == nil { agreedRejected += 1 } else { agreedAccepted += 1 }
            }
        }
        // Both outcomes were exercised.
        #expect(agreedAccepted > 50)
        #expect(agreedRejected > 50)
    }

    /// Random short inputs over the bytes that matter to DER's TLV rules: `StrictDER` (root + full validation)
    /// accepts exactly what `DER.parse` accepts.
    @Test func tlvRulesMatchSwiftASN1() {
        let alphabet: [UInt8] = [
            0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x1F, 0x1E, 0x20, 0x30, 0x31, 0x3F, 0x7F, 0x80, 0x81, 0x82, 0x83, 0x84,
            0x88, 0x89, 0xA0, 0xA1, 0xBF, 0xFF, 0x9F, 0x5F, 0xDF,
        ]
        var rng = SplitMix(seed: 15)
        var accepted = 0
        for _ in 0..<30_000 {
            let n = 1 + Int(rng.next() % 10)
            let bytes = (0..<n).map { _ in
                rng.next() % 4 == 0 ? UInt8(truncatingIfNeeded: rng.next()) : alphabet[Int(rng.next() % UInt64(alphabet.count))]
            }
            let swiftASN1 = (try? DER.parse(bytes)) != nil
            let strict = bytes.withUnsafeBufferPointer { b in
                (try? { () throws(StrictDER.Failure) in try StrictDER.validate(StrictDER.root(b), in: b) }()) != nil
            }
            if strict != swiftASN1 { Issue.record("StrictDER \(strict), DER.parse \(swiftASN1): \(bytes.map { String($0, radix: 16) })") }
            if swiftASN1 { accepted += 1 }
        }
        #expect(accepted > 150)
    }

    @Test func namedRules() {
        func accepts(_ bytes: [UInt8]) -> Bool {
            bytes.withUnsafeBufferPointer { b in
                (try? { () throws(StrictDER.Failure) in try StrictDER.validate(StrictDER.root(b), in: b) }()) != nil
            }
        }
        let cases: [([UInt8], Bool)] = [
            ([0x30, 0x03, 0x02, 0x01, 0x05], true),
            ([0x30, 0x80, 0x02, 0x01, 0x05, 0x00, 0x00], false),  // indefinite length (BER)
            ([0x30, 0x81, 0x03, 0x02, 0x01, 0x05], false),  // long form for a length below 128
            ([0x04, 0x82, 0x00, 0x80] + [UInt8](repeating: 0, count: 128), false),  // leading zero length octet
            ([0x04, 0x81, 0x80] + [UInt8](repeating: 0, count: 128), true),
            ([0x1F, 0x05, 0x00], false),  // long-form tag for a number below 31
            ([0x1F, 0x1F, 0x00], true),
            ([0x1F, 0x80, 0x1F, 0x00], false),  // long-form tag with a leading 0x80
            ([0x00, 0x00], false),  // end-of-contents
            ([0x02, 0x01, 0x05, 0x00], false),  // trailing data
            ([0x30, 0x04, 0x02, 0x01], false),  // truncated
        ]
        for (bytes, ok) in cases {
            #expect(accepts(bytes) == ok, "\(bytes.prefix(8).map { String($0, radix: 16) })")
            #expect(((try? DER.parse(bytes)) != nil) == ok)
        }
        // 50 levels are allowed, 51 are not (DER.parse's bound).
        func nested(_ levels: Int) -> [UInt8] {
            var d: [UInt8] = [0x05, 0x00]
            for _ in 1..<levels { d = [0x30, UInt8(d.count)] + d }
            return d
        }
        #expect(accepts(nested(50)) && (try? DER.parse(nested(50))) != nil)
        #expect(!accepts(nested(51)) && (try? DER.parse(nested(51))) == nil)
    }

    @Test func integersAndIdentifiersFollowSwiftASN1() {
        var rng = SplitMix(seed: 7)
        for _ in 0..<20_000 {
            let n = Int(rng.next() % 10)
            let content = (0..<n).map { _ in
                rng.next() % 3 == 0 ? [0x00, 0xFF, 0x80, 0x7F][Int(rng.next() % 4)] : UInt8(truncatingIfNeeded: rng.next())
            }
            let intTLV: [UInt8] = [0x02, UInt8(n)] + content
            let ref = try? Int64(derEncoded: intTLV)
            let mine = content.withUnsafeBufferPointer { StrictDER.int64($0, 0..<n) }
            if mine != ref { Issue.record("INTEGER \(content): \(String(describing: mine)) vs \(String(describing: ref))") }
            let oidTLV: [UInt8] = [0x06, UInt8(n)] + content
            let refOID = (try? ASN1ObjectIdentifier(derEncoded: oidTLV)) != nil
            if content.withUnsafeBufferPointer({ StrictDER.isValidOID($0, 0..<n) }) != refOID { Issue.record("OID \(content)") }
        }
    }

    @Test func datesParseFromBytesAsFromStrings() {
        for s in ["2015-08-13T07:50:46Z", "2020-07-22T18:33:15+0100", "2024-02-23T17:27:16.123Z", "2024-02-30T00:00:00-07:00", "x", ""] {
            let fromBytes = Array(s.utf8).withUnsafeBufferPointer { ReceiptDate.parse($0) }
            #expect(fromBytes == ReceiptDate.parse(s))
        }
        #expect(ReceiptDate.parse("2015-08-13T07:50:46Z") == 1_439_452_246_000)
        #expect(ReceiptDate.parse("2020-07-22T18:33:15+0100") == 1_595_439_195_000)
    }

    /// Random civil times agree with Foundation's ISO 8601 parser; any non-digit in a digit position, and any
    /// out-of-range field, is refused.
    @Test func datesAgreeWithFoundationAndRefuseNonDigits() {
        let iso = ISO8601DateFormatter()
        var rng = SplitMix(seed: 77)
        func two(_ v: UInt64) -> String { v < 10 ? "0\(v)" : "\(v)" }
        for _ in 0..<2_000 {
            let s = "\(1970 + rng.next() % 130)-\(two(1 + rng.next() % 12))-\(two(1 + rng.next() % 28))T"
                + "\(two(rng.next() % 24)):\(two(rng.next() % 60)):\(two(rng.next() % 60))Z"
            guard let date = iso.date(from: s) else { Issue.record("Foundation refused \(s)"); continue }
            #expect(ReceiptDate.parse(s) == Int64((date.timeIntervalSince1970 * 1000).rounded()), "\(s)")
            var bytes = Array(s.utf8)
            let at = [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18][Int(rng.next() % 14)]
            bytes[at] = [UInt8(ascii: "/"), UInt8(ascii: ":"), UInt8(ascii: "a"), 0x00, 0xFF, UInt8(ascii: " ")][Int(rng.next() % 6)]
            #expect(bytes.withUnsafeBufferPointer { ReceiptDate.parse($0) } == nil, "\(bytes)")
        }
        for bad in ["2015-13-13T07:50:46Z", "2015-00-13T07:50:46Z", "2015-08-32T07:50:46Z", "2015-08-00T07:50:46Z",
                    "2015-08-13T24:50:46Z", "2015-08-13T07:60:46Z", "2015-08-13T07:50:61Z"] {
            #expect(ReceiptDate.parse(bad) == nil, "\(bad)")
        }
    }
}
