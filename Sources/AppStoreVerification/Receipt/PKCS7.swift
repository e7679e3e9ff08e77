import SwiftASN1

/// A strict-DER parse of a CMS / PKCS#7 `SignedData` (RFC 5652) as App Store receipts use it: one signer, the signed
/// content embedded (`id-data`), the signer's certificates in the certificate set.
///
/// Only the structure is read here; nothing is trusted. Every failure is `MALFORMED_RECEIPT` with what was wrong.
/// Bounds: at most `maxCertificates` certificates, exactly one SignerInfo, at most `maxSignedAttributes` signed
/// attributes; the whole input is already bounded by the policy's receipt size limit.
///
/// The walk (`StrictDER`) reads the elements in place and keeps slices of the input, no copies. Every element is
/// checked by DER's rules except the inside of the certificates, which `validateCertificates()` checks when they are
/// about to be used (a verified-chain cache hit means these exact bytes were checked before).
public struct PKCS7SignedData: Sendable {
    /// An OBJECT IDENTIFIER as its DER encoding (tag, length, content), validated; compared without decoding.
    public struct OID: Hashable, Sendable, CustomStringConvertible {
        public let der: ArraySlice<UInt8>

        init(der: ArraySlice<UInt8>) { self.der = der }

        /// The encoding of a known identifier.
        public init(_ oid: ASN1ObjectIdentifier) {
            var s = DER.Serializer()
            try! s.serialize(oid)  // A literal identifier always serialises.
            self.der = s.serializedBytes[...]
        }

        public var description: String {
            (try? ASN1ObjectIdentifier(derEncoded: der)).map { "\($0)" } ?? "(invalid OID)"
        }
    }

    public struct AlgorithmIdentifier: Sendable, Hashable {
        public var oid: OID
        /// The parameters' DER, nil when absent.
        public var parameters: ArraySlice<UInt8>?
    }

    public struct SignerInfo: Sendable {
        public var version: Int
        /// IssuerAndSerialNumber: the issuer Name's DER and the serial number's content octets (version 1).
        public var issuerDER: ArraySlice<UInt8>?
        public var serialNumber: ArraySlice<UInt8>?
        /// SubjectKeyIdentifier (version 3).
        public var subjectKeyIdentifier: ArraySlice<UInt8>?
        public var digestAlgorithm: AlgorithmIdentifier
        /// The signed attributes re-encoded as the DER `SET OF` the signature covers (RFC 5652 §5.4), nil when absent.
        public var signedAttributesDER: [UInt8]?
        /// (attribute type, the DER of each value) of the signed attributes.
        public var signedAttributes: [(OID, [ArraySlice<UInt8>])]
        public var signatureAlgorithm: AlgorithmIdentifier
        public var signature: ArraySlice<UInt8>
    }

    /// The whole input.
    public let der: [UInt8]
    public var version: Int
    public var digestAlgorithms: [AlgorithmIdentifier]
    /// The embedded content's bytes (the eContent OCTET STRING's value).
    public var content: ArraySlice<UInt8>
    /// DER of every certificate of the certificate set, in order (their insides not yet validated).
    public var certificates: [ArraySlice<UInt8>]
    /// The certificate set's exact encoding (the chain cache key), empty when absent.
    public var certificateSetDER: ArraySlice<UInt8>
    public var signerInfo: SignerInfo

    public static let maxCertificates = 10
    public static let maxSignedAttributes = 32

    public static let signedDataOID = OID([1, 2, 840, 113549, 1, 7, 2])
    public static let dataOID = OID([1, 2, 840, 113549, 1, 7, 1])
    public static let contentTypeAttributeOID = OID([1, 2, 840, 113549, 1, 9, 3])
    public static let messageDigestAttributeOID = OID([1, 2, 840, 113549, 1, 9, 4])

    typealias Tag = StrictDER.Tag
    typealias Element = StrictDER.Element
    typealias Bytes = UnsafeBufferPointer<UInt8>

    static func fail(_ detail: String) -> VerificationError { VerificationError(.malformedReceipt, detail) }

    static func fail(_ f: StrictDER.Failure, _ what: @autoclosure () -> String) -> VerificationError {
        if f == .indefiniteLength {
            return fail(
                "\(what()) uses indefinite-length BER, not strict DER (Xcode StoreKit-testing receipts are BER and "
                    + "signed by a local certificate, never by Apple)")
        }
        return fail("\(what()) is not strict DER ASN.1: \(f)")
    }

    /// Parses DER bytes of a ContentInfo holding a SignedData.
    public init(der: [UInt8]) throws(VerificationError) {
        try self.init(der: der, skippingCertificates: false)
    }

    /// With `skippingCertificates`, the certificate set's elements are not read (`certificates` is empty and the
    /// set's bytes need not be there): the receipt fast path, for a set whose exact bytes are known to have been
    /// walked and validated before (a chain-cache hit).
    init(der: [UInt8], skippingCertificates: Bool) throws(VerificationError) {
        self.der = der
        let parsed = try der.withUnsafeBufferPointer { (b) throws(VerificationError) in
            try Self.walk(b, skippingCertificates: skippingCertificates)
        }
        version = parsed.version
        digestAlgorithms = parsed.digestAlgorithms.map { Self.algorithm(der, $0) }
        content = der[parsed.content]
        certificates = parsed.certificates.map { der[$0] }
        certificateSetDER = der[parsed.certificateSet]
        let si = parsed.signer
        var attrsDER: [UInt8]?
        if let r = si.signedAttributes {
            // The signature covers the DER of the attributes with the SET OF tag, not the [0] IMPLICIT tag.
            var bytes = Array(der[r])
            bytes[0] = 0x31
            attrsDER = bytes
        }
        signerInfo = SignerInfo(
            version: si.version, issuerDER: si.issuer.map { der[$0] }, serialNumber: si.serial.map { der[$0] },
            subjectKeyIdentifier: si.ski.map { der[$0] }, digestAlgorithm: Self.algorithm(der, si.digest),
            signedAttributesDER: attrsDER,
            signedAttributes: si.attributes.map { (OID(der: der[$0.type]), $0.values.map { der[$0] }) },
            signatureAlgorithm: Self.algorithm(der, si.signatureAlgorithm), signature: der[si.signature])
    }

    /// Checks the inside of every certificate by DER's rules (before they are parsed as X.509 certificates).
    public func validateCertificates() throws(VerificationError) {
        try der.withUnsafeBufferPointer { (b) throws(VerificationError) in
            for (i, c) in certificates.enumerated() {
                // Certificates sit at depth 5: ContentInfo, [0], SignedData, [0] certificates, Certificate.
                do throws(StrictDER.Failure) {
                    let e = try StrictDER.element(b, at: c.startIndex, limit: c.endIndex, depth: 5)
                    try StrictDER.validate(e, in: b)
                } catch {
                    throw Self.fail(error, "certificate \(i) of the SignedData")
                }
            }
        }
    }

    // MARK: - The walk (ranges into the input)

    struct AlgorithmRanges {
        var oid: Range<Int>
        var parameters: Range<Int>?
    }

    struct SignerRanges {
        var version: Int
        var issuer: Range<Int>?
        var serial: Range<Int>?
        var ski: Range<Int>?
        var digest: AlgorithmRanges
        var signedAttributes: Range<Int>?
        var attributes: [(type: Range<Int>, values: [Range<Int>])]
        var signatureAlgorithm: AlgorithmRanges
        var signature: Range<Int>
    }

    struct Ranges {
        var version: Int
        var digestAlgorithms: [AlgorithmRanges]
        var content: Range<Int>
        var certificates: [Range<Int>]
        var certificateSet: Range<Int>
        var signer: SignerRanges
    }

    static func algorithm(_ der: [UInt8], _ r: AlgorithmRanges) -> AlgorithmIdentifier {
        AlgorithmIdentifier(oid: OID(der: der[r.oid]), parameters: r.parameters.map { der[$0] })
    }

    /// A cursor with the name of the level it reads, for the failure details.
    struct Level {
        var cursor: StrictDER.Cursor
        let what: String

        mutating func next() throws(VerificationError) -> Element? {
            do { return try cursor.next() } catch { throw PKCS7SignedData.fail(error, "an element of \(what)") }
        }

        func end() throws(VerificationError) {
            if !cursor.isAtEnd { throw PKCS7SignedData.fail("\(what) has unexpected trailing elements") }
        }
    }

    static func walk(_ b: Bytes, skippingCertificates: Bool = false) throws(VerificationError) -> Ranges {
        let root: Element
        do { root = try StrictDER.root(b) } catch { throw fail(error, "receipt") }
        // ContentInfo ::= SEQUENCE { contentType OID, content [0] EXPLICIT ANY }
        var top = try children(b, root, .sequence, "ContentInfo")
        let ct = try oid(b, top.next(), "ContentInfo.contentType")
        guard matches(b, ct, signedDataOID) else {
            throw fail("ContentInfo content type is \(OID(der: Array(b[ct])[...])), not signedData (1.2.840.113549.1.7.2)")
        }
        var explicit = try children(b, top.next(), .context0, "ContentInfo.content [0]")
        try top.end()
        let sdNode = try explicit.next()
        try explicit.end()

        // SignedData ::= SEQUENCE { version, digestAlgorithms SET, encapContentInfo, [0] certificates, [1] crls,
        //                           signerInfos SET }
        var sd = try children(b, sdNode, .sequence, "SignedData")
        let version = try smallInt(b, sd.next(), "SignedData.version")
        guard (1...5).contains(version) else { throw fail("SignedData version \(version) is not 1...5") }
        var algs = try children(b, sd.next(), .set, "SignedData.digestAlgorithms")
        var digestAlgorithms: [AlgorithmRanges] = []
        while let n = try algs.next() {
            if digestAlgorithms.count >= 8 { throw fail("more than 8 digest algorithms") }
            digestAlgorithms.append(try algorithm(b, n, "SignedData.digestAlgorithms"))
        }

        // EncapsulatedContentInfo ::= SEQUENCE { eContentType OID, eContent [0] EXPLICIT OCTET STRING OPTIONAL }
        var eci = try children(b, sd.next(), .sequence, "encapContentInfo")
        let ect = try oid(b, eci.next(), "encapContentInfo.eContentType")
        guard matches(b, ect, dataOID) else {
            throw fail("signed content type is \(OID(der: Array(b[ect])[...])), not id-data (1.2.840.113549.1.7.1)")
        }
        guard let eContentNode = try eci.next() else {
            throw fail("the SignedData has no embedded content (detached signatures are not receipts)")
        }
        var eContentWrap = try children(b, eContentNode, .context0, "eContent [0]")
        let content = try primitive(eContentWrap.next(), .octetString, "eContent OCTET STRING")
        try eContentWrap.end()
        try eci.end()

        // Optional [0] IMPLICIT certificates and [1] IMPLICIT crls, then the signerInfos SET.
        var next = try sd.next()
        var certificates: [Range<Int>] = []
        var certificateSet = 0..<0
        if let n = next, n.tag == .context0 {
            guard n.isConstructed else { throw fail("certificates [0] is not constructed") }
            var certs = StrictDER.children(n, in: b)
            while !skippingCertificates {
                let c: Element?
                do { c = try certs.next() } catch { throw fail(error, "the certificate set") }
                guard let c else { break }
                if certificates.count >= maxCertificates {
                    throw fail("more than \(maxCertificates) certificates in the SignedData")
                }
                guard c.tag == .sequence else {
                    throw fail("a certificates entry is not an X.509 Certificate (attribute certificates are not supported)")
                }
                certificates.append(c.encoded)
            }
            certificateSet = n.encoded
            next = try sd.next()
        }
        if let n = next, n.tag == .context1 {  // CRLs: not used for receipts, but DER all the same.
            try validate(b, n, "crls [1]")
            next = try sd.next()
        }
        var signers = try children(b, next, .set, "SignedData.signerInfos")
        try sd.end()
        guard let signerNode = try signers.next() else { throw fail("the SignedData has no SignerInfo") }
        if try signers.next() != nil { throw fail("the SignedData has more than one SignerInfo; a receipt has exactly one") }
        return Ranges(
            version: version, digestAlgorithms: digestAlgorithms, content: content, certificates: certificates,
            certificateSet: certificateSet, signer: try signer(b, signerNode, validatingIssuer: !skippingCertificates))
    }

    // MARK: - SignerInfo

    /// `validatingIssuer: false` (the receipt fast path only): the sid's issuer Name is not validated inside, because
    /// its exact bytes are part of the fast path's cache key, a hit means the full path validated those very bytes,
    /// and a miss goes through the full path.
    static func signer(_ b: Bytes, _ node: Element, validatingIssuer: Bool = true) throws(VerificationError) -> SignerRanges {
        // SignerInfo ::= SEQUENCE { version, sid, digestAlgorithm, [0] signedAttrs OPTIONAL, signatureAlgorithm,
        //                           signature OCTET STRING, [1] unsignedAttrs OPTIONAL }
        var s = try children(b, node, .sequence, "SignerInfo")
        let version = try smallInt(b, s.next(), "SignerInfo.version")
        var issuer: Range<Int>?
        var serial: Range<Int>?
        var ski: Range<Int>?
        guard let sid = try s.next() else { throw fail("SignerInfo has no sid") }
        if sid.tag == .sequence {
            var ias = try children(b, sid, .sequence, "SignerInfo.sid")
            guard let name = try ias.next(), name.tag == .sequence else {
                throw fail("SignerInfo.sid issuer is not a Name")
            }
            if validatingIssuer { try validate(b, name, "SignerInfo.sid issuer") }
            issuer = name.encoded
            serial = try primitive(ias.next(), .integer, "SignerInfo.sid serialNumber")
            try ias.end()
        } else if sid.tag == .context0 {
            guard !sid.isConstructed else { throw fail("SignerInfo.sid [0] is not primitive") }
            ski = sid.content
        } else {
            throw fail("SignerInfo.sid is neither IssuerAndSerialNumber nor SubjectKeyIdentifier")
        }
        let digest = try algorithm(b, s.next(), "SignerInfo.digestAlgorithm")
        var n = try s.next()
        var attrsRange: Range<Int>?
        var attrs: [(type: Range<Int>, values: [Range<Int>])] = []
        if let a = n, a.tag == .context0 {
            guard a.isConstructed else { throw fail("signedAttrs [0] is not constructed") }
            var items = Level(cursor: StrictDER.children(a, in: b), what: "signedAttrs [0]")
            while let item = try items.next() {
                if attrs.count >= maxSignedAttributes { throw fail("more than \(maxSignedAttributes) signed attributes") }
                var attr = try children(b, item, .sequence, "signed attribute")
                let type = try oid(b, attr.next(), "signed attribute type")
                let valuesNode = try attr.next()
                var values = try children(b, valuesNode, .set, "signed attribute values")
                try attr.end()
                var vs: [Range<Int>] = []
                while let v = try values.next() {
                    try validate(b, v, "a signed attribute value")
                    vs.append(v.encoded)
                }
                attrs.append((type, vs))
            }
            attrsRange = a.encoded
            n = try s.next()
        }
        let sigAlg = try algorithm(b, n, "SignerInfo.signatureAlgorithm")
        let signature = try primitive(s.next(), .octetString, "SignerInfo.signature")
        if let u = try s.next() {
            if u.tag != .context1 { throw fail("unexpected element after SignerInfo.signature") }
            try validate(b, u, "SignerInfo.unsignedAttrs")
        }
        try s.end()
        return SignerRanges(
            version: version, issuer: issuer, serial: serial, ski: ski, digest: digest, signedAttributes: attrsRange,
            attributes: attrs, signatureAlgorithm: sigAlg, signature: signature)
    }

    // MARK: - Element helpers

    static func children(
        _ b: Bytes, _ node: Element?, _ tag: Tag, _ what: String
    ) throws(VerificationError) -> Level {
        guard let node else { throw fail("\(what) is missing") }
        guard node.tag == tag else { throw fail("\(what) has tag \(node.tag), expected \(tag)") }
        guard node.isConstructed else { throw fail("\(what) is not constructed") }
        return Level(cursor: StrictDER.children(node, in: b), what: what)
    }

    static func validate(_ b: Bytes, _ node: Element, _ what: @autoclosure () -> String) throws(VerificationError) {
        do { try StrictDER.validate(node, in: b) } catch { throw fail(error, what()) }
    }

    static func primitive(
        _ node: Element?, _ tag: Tag, _ what: @autoclosure () -> String
    ) throws(VerificationError) -> Range<Int> {
        guard let node else { throw fail("\(what()) is missing") }
        guard node.tag == tag else { throw fail("\(what()) has tag \(node.tag), expected \(tag)") }
        guard !node.isConstructed else { throw fail("\(what()) is not primitive") }
        return node.content
    }

    static func matches(_ b: Bytes, _ r: Range<Int>, _ oid: OID) -> Bool {
        r.count == oid.der.count && b[r].elementsEqual(oid.der)
    }

    /// An OBJECT IDENTIFIER element's whole encoding.
    static func oid(_ b: Bytes, _ node: Element?, _ what: @autoclosure () -> String) throws(VerificationError) -> Range<Int> {
        let content = try primitive(node, .objectIdentifier, what())
        guard StrictDER.isValidOID(b, content) else { throw fail("\(what()) is not a valid OBJECT IDENTIFIER") }
        return node!.encoded
    }

    static func smallInt(_ b: Bytes, _ node: Element?, _ what: String) throws(VerificationError) -> Int {
        let content = try primitive(node, .integer, what)
        guard let v = StrictDER.int64(b, content) else { throw fail("\(what) is not a small INTEGER") }
        return Int(v)
    }

    static func algorithm(_ b: Bytes, _ node: Element?, _ what: String) throws(VerificationError) -> AlgorithmRanges {
        var a = try children(b, node, .sequence, what)
        let o = try oid(b, a.next(), "\(what).algorithm")
        let params = try a.next()
        if let params { try validate(b, params, "\(what).parameters") }
        try a.end()
        return AlgorithmRanges(oid: o, parameters: params?.encoded)
    }
}
