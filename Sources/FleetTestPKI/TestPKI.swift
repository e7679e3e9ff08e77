import AppStoreVerification
import Crypto
import Foundation
import SwiftASN1
import X509

/// An Apple-shaped test PKI made with swift-certificates: P-384 root, P-384 intermediate (CA, Apple intermediate OID
/// 1.2.840.113635.100.6.2.1), P-256 leaf (Apple leaf OID 1.2.840.113635.100.6.11.1), the same names as Apple's real
/// chain. Variants make the negative cases (no OIDs, intermediate not a CA, expired / not-yet-valid leaf, forged
/// chain with Apple's names but other keys, another intermediate). Never trusted in production.
public struct TestPKI: Sendable {
    public let rootKey: P384.Signing.PrivateKey
    public let root: Certificate
    public let intermediateKey: P384.Signing.PrivateKey
    public let intermediate: Certificate
    public let leafKey: P256.Signing.PrivateKey
    public let leaf: Certificate

    public static let appleLeafOID: ASN1ObjectIdentifier = [1, 2, 840, 113635, 100, 6, 11, 1]
    public static let appleIntermediateOID: ASN1ObjectIdentifier = [1, 2, 840, 113635, 100, 6, 2, 1]

    /// Default validity of every certificate: 2020-01-01 to 2040-01-01.
    public static let defaultNotBefore = Date(timeIntervalSince1970: 1_577_836_800)
    public static let defaultNotAfter = Date(timeIntervalSince1970: 2_208_988_800)

    public static let rootName = try! DistinguishedName {
        CommonName("Apple Root CA - G3")
        OrganizationalUnitName("Apple Certification Authority")
        OrganizationName("Apple Inc.")
        CountryName("US")
    }
    public static let intermediateName = try! DistinguishedName {
        CommonName("Apple Worldwide Developer Relations Certification Authority")
        OrganizationalUnitName("G6")
        OrganizationName("Apple Inc.")
        CountryName("US")
    }
    public static let leafName = try! DistinguishedName {
        CommonName("Prod ECC Mac App Store and iTunes Store Receipt Signing")
        OrganizationalUnitName("Apple Worldwide Developer Relations")
        OrganizationName("Apple Inc.")
        CountryName("US")
    }

    public struct Options: Sendable {
        public var leafAppleOID = true
        public var intermediateAppleOID = true
        public var intermediateIsCA = true
        public var leafNotBefore = TestPKI.defaultNotBefore
        public var leafNotAfter = TestPKI.defaultNotAfter
        public var intermediateNotBefore = TestPKI.defaultNotBefore
        public var intermediateNotAfter = TestPKI.defaultNotAfter
        /// Extra extensions on the leaf (e.g. an unknown critical one).
        public var extraLeafExtensions: [Certificate.Extension] = []
        /// OCSP responder URLs written in the leaf's / intermediate's Authority Information Access (revocation tests).
        public var leafOCSPURL: String?
        public var intermediateOCSPURL: String?
        public init() {}
    }

    /// A fresh root, intermediate and leaf.
    public init(options: Options = Options()) throws {
        let rootKey = P384.Signing.PrivateKey()
        let root = try Certificate(
            version: .v3, serialNumber: Self.serial(), publicKey: .init(rootKey.publicKey),
            notValidBefore: Self.defaultNotBefore, notValidAfter: Self.defaultNotAfter,
            issuer: Self.rootName, subject: Self.rootName, signatureAlgorithm: .ecdsaWithSHA384,
            extensions: try Certificate.Extensions([
                try Certificate.Extension(BasicConstraints.isCertificateAuthority(maxPathLength: nil), critical: true),
                try Certificate.Extension(KeyUsage(keyCertSign: true, cRLSign: true), critical: true),
                try Certificate.Extension(SubjectKeyIdentifier(hash: .init(rootKey.publicKey)), critical: false),
            ]),
            issuerPrivateKey: .init(rootKey))
        try self.init(rootKey: rootKey, root: root, options: options)
    }

    /// A new intermediate and leaf under an existing root.
    public init(rootKey: P384.Signing.PrivateKey, root: Certificate, options: Options = Options()) throws {
        let intermediateKey = P384.Signing.PrivateKey()
        var exts: [Certificate.Extension] = [
            try Certificate.Extension(
                options.intermediateIsCA
                    ? BasicConstraints.isCertificateAuthority(maxPathLength: 0) : BasicConstraints.notCertificateAuthority,
                critical: true),
            try Certificate.Extension(
                options.intermediateIsCA ? KeyUsage(keyCertSign: true, cRLSign: true) : KeyUsage(digitalSignature: true),
                critical: true),
        ]
        // Key identifiers as Apple's certificates carry them (OpenSSL's strict mode, used by Apple's own libraries,
        // requires them).
        exts.append(try Certificate.Extension(SubjectKeyIdentifier(hash: .init(intermediateKey.publicKey)), critical: false))
        exts.append(try Certificate.Extension(Self.authorityKeyIdentifier(root), critical: false))
        if options.intermediateAppleOID {
            exts.append(Certificate.Extension(oid: Self.appleIntermediateOID, critical: false, value: [0x05, 0x00]))
        }
        if let url = options.intermediateOCSPURL { exts.append(try Self.ocspAccess(url)) }
        let intermediate = try Certificate(
            version: .v3, serialNumber: Self.serial(), publicKey: .init(intermediateKey.publicKey),
            notValidBefore: options.intermediateNotBefore, notValidAfter: options.intermediateNotAfter,
            issuer: root.subject, subject: Self.intermediateName, signatureAlgorithm: .ecdsaWithSHA384,
            extensions: try Certificate.Extensions(exts), issuerPrivateKey: .init(rootKey))
        try self.init(
            rootKey: rootKey, root: root, intermediateKey: intermediateKey, intermediate: intermediate,
            options: options)
    }

    /// A new leaf under an existing root and intermediate.
    public init(
        rootKey: P384.Signing.PrivateKey, root: Certificate, intermediateKey: P384.Signing.PrivateKey,
        intermediate: Certificate, options: Options = Options(), leafKey: P256.Signing.PrivateKey = .init()
    ) throws {
        var exts: [Certificate.Extension] = [
            try Certificate.Extension(BasicConstraints.notCertificateAuthority, critical: false),
            try Certificate.Extension(KeyUsage(digitalSignature: true), critical: true),
        ]
        exts.append(try Certificate.Extension(Self.authorityKeyIdentifier(intermediate), critical: false))
        if options.leafAppleOID {
            exts.append(Certificate.Extension(oid: Self.appleLeafOID, critical: false, value: [0x05, 0x00]))
        }
        exts.append(contentsOf: options.extraLeafExtensions)
        if let url = options.leafOCSPURL { exts.append(try Self.ocspAccess(url)) }
        let leaf = try Certificate(
            version: .v3, serialNumber: Self.serial(), publicKey: .init(leafKey.publicKey),
            notValidBefore: options.leafNotBefore, notValidAfter: options.leafNotAfter,
            issuer: intermediate.subject, subject: Self.leafName, signatureAlgorithm: .ecdsaWithSHA384,
            extensions: try Certificate.Extensions(exts), issuerPrivateKey: .init(intermediateKey))
        self.rootKey = rootKey
        self.root = root
        self.intermediateKey = intermediateKey
        self.intermediate = intermediate
        self.leafKey = leafKey
        self.leaf = leaf
    }

    /// An Authority Information Access extension naming one OCSP responder.
    static func ocspAccess(_ url: String) throws -> Certificate.Extension {
        try Certificate.Extension(
            AuthorityInformationAccess([.init(method: .ocspServer, location: .uniformResourceIdentifier(url))]),
            critical: false)
    }

    /// The issuer's subject key identifier as an authority key identifier (hash of its key when it has none).
    static func authorityKeyIdentifier(_ issuer: Certificate) -> AuthorityKeyIdentifier {
        let ski = (try? issuer.extensions.subjectKeyIdentifier) ?? SubjectKeyIdentifier(hash: issuer.publicKey)
        return AuthorityKeyIdentifier(keyIdentifier: ski.keyIdentifier)
    }

    static func serial() -> Certificate.SerialNumber {
        Certificate.SerialNumber(UInt64.random(in: 1..<UInt64(Int64.max)))
    }

    // MARK: Variants

    /// Same root and intermediate, a new leaf with other options (validity, OID).
    public func withNewLeaf(options: Options = Options()) throws -> TestPKI {
        try TestPKI(
            rootKey: rootKey, root: root, intermediateKey: intermediateKey, intermediate: intermediate,
            options: options)
    }

    /// Same root, a new intermediate (and leaf).
    public func withNewIntermediate(options: Options = Options()) throws -> TestPKI {
        try TestPKI(rootKey: rootKey, root: root, options: options)
    }

    /// A leaf valid only in [notBefore, notAfter].
    public func withLeafValidity(_ notBefore: Date, _ notAfter: Date) throws -> TestPKI {
        var o = Options()
        o.leafNotBefore = notBefore
        o.leafNotAfter = notAfter
        return try withNewLeaf(options: o)
    }

    /// An attacker's chain with Apple's names but its own keys (self-made root); verifies only against its own root.
    public static func forged() throws -> TestPKI { try TestPKI() }

    // MARK: Export

    public static func der(_ c: Certificate) -> [UInt8] {
        var s = DER.Serializer()
        // Serializing a certificate we built or parsed cannot fail.
        try! s.serialize(c)
        return s.serializedBytes
    }

    public var rootDER: [UInt8] { Self.der(root) }
    public var rootPEM: String { (try? root.serializeAsPEM().pemString) ?? "" }
    public var intermediateDER: [UInt8] { Self.der(intermediate) }
    public var leafDER: [UInt8] { Self.der(leaf) }

    /// [leaf, intermediate, root] as standard base64 DER, as in a JWS `x5c`.
    public var x5c: [String] { [leafDER, intermediateDER, rootDER].map { Base64.encodeStandard($0) } }

    public var signer: JWSSigner { JWSSigner(key: leafKey, x5c: x5c) }

    /// A policy trusting this PKI's root.
    public func policy(
        bundleId: String = TestPayloads.bundleId, appAppleId: Int64? = TestPayloads.appAppleId,
        environments: Set<AppStoreVerification.Environment> = [.sandbox, .production],
        validationTime: ValidationTime = .signedDate, allowUnsignedEnvironments: Bool = false,
        maxInputBytes: Int = VerificationPolicy.defaultMaxInputBytes
    ) throws(PolicyError) -> VerificationPolicy {
        try VerificationPolicy(
            rootDERs: [rootDER], bundleId: bundleId, appAppleId: appAppleId, environments: environments,
            validationTime: validationTime, allowUnsignedEnvironments: allowUnsignedEnvironments,
            maxInputBytes: maxInputBytes)
    }

    // MARK: Signing shortcuts

    public func sign(_ payload: JSONValue, header: JWSSigner.Header = .init()) -> String {
        signer.sign(payload, header: header)
    }

    /// A signed notification with nested signed transaction / renewal info (each signed with this chain).
    public func signNotification(
        type: NotificationTypeV2, subtype: Subtype? = nil,
        transaction: JSONValue? = nil, renewal: JSONValue? = nil,
        environment: AppStoreVerification.Environment = .sandbox, bundleId: String = TestPayloads.bundleId,
        appAppleId: Int64? = TestPayloads.appAppleId, signedDate: Int64 = TestPayloads.nowMillis(),
        notificationUUID: String = UUID().uuidString.lowercased(), status: Int64? = nil,
        extraData: [String: JSONValue] = [:]
    ) -> String {
        let payload = TestPayloads.notification(
            type: type, subtype: subtype, notificationUUID: notificationUUID, signedDate: signedDate,
            environment: environment, bundleId: bundleId, appAppleId: appAppleId,
            signedTransactionInfo: transaction.map { sign($0) }, signedRenewalInfo: renewal.map { sign($0) },
            status: status, extraData: extraData)
        return sign(payload)
    }
}

/// Signs JSON payloads as compact JWS (ES256, x5c header) — overridable for negative tests.
public struct JWSSigner: Sendable {
    public let key: P256.Signing.PrivateKey
    public let x5c: [String]

    public init(key: P256.Signing.PrivateKey, x5c: [String]) {
        self.key = key
        self.x5c = x5c
    }

    public struct Header: Sendable {
        /// The `alg` to write; nil omits it.
        public var alg: String? = "ES256"
        /// Replaces the x5c list (e.g. 1, 2 or 4 certificates); nil keeps the signer's.
        public var x5c: [String]?
        /// Omit x5c entirely.
        public var omitX5c = false
        /// Write a DER-encoded ECDSA signature instead of raw r||s.
        public var derSignature = false
        /// Extra header fields.
        public var extra: [String: JSONValue] = [:]
        public init(
            alg: String? = "ES256", x5c: [String]? = nil, omitX5c: Bool = false, derSignature: Bool = false,
            extra: [String: JSONValue] = [:]
        ) {
            self.alg = alg
            self.x5c = x5c
            self.omitX5c = omitX5c
            self.derSignature = derSignature
            self.extra = extra
        }
    }

    /// The compact JWS of `payload`. Header keys are sorted, so the same chain always gives the same header segment.
    public func sign(_ payload: JSONValue, header: Header = .init()) -> String {
        sign(payloadBytes: payload.serializedBytes(), header: header)
    }

    public func sign(payloadBytes: [UInt8], header: Header = .init()) -> String {
        var h = header.extra
        if let alg = header.alg { h["alg"] = .string(alg) }
        if !header.omitX5c { h["x5c"] = .array((header.x5c ?? x5c).map { .string($0) }) }
        let signingInput = Base64.encodeURL(JSONValue.object(h).serializedBytes()) + "." + Base64.encodeURL(payloadBytes)
        let data = Array(signingInput.utf8)
        // Signing with a valid in-memory key does not fail.
        let sig = try! key.signature(for: data)
        let sigBytes = header.derSignature ? Array(sig.derRepresentation) : Array(sig.rawRepresentation)
        return signingInput + "." + Base64.encodeURL(sigBytes)
    }
}
