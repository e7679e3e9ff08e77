import SwiftASN1
@testable import AppStoreVerification

// The receipt parser as it was before the in-place walk (`StrictDER`): SwiftASN1's `DER.parse` of the whole
// container, then of the payload and every value. Kept here as the reference the new parser must agree with
// (StrictDERTests): same inputs accepted, same fields read.

/// A strict-DER parse of a CMS / PKCS#7 `SignedData` (RFC 5652) as App Store receipts use it: one signer, the signed
/// content embedded (`id-data`), the signer's certificates in the certificate set.
///
/// Only the structure is read here; nothing is trusted. Every failure is `MALFORMED_RECEIPT` with what was wrong.
/// Bounds: at most `maxCertificates` certificates, exactly one SignerInfo, at most `maxSignedAttributes` signed
/// attributes; the whole input is already bounded by the policy's receipt size limit.
struct ReferencePKCS7: Sendable {
    struct AlgorithmIdentifier: Sendable, Hashable {
        var oid: ASN1ObjectIdentifier
        /// The parameters' DER, nil when absent.
        var parameters: [UInt8]?
    }

    struct SignerInfo: Sendable {
        var version: Int
        /// IssuerAndSerialNumber: the issuer Name's DER and the serial number's bytes (version 1).
        var issuerDER: [UInt8]?
        var serialNumber: [UInt8]?
        /// SubjectKeyIdentifier (version 3).
        var subjectKeyIdentifier: [UInt8]?
        var digestAlgorithm: AlgorithmIdentifier
        /// The signed attributes re-encoded as the DER `SET OF` the signature covers (RFC 5652 §5.4), nil when absent.
        var signedAttributesDER: [UInt8]?
        /// (attribute type, the DER of each value) of the signed attributes.
        var signedAttributes: [(ASN1ObjectIdentifier, [[UInt8]])]
        var signatureAlgorithm: AlgorithmIdentifier
        var signature: [UInt8]
    }

    var version: Int
    var digestAlgorithms: [AlgorithmIdentifier]
    var contentType: ASN1ObjectIdentifier
    /// The embedded content's bytes (the eContent OCTET STRING's value).
    var content: [UInt8]
    /// DER of every certificate of the certificate set, in order.
    var certificates: [[UInt8]]
    /// The certificate set's exact encoding (the chain cache key), empty when absent.
    var certificateSetDER: [UInt8]
    var signerInfo: SignerInfo

    static let maxCertificates = 10
    static let maxSignedAttributes = 32

    static let signedDataOID: ASN1ObjectIdentifier = [1, 2, 840, 113549, 1, 7, 2]
    static let dataOID: ASN1ObjectIdentifier = [1, 2, 840, 113549, 1, 7, 1]
    static let contentTypeAttributeOID: ASN1ObjectIdentifier = [1, 2, 840, 113549, 1, 9, 3]
    static let messageDigestAttributeOID: ASN1ObjectIdentifier = [1, 2, 840, 113549, 1, 9, 4]

    static let tag0 = ASN1Identifier(tagWithNumber: 0, tagClass: .contextSpecific)
    static let tag1 = ASN1Identifier(tagWithNumber: 1, tagClass: .contextSpecific)

    static func fail(_ detail: String) -> VerificationError { VerificationError(.malformedReceipt, detail) }

    /// Parses DER bytes of a ContentInfo holding a SignedData.
    init(der: [UInt8]) throws(VerificationError) {
        let root: ASN1Node
        do { root = try DER.parse(der) } catch {
            if der.count >= 2 && der[0] == 0x30 && der[1] == 0x80 {
                throw Self.fail(
                    "receipt uses indefinite-length BER, not strict DER (Xcode StoreKit-testing receipts are BER and "
                        + "signed by a local certificate, never by Apple)")
            }
            throw Self.fail("receipt is not strict DER ASN.1: \(error)")
        }
        // ContentInfo ::= SEQUENCE { contentType OID, content [0] EXPLICIT ANY }
        var top = try Self.children(root, .sequence, "ContentInfo")
        let ct = try Self.oid(top.next(), "ContentInfo.contentType")
        guard ct == Self.signedDataOID else {
            throw Self.fail("ContentInfo content type is \(ct), not signedData (1.2.840.113549.1.7.2)")
        }
        var explicit = try Self.children(top.next(), Self.tag0, "ContentInfo.content [0]")
        try Self.end(&top, "ContentInfo")
        let sdNode = explicit.next()
        try Self.end(&explicit, "ContentInfo.content [0]")

        // SignedData ::= SEQUENCE { version, digestAlgorithms SET, encapContentInfo, [0] certificates, [1] crls,
        //                           signerInfos SET }
        var sd = try Self.children(sdNode, .sequence, "SignedData")
        self.version = try Self.smallInt(sd.next(), "SignedData.version")
        guard (1...5).contains(version) else { throw Self.fail("SignedData version \(version) is not 1...5") }
        var algs = try Self.children(sd.next(), .set, "SignedData.digestAlgorithms")
        var digestAlgorithms: [AlgorithmIdentifier] = []
        while let n = algs.next() {
            if digestAlgorithms.count >= 8 { throw Self.fail("more than 8 digest algorithms") }
            digestAlgorithms.append(try Self.algorithm(n, "SignedData.digestAlgorithms"))
        }
        self.digestAlgorithms = digestAlgorithms

        // EncapsulatedContentInfo ::= SEQUENCE { eContentType OID, eContent [0] EXPLICIT OCTET STRING OPTIONAL }
        var eci = try Self.children(sd.next(), .sequence, "encapContentInfo")
        self.contentType = try Self.oid(eci.next(), "encapContentInfo.eContentType")
        guard contentType == Self.dataOID else {
            throw Self.fail("signed content type is \(contentType), not id-data (1.2.840.113549.1.7.1)")
        }
        guard let eContentNode = eci.next() else {
            throw Self.fail("the SignedData has no embedded content (detached signatures are not receipts)")
        }
        var eContentWrap = try Self.children(eContentNode, Self.tag0, "eContent [0]")
        self.content = try Self.primitive(eContentWrap.next(), .octetString, "eContent OCTET STRING")
        try Self.end(&eContentWrap, "eContent [0]")
        try Self.end(&eci, "encapContentInfo")

        // Optional [0] IMPLICIT certificates and [1] IMPLICIT crls, then the signerInfos SET.
        var next = sd.next()
        var certificates: [[UInt8]] = []
        var certificateSetDER: [UInt8] = []
        if let n = next, n.identifier == Self.tag0 {
            guard case .constructed(let certs) = n.content else { throw Self.fail("certificates [0] is not constructed") }
            for c in certs {
                if certificates.count >= Self.maxCertificates {
                    throw Self.fail("more than \(Self.maxCertificates) certificates in the SignedData")
                }
                guard c.identifier == .sequence else {
                    throw Self.fail("a certificates entry is not an X.509 Certificate (attribute certificates are not supported)")
                }
                certificates.append(Array(c.encodedBytes))
            }
            certificateSetDER = Array(n.encodedBytes)
            next = sd.next()
        }
        if let n = next, n.identifier == Self.tag1 { next = sd.next() }  // CRLs: not used for receipts.
        self.certificates = certificates
        self.certificateSetDER = certificateSetDER

        var signers = try Self.children(next, .set, "SignedData.signerInfos")
        try Self.end(&sd, "SignedData")
        guard let signerNode = signers.next() else { throw Self.fail("the SignedData has no SignerInfo") }
        if signers.next() != nil { throw Self.fail("the SignedData has more than one SignerInfo; a receipt has exactly one") }
        self.signerInfo = try Self.signer(signerNode)
    }

    // MARK: - SignerInfo

    static func signer(_ node: ASN1Node) throws(VerificationError) -> SignerInfo {
        // SignerInfo ::= SEQUENCE { version, sid, digestAlgorithm, [0] signedAttrs OPTIONAL, signatureAlgorithm,
        //                           signature OCTET STRING, [1] unsignedAttrs OPTIONAL }
        var s = try children(node, .sequence, "SignerInfo")
        let version = try smallInt(s.next(), "SignerInfo.version")
        var issuerDER: [UInt8]?
        var serial: [UInt8]?
        var ski: [UInt8]?
        guard let sid = s.next() else { throw fail("SignerInfo has no sid") }
        if sid.identifier == .sequence {
            var ias = try children(sid, .sequence, "SignerInfo.sid")
            guard let issuer = ias.next(), issuer.identifier == .sequence else {
                throw fail("SignerInfo.sid issuer is not a Name")
            }
            issuerDER = Array(issuer.encodedBytes)
            serial = try primitive(ias.next(), .integer, "SignerInfo.sid serialNumber")
            try end(&ias, "SignerInfo.sid")
        } else if sid.identifier == tag0 {
            guard case .primitive(let bytes) = sid.content else { throw fail("SignerInfo.sid [0] is not primitive") }
            ski = Array(bytes)
        } else {
            throw fail("SignerInfo.sid is neither IssuerAndSerialNumber nor SubjectKeyIdentifier")
        }
        let digest = try algorithm(s.next(), "SignerInfo.digestAlgorithm")
        var n = s.next()
        var attrsDER: [UInt8]?
        var attrs: [(ASN1ObjectIdentifier, [[UInt8]])] = []
        if let a = n, a.identifier == tag0 {
            guard case .constructed(let items) = a.content else { throw fail("signedAttrs [0] is not constructed") }
            for item in items {
                if attrs.count >= maxSignedAttributes { throw fail("more than \(maxSignedAttributes) signed attributes") }
                var attr = try children(item, .sequence, "signed attribute")
                let type = try oid(attr.next(), "signed attribute type")
                var values = try children(attr.next(), .set, "signed attribute values")
                try end(&attr, "signed attribute")
                var vs: [[UInt8]] = []
                while let v = values.next() { vs.append(Array(v.encodedBytes)) }
                attrs.append((type, vs))
            }
            // The signature covers the DER of the attributes with the SET OF tag, not the [0] IMPLICIT tag.
            var bytes = Array(a.encodedBytes)
            bytes[0] = 0x31
            attrsDER = bytes
            n = s.next()
        }
        let sigAlg = try algorithm(n, "SignerInfo.signatureAlgorithm")
        let signature = try primitive(s.next(), .octetString, "SignerInfo.signature")
        if let u = s.next(), u.identifier != tag1 { throw fail("unexpected element after SignerInfo.signature") }
        try end(&s, "SignerInfo")
        return SignerInfo(
            version: version, issuerDER: issuerDER, serialNumber: serial, subjectKeyIdentifier: ski,
            digestAlgorithm: digest, signedAttributesDER: attrsDER, signedAttributes: attrs,
            signatureAlgorithm: sigAlg, signature: signature)
    }

    // MARK: - Node helpers

    static func children(
        _ node: ASN1Node?, _ id: ASN1Identifier, _ what: String
    ) throws(VerificationError) -> ASN1NodeCollection.Iterator {
        guard let node else { throw fail("\(what) is missing") }
        guard node.identifier == id else { throw fail("\(what) has tag \(node.identifier), expected \(id)") }
        guard case .constructed(let c) = node.content else { throw fail("\(what) is not constructed") }
        return c.makeIterator()
    }

    static func end(_ it: inout ASN1NodeCollection.Iterator, _ what: String) throws(VerificationError) {
        if it.next() != nil { throw fail("\(what) has unexpected trailing elements") }
    }

    static func primitive(_ node: ASN1Node?, _ id: ASN1Identifier, _ what: String) throws(VerificationError) -> [UInt8] {
        guard let node else { throw fail("\(what) is missing") }
        guard node.identifier == id else { throw fail("\(what) has tag \(node.identifier), expected \(id)") }
        guard case .primitive(let bytes) = node.content else { throw fail("\(what) is not primitive") }
        return Array(bytes)
    }

    static func oid(_ node: ASN1Node?, _ what: String) throws(VerificationError) -> ASN1ObjectIdentifier {
        guard let node else { throw fail("\(what) is missing") }
        do { return try ASN1ObjectIdentifier(derEncoded: node) } catch {
            throw fail("\(what) is not an OBJECT IDENTIFIER: \(error)")
        }
    }

    static func smallInt(_ node: ASN1Node?, _ what: String) throws(VerificationError) -> Int {
        guard let node else { throw fail("\(what) is missing") }
        do {
            let v = try Int(derEncoded: node)
            return v
        } catch {
            throw fail("\(what) is not a small INTEGER: \(error)")
        }
    }

    static func algorithm(_ node: ASN1Node?, _ what: String) throws(VerificationError) -> AlgorithmIdentifier {
        var a = try children(node, .sequence, what)
        let o = try oid(a.next(), "\(what).algorithm")
        let params = a.next().map { Array($0.encodedBytes) }
        try end(&a, what)
        return AlgorithmIdentifier(oid: o, parameters: params)
    }
}

/// The payload parse as it was (a `DER.parse` per SET and per value).
enum ReferenceReceipt {
    static func fail(_ detail: String) -> VerificationError { VerificationError(.malformedReceipt, detail) }

    /// The attribute count of one receipt parse (bounded by `maxAttributes` over the receipt and its entries).
    final class Budget {
        var n = 0
    }

    /// Parses the receipt content (strict DER). Unknown attribute types are ignored, as Apple documents.
    static func parse(content: [UInt8]) throws(VerificationError) -> AppReceipt {
        var receipt = AppReceipt()
        let count = Budget()
        try ReferenceReceipt.attributes(content, "receipt payload", count: count) { (type, value) throws(VerificationError) in
            switch type {
            case 0: receipt.receiptType = try ReferenceReceipt.string(value, "field 0 (receipt type)")
            case 1: receipt.appAppleId = try ReferenceReceipt.integer(value, "field 1 (app item id)")
            case 2: receipt.bundleId = try ReferenceReceipt.string(value, "field 2 (bundle id)")
            case 3: receipt.applicationVersion = try ReferenceReceipt.string(value, "field 3 (application version)")
            case 12: receipt.receiptCreationDate = try ReferenceReceipt.date(value, "field 12 (receipt creation date)")
            case 19: receipt.originalApplicationVersion = try ReferenceReceipt.string(value, "field 19 (original application version)")
            case 21: receipt.receiptExpirationDate = try ReferenceReceipt.date(value, "field 21 (receipt expiration date)")
            case 17:
                if receipt.inApp.count >= AppReceipt.maxInAppEntries {
                    throw ReferenceReceipt.fail("more than \(AppReceipt.maxInAppEntries) in-app entries")
                }
                receipt.inApp.append(try ReferenceReceipt.inAppEntry(value, index: receipt.inApp.count, count: count))
            default: break
            }
        }
        return receipt
    }

    static func inAppEntry(_ bytes: [UInt8], index: Int, count: Budget) throws(VerificationError) -> AppReceiptInApp {
        var e = AppReceiptInApp()
        try attributes(bytes, "in_app[\(index)]", count: count) { (type, v) throws(VerificationError) in
            switch type {
            case 1701: e.quantity = try integer(v, "in_app[\(index)] field 1701 (quantity)")
            case 1702: e.productId = try string(v, "in_app[\(index)] field 1702 (product id)")
            case 1703: e.transactionId = try string(v, "in_app[\(index)] field 1703 (transaction id)")
            case 1704: e.purchaseDate = try date(v, "in_app[\(index)] field 1704 (purchase date)")
            case 1705: e.originalTransactionId = try string(v, "in_app[\(index)] field 1705 (original transaction id)")
            case 1706: e.originalPurchaseDate = try date(v, "in_app[\(index)] field 1706 (original purchase date)")
            case 1707: e.productType = try integer(v, "in_app[\(index)] field 1707 (product type)")
            case 1708: e.expiresDate = try date(v, "in_app[\(index)] field 1708 (expires date)")
            case 1711: e.webOrderLineItemId = try integer(v, "in_app[\(index)] field 1711 (web order line item id)")
            case 1712: e.cancellationDate = try date(v, "in_app[\(index)] field 1712 (cancellation date)")
            case 1713: e.isTrialPeriod = try integer(v, "in_app[\(index)] field 1713 (is trial period)").map { $0 != 0 }
            case 1719: e.isInIntroOfferPeriod = try integer(v, "in_app[\(index)] field 1719 (intro offer period)").map { $0 != 0 }
            case 1721: e.promotionalOfferId = try string(v, "in_app[\(index)] field 1721 (promotional offer id)")
            default: break
            }
        }
        return e
    }

    /// Walks a DER `SET OF SEQUENCE { type INTEGER, version INTEGER, value OCTET STRING }`.
    static func attributes(
        _ bytes: [UInt8], _ what: @autoclosure () -> String, count: Budget,
        _ body: (Int, [UInt8]) throws(VerificationError) -> Void
    ) throws(VerificationError) {
        let root: ASN1Node
        do { root = try DER.parse(bytes) } catch { throw fail("\(what()) is not strict DER ASN.1: \(error)") }
        guard root.identifier == .set, case .constructed(let items) = root.content else {
            throw fail("\(what()) is not an ASN.1 SET of attributes")
        }
        for item in items {
            count.n += 1
            if count.n > AppReceipt.maxAttributes { throw fail("more than \(AppReceipt.maxAttributes) receipt attributes") }
            guard item.identifier == .sequence, case .constructed(let fields) = item.content else {
                throw fail("\(what()): an attribute is not a SEQUENCE")
            }
            var it = fields.makeIterator()
            let type: Int
            do {
                guard let t = it.next() else { throw fail("\(what()): an attribute has no type") }
                type = try Int(derEncoded: t)
                guard let ver = it.next() else { throw fail("\(what()): attribute \(type) has no version") }
                _ = try Int(derEncoded: ver)
            } catch let e as VerificationError {
                throw e
            } catch {
                throw fail("\(what()): an attribute's type or version is not an INTEGER")
            }
            guard let value = it.next(), value.identifier == .octetString, case .primitive(let v) = value.content else {
                throw fail("\(what()): attribute \(type) has no OCTET STRING value")
            }
            if it.next() != nil { throw fail("\(what()): attribute \(type) has trailing elements") }
            try body(type, Array(v))
        }
    }

    static func node(_ bytes: [UInt8], _ what: @autoclosure () -> String) throws(VerificationError) -> ASN1Node {
        do { return try DER.parse(bytes) } catch { throw fail("\(what()) is not strict DER ASN.1: \(error)") }
    }

    /// A UTF8String / IA5String / PrintableString value.
    static func string(_ bytes: [UInt8], _ what: @autoclosure () -> String) throws(VerificationError) -> String {
        let n = try node(bytes, what())
        guard n.identifier == .utf8String || n.identifier == .ia5String || n.identifier == .printableString,
            case .primitive(let p) = n.content
        else { throw fail("\(what()) is not a string (tag \(n.identifier))") }
        guard let s = String(validating: p, as: UTF8.self) else { throw fail("\(what()) is not valid UTF-8") }
        return s
    }

    static func integer(_ bytes: [UInt8], _ what: @autoclosure () -> String) throws(VerificationError) -> Int64? {
        let n = try node(bytes, what())
        do { return try Int64(derEncoded: n) } catch { throw fail("\(what()) is not a 64-bit INTEGER") }
    }

    /// An IA5String RFC 3339 date; empty = absent.
    static func date(_ bytes: [UInt8], _ what: @autoclosure () -> String) throws(VerificationError) -> Int64? {
        let s = try string(bytes, what())
        if s.isEmpty { return nil }
        guard let ms = ReceiptDate.parse(s) else { throw fail("\(what()) is not an RFC 3339 date: \(s)") }
        return ms
    }
}
