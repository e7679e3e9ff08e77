import AppStoreVerification
import Crypto
import Foundation
import SwiftASN1
import X509
import _CryptoExtras

/// An App Store receipt-shaped test PKI (RSA-2048 everywhere, like Apple's): "Apple Root CA" -> "Apple Worldwide
/// Developer Relations Certification Authority" (G5, marker 1.2.840.113635.100.6.2.1) -> "Mac App Store and iTunes
/// Store Receipt Signing" (marker 1.2.840.113635.100.6.11.1), and a signer of PKCS#7 app receipts over `TestReceipt`
/// contents. Variants: no marker OIDs, expired / short-lived leaf, forged chain with Apple's names and other keys.
/// Never trusted in production.
public struct TestReceiptPKI: Sendable {
    /// The root's signing key (RSA here; the P-384 JWS test root for `init(under:)`).
    public let rootKey: Certificate.PrivateKey
    public let root: Certificate
    public let intermediateKey: _RSA.Signing.PrivateKey
    public let intermediate: Certificate
    public let leafKey: _RSA.Signing.PrivateKey
    public let leaf: Certificate

    public static let rootName = try! DistinguishedName {
        CountryName("US")
        OrganizationName("Apple Inc.")
        OrganizationalUnitName("Apple Certification Authority")
        CommonName("Apple Root CA")
    }
    public static let intermediateName = try! DistinguishedName {
        CommonName("Apple Worldwide Developer Relations Certification Authority")
        OrganizationalUnitName("G5")
        OrganizationName("Apple Inc.")
        CountryName("US")
    }
    public static let leafName = try! DistinguishedName {
        CommonName("Mac App Store and iTunes Store Receipt Signing")
        OrganizationalUnitName("Apple Worldwide Developer Relations")
        OrganizationName("Apple Inc.")
        CountryName("US")
    }

    public struct Options: Sendable {
        public var leafAppleOID = true
        public var intermediateAppleOID = true
        public var leafNotBefore = TestPKI.defaultNotBefore
        public var leafNotAfter = TestPKI.defaultNotAfter
        public init() {}
    }

    /// A fresh root, intermediate and leaf (three RSA-2048 key generations).
    public init(options: Options = Options()) throws {
        let rootKey = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        let root = try Certificate(
            version: .v3, serialNumber: Self.serial(), publicKey: .init(rootKey.publicKey),
            notValidBefore: TestPKI.defaultNotBefore, notValidAfter: TestPKI.defaultNotAfter,
            issuer: Self.rootName, subject: Self.rootName, signatureAlgorithm: .sha256WithRSAEncryption,
            extensions: try Certificate.Extensions([
                try Certificate.Extension(BasicConstraints.isCertificateAuthority(maxPathLength: nil), critical: true),
                try Certificate.Extension(KeyUsage(keyCertSign: true, cRLSign: true), critical: true),
            ]),
            issuerPrivateKey: .init(rootKey))
        try self.init(rootKey: .init(rootKey), root: root, options: options)
    }

    /// The receipt intermediate and leaf under the JWS test PKI's P-384 root, so that one trusted test root anchors
    /// both (the demo's worker trusts only that root).
    public init(under jws: TestPKI, options: Options = Options()) throws {
        try self.init(rootKey: .init(jws.rootKey), root: jws.root, options: options)
    }

    /// A new intermediate and leaf under an existing root.
    public init(rootKey: Certificate.PrivateKey, root: Certificate, options: Options = Options()) throws {
        let intermediateKey = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        var exts: [Certificate.Extension] = [
            try Certificate.Extension(BasicConstraints.isCertificateAuthority(maxPathLength: 0), critical: true),
            try Certificate.Extension(KeyUsage(keyCertSign: true, cRLSign: true), critical: true),
        ]
        if options.intermediateAppleOID {
            exts.append(Certificate.Extension(oid: TestPKI.appleIntermediateOID, critical: false, value: [0x05, 0x00]))
        }
        let intermediate = try Certificate(
            version: .v3, serialNumber: Self.serial(), publicKey: .init(intermediateKey.publicKey),
            notValidBefore: TestPKI.defaultNotBefore, notValidAfter: TestPKI.defaultNotAfter,
            issuer: root.subject, subject: Self.intermediateName,
            signatureAlgorithm: root.signatureAlgorithm == .ecdsaWithSHA384 ? .ecdsaWithSHA384 : .sha256WithRSAEncryption,
            extensions: try Certificate.Extensions(exts), issuerPrivateKey: rootKey)
        try self.init(
            rootKey: rootKey, root: root, intermediateKey: intermediateKey, intermediate: intermediate, options: options)
    }

    /// A new leaf under an existing root and intermediate.
    public init(
        rootKey: Certificate.PrivateKey, root: Certificate, intermediateKey: _RSA.Signing.PrivateKey,
        intermediate: Certificate, options: Options = Options()
    ) throws {
        let leafKey = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        var exts: [Certificate.Extension] = [
            try Certificate.Extension(BasicConstraints.notCertificateAuthority, critical: true),
            try Certificate.Extension(KeyUsage(digitalSignature: true), critical: true),
        ]
        if options.leafAppleOID {
            exts.append(Certificate.Extension(oid: TestPKI.appleLeafOID, critical: false, value: [0x05, 0x00]))
        }
        self.leaf = try Certificate(
            version: .v3, serialNumber: Self.serial(), publicKey: .init(leafKey.publicKey),
            notValidBefore: options.leafNotBefore, notValidAfter: options.leafNotAfter,
            issuer: intermediate.subject, subject: Self.leafName, signatureAlgorithm: .sha256WithRSAEncryption,
            extensions: try Certificate.Extensions(exts), issuerPrivateKey: .init(intermediateKey))
        self.rootKey = rootKey
        self.root = root
        self.intermediateKey = intermediateKey
        self.intermediate = intermediate
        self.leafKey = leafKey
    }

    static func serial() -> Certificate.SerialNumber {
        Certificate.SerialNumber(UInt64.random(in: 1..<UInt64(Int64.max)))
    }

    /// Same root and intermediate, a new leaf with other options (validity, marker OID).
    public func withNewLeaf(options: Options) throws -> TestReceiptPKI {
        try TestReceiptPKI(
            rootKey: rootKey, root: root, intermediateKey: intermediateKey, intermediate: intermediate, options: options)
    }

    /// Same root, a new intermediate (and leaf) with other options.
    public func withNewIntermediate(options: Options) throws -> TestReceiptPKI {
        try TestReceiptPKI(rootKey: rootKey, root: root, options: options)
    }

    public var rootDER: [UInt8] { Self.der(root) }

    static func der(_ c: Certificate) -> [UInt8] {
        var s = DER.Serializer()
        try! s.serialize(c)
        return s.serializedBytes
    }

    public func policy(
        bundleId: String = TestPayloads.bundleId, environments: Set<AppStoreVerification.Environment> = [.sandbox, .production],
        appAppleId: Int64? = TestPayloads.appAppleId, validationTime: ValidationTime = .signedDate,
        allowUnsigned: Bool = false, extraRoots: [[UInt8]] = []
    ) throws -> VerificationPolicy {
        try VerificationPolicy(
            rootDERs: [rootDER] + extraRoots, bundleId: bundleId, appAppleId: appAppleId, environments: environments,
            validationTime: validationTime, allowUnsignedEnvironments: allowUnsigned)
    }

    // MARK: - Signing

    public enum Digest: Sendable { case sha1, sha256 }

    static let signedDataOID: ASN1ObjectIdentifier = [1, 2, 840, 113549, 1, 7, 2]
    static let dataOID: ASN1ObjectIdentifier = [1, 2, 840, 113549, 1, 7, 1]
    static let rsaEncryptionOID: ASN1ObjectIdentifier = [1, 2, 840, 113549, 1, 1, 1]
    static let sha1OID: ASN1ObjectIdentifier = [1, 3, 14, 3, 2, 26]
    static let sha256OID: ASN1ObjectIdentifier = [2, 16, 840, 1, 101, 3, 4, 2, 1]
    static let contentTypeAttr: ASN1ObjectIdentifier = [1, 2, 840, 113549, 1, 9, 3]
    static let messageDigestAttr: ASN1ObjectIdentifier = [1, 2, 840, 113549, 1, 9, 4]

    /// The DER PKCS#7 app receipt of `receipt`, signed by this PKI's leaf (RSA PKCS#1 v1.5 with `digest`), with the
    /// leaf, intermediate and root in the certificate set as Apple's receipts have them; with `signedAttributes`,
    /// RFC 5652 content-type and message-digest attributes are signed instead of the content.
    public func sign(_ receipt: TestReceipt, digest: Digest = .sha256, signedAttributes: Bool = false) throws -> [UInt8] {
        try sign(content: receipt.contentDER(), digest: digest, signedAttributes: signedAttributes)
    }

    public func signBase64(_ receipt: TestReceipt, digest: Digest = .sha256) throws -> String {
        Base64.encodeStandard(try sign(receipt, digest: digest))
    }

    public func sign(content: [UInt8], digest: Digest = .sha256, signedAttributes: Bool = false) throws -> [UInt8] {
        let digestOID = digest == .sha1 ? Self.sha1OID : Self.sha256OID
        func hash(_ b: [UInt8]) -> [UInt8] {
            digest == .sha1 ? Array(Insecure.SHA1.hash(data: b)) : Array(SHA256.hash(data: b))
        }
        var attrsDER: [UInt8]?
        if signedAttributes {
            var attrs: [[UInt8]] = []
            var a = DER.Serializer()
            try a.appendConstructedNode(identifier: .sequence) { s in
                try s.serialize(Self.contentTypeAttr)
                try s.appendConstructedNode(identifier: .set) { s in try s.serialize(Self.dataOID) }
            }
            attrs.append(a.serializedBytes)
            var m = DER.Serializer()
            try m.appendConstructedNode(identifier: .sequence) { s in
                try s.serialize(Self.messageDigestAttr)
                try s.appendConstructedNode(identifier: .set) { s in
                    try s.serialize(ASN1OctetString(contentBytes: ArraySlice(hash(content))))
                }
            }
            attrs.append(m.serializedBytes)
            attrs.sort { $0.lexicographicallyPrecedes($1) }
            var set = DER.Serializer()
            set.appendConstructedNode(identifier: .set) { s in for x in attrs { s.serializeRawBytes(x) } }
            attrsDER = set.serializedBytes
        }
        let toSign = attrsDER ?? content
        let signature: _RSA.Signing.RSASignature
        switch digest {
        case .sha1: signature = try leafKey.signature(for: Insecure.SHA1.hash(data: toSign), padding: .insecurePKCS1v1_5)
        case .sha256: signature = try leafKey.signature(for: SHA256.hash(data: toSign), padding: .insecurePKCS1v1_5)
        }
        let certs = [leaf, intermediate, root]
        var s = DER.Serializer()
        try s.appendConstructedNode(identifier: .sequence) { s in
            try s.serialize(Self.signedDataOID)
            try s.appendConstructedNode(identifier: ASN1Identifier(tagWithNumber: 0, tagClass: .contextSpecific)) { s in
                try s.appendConstructedNode(identifier: .sequence) { s in
                    try s.serialize(1)
                    try s.appendConstructedNode(identifier: .set) { s in try Self.algorithm(digestOID, &s) }
                    try s.appendConstructedNode(identifier: .sequence) { s in
                        try s.serialize(Self.dataOID)
                        try s.appendConstructedNode(identifier: ASN1Identifier(tagWithNumber: 0, tagClass: .contextSpecific)) { s in
                            try s.serialize(ASN1OctetString(contentBytes: ArraySlice(content)))
                        }
                    }
                    try s.appendConstructedNode(identifier: ASN1Identifier(tagWithNumber: 0, tagClass: .contextSpecific)) { s in
                        for c in certs { try s.serialize(c) }
                    }
                    try s.appendConstructedNode(identifier: .set) { s in
                        try s.appendConstructedNode(identifier: .sequence) { s in
                            try s.serialize(1)
                            try s.appendConstructedNode(identifier: .sequence) { s in
                                try s.serialize(leaf.issuer)
                                s.appendPrimitiveNode(identifier: .integer) { $0.append(contentsOf: leaf.serialNumber.bytes) }
                            }
                            try Self.algorithm(digestOID, &s)
                            if var attrs = attrsDER {
                                attrs[0] = 0xA0
                                s.serializeRawBytes(attrs)
                            }
                            try Self.algorithm(Self.rsaEncryptionOID, &s)
                            try s.serialize(ASN1OctetString(contentBytes: ArraySlice(signature.rawRepresentation)))
                        }
                    }
                }
            }
        }
        return s.serializedBytes
    }

    static func algorithm(_ oid: ASN1ObjectIdentifier, _ s: inout DER.Serializer) throws {
        try s.appendConstructedNode(identifier: .sequence) { s in
            try s.serialize(oid)
            try s.serialize(ASN1Null())
        }
    }
}

/// The content of a test app receipt: the attribute SET Apple's receipts carry (see `AppReceipt`).
public struct TestReceipt: Sendable {
    public struct InApp: Sendable {
        public var quantity: Int64 = 1
        public var productId: String
        public var transactionId: String
        public var originalTransactionId: String
        public var purchaseDate: Int64
        public var originalPurchaseDate: Int64
        /// 1707: 0 non-consumable, 1 consumable, 2 non-renewing, 3 auto-renewable; nil = absent (older receipts).
        public var productType: Int64?
        public var expiresDate: Int64?
        public var cancellationDate: Int64?
        public var webOrderLineItemId: Int64?

        public init(
            productId: String, transactionId: String, originalTransactionId: String? = nil, purchaseDate: Int64,
            quantity: Int64 = 1, productType: Int64? = 1, expiresDate: Int64? = nil, cancellationDate: Int64? = nil,
            webOrderLineItemId: Int64? = nil
        ) {
            self.productId = productId
            self.transactionId = transactionId
            self.originalTransactionId = originalTransactionId ?? transactionId
            self.purchaseDate = purchaseDate
            self.originalPurchaseDate = purchaseDate
            self.quantity = quantity
            self.productType = productType
            self.expiresDate = expiresDate
            self.cancellationDate = cancellationDate
            self.webOrderLineItemId = webOrderLineItemId
        }
    }

    /// `Production`, `ProductionSandbox` or `Xcode`.
    public var receiptType: String
    public var appAppleId: Int64
    public var bundleId: String
    public var applicationVersion = "1.0"
    public var originalApplicationVersion = "1.0"
    public var creationDate: Int64
    public var expirationDate: Int64?
    public var inApp: [InApp]

    public init(
        receiptType: String = "ProductionSandbox", appAppleId: Int64 = 0, bundleId: String = TestPayloads.bundleId,
        applicationVersion: String = "1.0", creationDate: Int64, inApp: [InApp]
    ) {
        self.receiptType = receiptType
        self.appAppleId = appAppleId
        self.bundleId = bundleId
        self.applicationVersion = applicationVersion
        self.creationDate = creationDate
        self.inApp = inApp
    }

    public static func rfc3339(_ ms: Int64) -> String {
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withInternetDateTime]
        return f.string(from: EpochMillis.date(ms))
    }

    enum Value {
        case int(Int64), utf8(String), ia5(String), raw([UInt8])
    }

    static func attributeSet(_ attrs: [(Int, Value)]) throws -> [UInt8] {
        var encoded: [[UInt8]] = []
        for (type, value) in attrs {
            var v = DER.Serializer()
            switch value {
            case .int(let i): try v.serialize(i)
            case .utf8(let s): try v.serialize(ASN1UTF8String(s))
            case .ia5(let s): try v.serialize(ASN1IA5String(s))
            case .raw(let b): v.serializeRawBytes(b)
            }
            var a = DER.Serializer()
            try a.appendConstructedNode(identifier: .sequence) { s in
                try s.serialize(type)
                try s.serialize(1)
                try s.serialize(ASN1OctetString(contentBytes: ArraySlice(v.serializedBytes)))
            }
            encoded.append(a.serializedBytes)
        }
        encoded.sort { $0.lexicographicallyPrecedes($1) }
        var set = DER.Serializer()
        set.appendConstructedNode(identifier: .set) { s in for e in encoded { s.serializeRawBytes(e) } }
        return set.serializedBytes
    }

    public func contentDER() throws -> [UInt8] {
        var attrs: [(Int, Value)] = [
            (0, .utf8(receiptType)), (1, .int(appAppleId)), (2, .utf8(bundleId)), (3, .utf8(applicationVersion)),
            (19, .utf8(originalApplicationVersion)), (12, .ia5(Self.rfc3339(creationDate))),
            (4, .raw([0x04, 0x02, 0x01, 0x02])), (5, .raw([0x04, 0x02, 0x03, 0x04])),
        ]
        if let e = expirationDate { attrs.append((21, .ia5(Self.rfc3339(e)))) }
        for entry in inApp {
            var fields: [(Int, Value)] = [
                (1701, .int(entry.quantity)), (1702, .utf8(entry.productId)), (1703, .utf8(entry.transactionId)),
                (1705, .utf8(entry.originalTransactionId)), (1704, .ia5(Self.rfc3339(entry.purchaseDate))),
                (1706, .ia5(Self.rfc3339(entry.originalPurchaseDate))),
                (1708, .ia5(entry.expiresDate.map(Self.rfc3339) ?? "")),
                (1712, .ia5(entry.cancellationDate.map(Self.rfc3339) ?? "")),
            ]
            if let t = entry.productType { fields.append((1707, .int(t))) }
            if let w = entry.webOrderLineItemId { fields.append((1711, .int(w))) }
            attrs.append((17, .raw(try Self.attributeSet(fields))))
        }
        return try Self.attributeSet(attrs)
    }
}
