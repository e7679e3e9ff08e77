import AppStoreVerification
import Crypto
import Foundation
import SwiftASN1
import X509
import _CryptoExtras

/// A StoreKit 1 `transactionReceipt`-shaped test PKI and signer, shaped like Apple's: an RSA "Apple Root CA" ->
/// "Apple iTunes Store Certification Authority" (marker 1.2.840.113635.100.6.2.2) -> "PurchaseReceiptCertificate"
/// (RSA-1024 like Apple's, marker 1.2.840.113635.100.6.5.1), and receipts in Apple's format (an old-style plist with
/// `signature` = version 2 + 128-byte RSA SHA-1 signature + length + signer DER, and `purchase-info`). Never trusted in
/// production.
public struct TestTransactionReceiptPKI: Sendable {
    public let rootKey: _RSA.Signing.PrivateKey
    public let root: Certificate
    public let intermediateKey: _RSA.Signing.PrivateKey
    public let intermediate: Certificate
    public let leafKey: _RSA.Signing.PrivateKey
    public let leafDER: [UInt8]

    public static let intermediateName = try! DistinguishedName {
        CountryName("US")
        OrganizationName("Apple Inc.")
        OrganizationalUnitName("Apple Certification Authority")
        CommonName("Apple iTunes Store Certification Authority")
    }
    public static let leafName = try! DistinguishedName {
        CommonName("PurchaseReceiptCertificate")
        OrganizationalUnitName("Apple iTunes Store")
        OrganizationName("Apple Inc.")
        CountryName("US")
    }
    public static let leafOID: ASN1ObjectIdentifier = [1, 2, 840, 113635, 100, 6, 5, 1]
    public static let intermediateOID: ASN1ObjectIdentifier = [1, 2, 840, 113635, 100, 6, 2, 2]

    /// - Parameters: `markers`: put Apple's marker extensions on the leaf and the intermediate.
    public init(markers: Bool = true) throws {
        let rootKey = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        let root = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(rootKey.publicKey),
            notValidBefore: TestPKI.defaultNotBefore, notValidAfter: TestPKI.defaultNotAfter,
            issuer: TestReceiptPKI.rootName, subject: TestReceiptPKI.rootName, signatureAlgorithm: .sha256WithRSAEncryption,
            extensions: try Certificate.Extensions([
                try Certificate.Extension(BasicConstraints.isCertificateAuthority(maxPathLength: nil), critical: true),
                try Certificate.Extension(KeyUsage(keyCertSign: true, cRLSign: true), critical: true),
            ]),
            issuerPrivateKey: .init(rootKey))
        let intermediateKey = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        var caExtensions = [
            try Certificate.Extension(BasicConstraints.isCertificateAuthority(maxPathLength: nil), critical: true),
            try Certificate.Extension(KeyUsage(digitalSignature: true, keyCertSign: true, cRLSign: true), critical: true),
        ]
        if markers { caExtensions.append(Certificate.Extension(oid: Self.intermediateOID, critical: false, value: [0x05, 0x00])) }
        let intermediate = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(intermediateKey.publicKey),
            notValidBefore: TestPKI.defaultNotBefore, notValidAfter: TestPKI.defaultNotAfter,
            issuer: TestReceiptPKI.rootName, subject: Self.intermediateName, signatureAlgorithm: .sha256WithRSAEncryption,
            extensions: try Certificate.Extensions(caExtensions), issuerPrivateKey: .init(rootKey))
        let leafKey = try _RSA.Signing.PrivateKey(unsafeKeySize: .init(bitCount: 1024))
        var leafExtensions = [
            try Certificate.Extension(BasicConstraints.notCertificateAuthority, critical: true),
            try Certificate.Extension(KeyUsage(digitalSignature: true), critical: true),
        ]
        if markers { leafExtensions.append(Certificate.Extension(oid: Self.leafOID, critical: false, value: [0x05, 0x00])) }
        let leaf = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(leafKey.publicKey),
            notValidBefore: TestPKI.defaultNotBefore, notValidAfter: TestPKI.defaultNotAfter,
            issuer: Self.intermediateName, subject: Self.leafName, signatureAlgorithm: .sha256WithRSAEncryption,
            extensions: try Certificate.Extensions(leafExtensions), issuerPrivateKey: .init(intermediateKey))
        var s = DER.Serializer()
        try s.serialize(leaf)
        self.rootKey = rootKey
        self.root = root
        self.intermediateKey = intermediateKey
        self.intermediate = intermediate
        self.leafKey = leafKey
        self.leafDER = s.serializedBytes
    }

    public var rootDER: [UInt8] { TestReceiptPKI.der(root) }
    public var intermediateDER: [UInt8] { TestReceiptPKI.der(intermediate) }

    /// A verification policy trusting this root (and, unless told otherwise, this intermediate).
    public func policy(
        environments: Set<AppStoreVerification.Environment> = [.sandbox], appAppleId: Int64? = nil,
        trustIntermediate: Bool = true
    ) throws -> VerificationPolicy {
        try VerificationPolicy(
            roots: [try TrustedRoot(der: rootDER)], bundleId: TestPayloads.bundleId, appAppleId: appAppleId,
            environments: environments,
            trustedIntermediates: trustIntermediate ? [try TrustedRoot(der: intermediateDER)] : [])
    }

    /// A purchase's `purchase-info` plist, Apple's keys.
    public static func purchaseInfo(
        transactionId: String, productId: String, purchaseDate: Int64, bundleId: String = TestPayloads.bundleId,
        quantity: Int = 1, appItemId: Int64? = nil, originalTransactionId: String? = nil
    ) -> [UInt8] {
        var lines = [
            ("original-purchase-date-ms", String(purchaseDate)), ("purchase-date-ms", String(purchaseDate)),
            ("original-transaction-id", originalTransactionId ?? transactionId), ("transaction-id", transactionId),
            ("product-id", productId), ("bid", bundleId), ("bvrs", "1.0"), ("quantity", String(quantity)),
            ("purchase-date", "2015-11-18 04:34:41 Etc/GMT"),
        ]
        if let appItemId { lines.append(("app-item-id", String(appItemId))) }
        return Array(("{\n" + lines.map { "\t\"\($0.0)\" = \"\($0.1)\";\n" }.joined() + "}").utf8)
    }

    /// The base64 receipt: signature (version 2) over (version byte + purchase-info), `environment` when given.
    public func sign(purchaseInfo info: [UInt8], environment: String? = "Sandbox") throws -> String {
        let version: UInt8 = 2
        let signature = try leafKey.signature(for: Insecure.SHA1.hash(data: [version] + info), padding: .insecurePKCS1v1_5)
        var blob: [UInt8] = [version]
        blob += Array(signature.rawRepresentation)
        let n = leafDER.count
        blob += [UInt8(n >> 24 & 0xFF), UInt8(n >> 16 & 0xFF), UInt8(n >> 8 & 0xFF), UInt8(n & 0xFF)]
        blob += leafDER
        var text = "{\n\t\"signature\" = \"\(Base64.encodeStandard(blob))\";\n\t\"purchase-info\" = \"\(Base64.encodeStandard(info))\";\n"
        if let environment { text += "\t\"environment\" = \"\(environment)\";\n" }
        text += "\t\"pod\" = \"100\";\n\t\"signing-status\" = \"0\";\n}"
        return Base64.encodeStandard(Array(text.utf8))
    }
}
