import SwiftASN1

/// A strict-DER parse of a CMS / PKCS#7 `SignedData` (RFC 5652) as App Store receipts use it: one signer, the signed
/// content embedded (`id-data`), the signer's certificates in the certificate set.
///
/// Only the structure is read here; nothing is trusted. Every failure is `MALFORMED_RECEIPT` with what was wrong.
/// Bounds: at most `maxCertificates` certificates, exactly one SignerInfo, at most `maxSignedAttributes` signed
/// attributes; the whole input is already bounded by the policy's receipt size limit.
public struct PKCS7SignedData: Sendable {
    public struct AlgorithmIdentifier: Sendable, Hashable {
        public var oid: ASN1ObjectIdentifier
        /// The parameters' DER, nil when absent.
        public var parameters: [UInt8]?
    }

    public struct SignerInfo: Sendable {
        public var version: Int
        /// IssuerAndSerialNumber: the issuer Name's DER and the serial number's bytes (version 1).
        public var issuerDER: [UInt8]?
        public var serialNumber: [UInt8]?
        /// SubjectKeyIdentifier (version 3).
        public var subjectKeyIdentifier: [UInt8]?
        public var digestAlgorithm: AlgorithmIdentifier
        /// The signed attributes re-encoded as the DER `SET OF` the signature covers (RFC 5652 §5.4), nil when absent.
        public var signedAttributesDER: [UInt8]?
        /// (attribute type, the DER of each value) of the signed attributes.
        public var signedAttributes: [(ASN1ObjectIdentifier, [[UInt8]])]
        public var signatureAlgorithm: AlgorithmIdentifier
        public var signature: [UInt8]
    }

    public var version: Int
    public var digestAlgorithms: [AlgorithmIdentifier]
    public var contentType: ASN1ObjectIdentifier
    /// The embedded content's bytes (the eContent OCTET STRING's value).
    public var content: [UInt8]
    /// DER of every certificate of the certificate set, in order.
    public var certificates: [[UInt8]]
    /// The certificate set's exact encoding (the chain cache key), empty when absent.
    public var certificateSetDER: [UInt8]
    public var signerInfo: SignerInfo

    public static let maxCertificates = 10
    public static let maxSignedAttributes = 32

    public static let signedDataOID: ASN1ObjectIdentifier = [1, 2, 840, 113549, 1, 7, 2]
    public static let dataOID: ASN1ObjectIdentifier = [1, 2, 840, 113549, 1, 7, 1]
    public static let contentTypeAttributeOID: ASN1ObjectIdentifier = [1, 2, 840, 113549, 1, 9, 3]
    public static let messageDigestAttributeOID: ASN1ObjectIdentifier = [1, 2, 840, 113549, 1, 9, 4]

    static let tag0 = ASN1Identifier(tagWithNumber: 0, tagClass: .contextSpecific)
    static let tag1 = ASN1Identifier(tagWithNumber: 1, tagClass: .contextSpecific)

    static func fail(_ detail: String) -> VerificationError { VerificationError(.malformedReceipt, detail) }

    /// Parses DER bytes of a ContentInfo holding a SignedData.
    public init(der: [UInt8]) throws(VerificationError) {
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
