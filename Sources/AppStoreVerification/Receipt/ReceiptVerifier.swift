import Crypto
import Foundation
import SwiftASN1
import X509
import _CryptoExtras

/// A verified legacy app receipt (PKCS#7).
public struct VerifiedAppReceipt: Sendable, Hashable {
    public let payload: AppReceipt
    public var environment: Environment { payload.environment }
    public init(payload: AppReceipt) { self.payload = payload }
}

/// Legacy App Store app receipts (base64 DER PKCS#7 SignedData), verified locally and offline.
///
/// Order of checks: size bound (`maxReceiptBytes`); base64; strict-DER CMS SignedData (one signer, embedded id-data
/// content); receipt attribute SET; validation time (receipt creation date, field 12, or now); `Xcode` refusal; the
/// signer certificate (by the SignerInfo's sid) -> an intermediate of the certificate set -> a configured root through
/// `AppleChainVerifier` (swift-certificates `Verifier`, RFC 5280 at the validation time, key usage, Apple marker
/// OIDs), through the shared chain cache; validity of the cached chain at the validation time; the RSA PKCS#1 v1.5
/// signature with the SignerInfo's digest (SHA-1 / SHA-256 / SHA-384 / SHA-512) over the content, or over the DER
/// signed attributes after checking their message digest (RFC 5652 §5.4); then bundle id (field 2), environment
/// (field 0) and, for Production, the app id (field 1).
extension SignedDataVerifier {
    static let receiptTag: UInt8 = 0x52  // 'R': sid + exact certificate set of a receipt

    /// Verifies a base64 app receipt (one line; whitespace and line breaks inside are ignored).
    public func verifyAppReceipt(base64 input: UnsafeBufferPointer<UInt8>) throws(VerificationError) -> VerifiedAppReceipt {
        if input.count > policy.maxReceiptBytes {
            throw VerificationError(
                .payloadTooLarge, "receipt is \(input.count) bytes; the limit is \(policy.maxReceiptBytes) bytes")
        }
        // The usual case (one line, no whitespace) first; whitespace is removed only when decoding fails.
        if let r = try verifyAppReceiptLine(input) { return r }
        var compact: [UInt8] = []
        compact.reserveCapacity(input.count)
        for c in input where !Self.isSpace(c) { compact.append(c) }
        guard compact.count != input.count, let der = compact.withUnsafeBufferPointer({ Base64.decodeStandard($0) }) else {
            throw VerificationError(.malformedReceipt, "receipt is not valid padded standard base64")
        }
        return try verifyAppReceipt(der: der)
    }

    public func verifyAppReceipt(_ base64: String) throws(VerificationError) -> VerifiedAppReceipt {
        try withUTF8Bytes(base64) { (b) throws(VerificationError) in try verifyAppReceipt(base64: b) }
    }

    /// Verifies the DER bytes of an app receipt.
    public func verifyAppReceipt(der: [UInt8]) throws(VerificationError) -> VerifiedAppReceipt {
        try verifyAppReceipt(der: der, spanKeyInput: nil)
    }

    /// `spanKeyInput`: the one-line base64 `der` was decoded from, when the fast path missed the chain cache; the
    /// chain is then also cached under the fast path's key (`receiptSpanKey`).
    func verifyAppReceipt(der: [UInt8], spanKeyInput: UnsafeBufferPointer<UInt8>?) throws(VerificationError) -> VerifiedAppReceipt {
        if der.count > policy.maxReceiptBytes {
            throw VerificationError(
                .payloadTooLarge, "receipt is \(der.count) bytes; the limit is \(policy.maxReceiptBytes) bytes")
        }
        let signed = try PKCS7SignedData(der: der)
        return try verifyAppReceipt(signed, cachedChain: nil, spanKeyInput: spanKeyInput)
    }

    /// The checks after the PKCS#7 walk; `cachedChain` is the fast path's chain-cache hit (its `signed` was walked
    /// without the certificate set, whose exact bytes were walked and validated when that entry was made).
    func verifyAppReceipt(
        _ signed: PKCS7SignedData, cachedChain: VerifiedChain?, spanKeyInput: UnsafeBufferPointer<UInt8>?
    ) throws(VerificationError) -> VerifiedAppReceipt {
        let receipt = try AppReceipt(content: signed.content)

        // Validation time, read before the signature and bound by it afterwards.
        let validationTime: Int64
        switch policy.validationTime {
        case .now: validationTime = now()
        case .signedDate: validationTime = receipt.receiptCreationDate ?? now()
        }
        let env = receipt.environment
        if env.isUnsigned {
            try signed.validateCertificates()  // Nothing to check on a fast-path hit (see above).
            if !policy.allowUnsignedEnvironments {
                throw VerificationError(
                    .unsignedEnvironmentRefused,
                    "receipt type \(receipt.receiptType ?? "") is signed locally (StoreKit testing), not by Apple; refused "
                        + "(development-only option allowUnsignedEnvironments is off)")
            }
            return VerifiedAppReceipt(payload: receipt)
        }

        let chain: VerifiedChain
        if let cachedChain { chain = cachedChain } else {
            chain = try receiptChain(signed, validationTime: validationTime, spanKeyInput: spanKeyInput)
        }
        let key = try Self.signerKey(chain, at: validationTime)
        try Self.checkReceiptSignature(signed, key: key)
        // Revocation (opt-in), as for JWS chains: only once the signature verified.
        if let revocation { try revocation.check(chain) }

        // App policy.
        guard let bundle = receipt.bundleId else {
            throw VerificationError(.wrongBundleId, "receipt has no bundle id (field 2); expected \(policy.bundleId)")
        }
        if bundle != policy.bundleId {
            throw VerificationError(.wrongBundleId, "bundle id (field 2) is \(bundle); expected \(policy.bundleId)")
        }
        try checkEnvironmentValue(env, field: "receipt type (field 0)")
        if env == .production {
            guard let expected = policy.appAppleId else {
                throw VerificationError(.wrongAppAppleId, "Production receipt but no appAppleId is configured")
            }
            guard let id = receipt.appAppleId else {
                throw VerificationError(.wrongAppAppleId, "Production receipt without an app id (field 1); expected \(expected)")
            }
            if id != expected {
                throw VerificationError(.wrongAppAppleId, "app id (field 1) is \(id); expected \(expected)")
            }
        }
        return VerifiedAppReceipt(payload: receipt)
    }

    // MARK: - Chain

    /// The signer's verified chain, from the cache when this exact sid + certificate set was verified before (looked
    /// up by those bytes, before any certificate is parsed).
    func receiptChain(
        _ signed: PKCS7SignedData, validationTime: Int64, spanKeyInput: UnsafeBufferPointer<UInt8>? = nil
    ) throws(VerificationError) -> VerifiedChain {
        let si = signed.signerInfo
        var keyBytes = Self.receiptKeyPrefix(Self.receiptTag, si, reserving: signed.certificateSetDER.count)
        keyBytes.append(contentsOf: signed.certificateSetDER)
        let key = ChainCacheKey(bytes: keyBytes)
        // The fast path's key for the same chain, when it missed (built from the same certificate set's range).
        let spanKey = spanKeyInput.flatMap { Self.receiptSpanKey($0, signed.certificateSetDER.indices, si) }
        if let cache = chainCache, let c = cache.lookup(key), isTrusted(c.rootFingerprint) {
            if let spanKey { cache.insert(spanKey, c) }
            return c
        }
        try signed.validateCertificates()
        var certificates: [Certificate] = []
        for (i, der) in signed.certificates.enumerated() {
            do { certificates.append(try Certificate(derEncoded: der)) } catch {
                throw VerificationError(.untrustedChain, "certificate \(i) of the SignedData is not a valid X.509 certificate: \(SignedDataVerifier.certificateError(error))")
            }
        }
        guard let leafIndex = Self.signerIndex(si, certificates) else {
            throw VerificationError(.untrustedChain, "the signer's certificate (SignerInfo sid) is not in the SignedData's certificate set")
        }
        var intermediates = certificates
        let leaf = intermediates.remove(at: leafIndex)
        // RFC 5280 at this receipt's validation time; a cached chain is checked against its window per receipt.
        let r = try chainVerifier.verify(leaf: leaf, intermediates: intermediates, validationTime: validationTime)
        let chain = VerifiedChain(
            leafCertificateKey: r.leafKey, notBeforeMillis: r.notBeforeMillis, notAfterMillis: r.notAfterMillis,
            rootFingerprint: r.anchor.fingerprint, certificates: r.certificates)
        chainCache?.insert(key, chain)
        if let spanKey { chainCache?.insert(spanKey, chain) }
        return chain
    }

    /// The start of a receipt's chain-cache key: `tag`, then the signer's issuer and sid, each length-prefixed so that
    /// no two (issuer, sid, rest) triples give the same key; room is reserved for `extra` more bytes.
    static func receiptKeyPrefix(_ tag: UInt8, _ si: PKCS7SignedData.SignerInfo, reserving extra: Int) -> [UInt8] {
        let sid = si.serialNumber ?? si.subjectKeyIdentifier ?? []
        let issuer = si.issuerDER ?? []
        var keyBytes: [UInt8] = []
        keyBytes.reserveCapacity(9 + issuer.count + sid.count + extra)
        keyBytes.append(tag)
        withUnsafeBytes(of: UInt32(issuer.count).bigEndian) { keyBytes.append(contentsOf: $0) }
        keyBytes.append(contentsOf: issuer)
        withUnsafeBytes(of: UInt32(sid.count).bigEndian) { keyBytes.append(contentsOf: $0) }
        keyBytes.append(contentsOf: sid)
        return keyBytes
    }

    /// The signer's key of a (possibly cached) chain, once the chain's window holds the validation time.
    static func signerKey(_ chain: VerifiedChain, at validationTime: Int64) throws(VerificationError) -> Certificate.PublicKey {
        if !chain.isValid(atMillis: validationTime) {
            throw VerificationError(
                .certificateNotValidAtTime,
                "validation time \(iso(validationTime)) is outside the chain's validity "
                    + "[\(iso(chain.notBeforeMillis)), \(iso(chain.notAfterMillis))]")
        }
        guard let key = chain.leafCertificateKey else {
            throw VerificationError(.untrustedChain, "the cached chain has no signer key")
        }
        return key
    }

    static func signerIndex(_ si: PKCS7SignedData.SignerInfo, _ certs: [Certificate]) -> Int? {
        for (i, c) in certs.enumerated() {
            if let serial = si.serialNumber, let issuer = si.issuerDER {
                var s = DER.Serializer()
                guard (try? s.serialize(c.issuer)) != nil else { continue }
                if s.serializedBytes[...] == issuer && c.serialNumber.bytes == serial { return i }
            } else if let ski = si.subjectKeyIdentifier {
                if let id = try? c.extensions.subjectKeyIdentifier, id.keyIdentifier == ski { return i }
            }
        }
        return nil
    }

    // MARK: - Signature

    typealias OID = PKCS7SignedData.OID
    static let sha1OID = OID([1, 3, 14, 3, 2, 26])
    static let sha256OID = OID([2, 16, 840, 1, 101, 3, 4, 2, 1])
    static let sha384OID = OID([2, 16, 840, 1, 101, 3, 4, 2, 2])
    static let sha512OID = OID([2, 16, 840, 1, 101, 3, 4, 2, 3])
    static let rsaEncryptionOID = OID([1, 2, 840, 113549, 1, 1, 1])
    static let rsaWithHash: [OID: OID] = [
        OID([1, 2, 840, 113549, 1, 1, 5]): sha1OID, OID([1, 2, 840, 113549, 1, 1, 11]): sha256OID,
        OID([1, 2, 840, 113549, 1, 1, 12]): sha384OID, OID([1, 2, 840, 113549, 1, 1, 13]): sha512OID,
    ]

    /// The digests a SignerInfo may name.
    enum ReceiptDigest {
        case sha1, sha256, sha384, sha512

        init?(_ oid: OID) {
            switch oid {
            case sha1OID: self = .sha1
            case sha256OID: self = .sha256
            case sha384OID: self = .sha384
            case sha512OID: self = .sha512
            default: return nil
            }
        }

        var signatureAlgorithm: Certificate.SignatureAlgorithm {
            switch self {
            case .sha1: return .sha1WithRSAEncryption
            case .sha256: return .sha256WithRSAEncryption
            case .sha384: return .sha384WithRSAEncryption
            case .sha512: return .sha512WithRSAEncryption
            }
        }

        func hash(_ bytes: ArraySlice<UInt8>) -> [UInt8] {
            switch self {
            case .sha1: return Array(Insecure.SHA1.hash(data: bytes))
            case .sha256: return Array(SHA256.hash(data: bytes))
            case .sha384: return Array(SHA384.hash(data: bytes))
            case .sha512: return Array(SHA512.hash(data: bytes))
            }
        }

        /// RSA PKCS#1 v1.5 with this digest over `bytes`: what swift-certificates' `isValidSignature` does for the
        /// `sha*WithRSAEncryption` algorithms, called directly on the unwrapped key.
        func verify(_ key: _RSA.Signing.PublicKey, _ signature: ArraySlice<UInt8>, over bytes: ArraySlice<UInt8>) -> Bool {
            // From a Data made of the bytes directly (the generic ArraySlice path casts dynamically per call).
            let sig = _RSA.Signing.RSASignature(
                rawRepresentation: signature.withUnsafeBytes { p in p.isEmpty ? Data() : Data(bytes: p.baseAddress!, count: p.count) })
            return bytes.withUnsafeBytes { b in
                switch self {
                case .sha1: return key.isValidSignature(sig, for: Insecure.SHA1.hash(data: b), padding: .insecurePKCS1v1_5)
                case .sha256: return key.isValidSignature(sig, for: SHA256.hash(data: b), padding: .insecurePKCS1v1_5)
                case .sha384: return key.isValidSignature(sig, for: SHA384.hash(data: b), padding: .insecurePKCS1v1_5)
                case .sha512: return key.isValidSignature(sig, for: SHA512.hash(data: b), padding: .insecurePKCS1v1_5)
                }
            }
        }
    }

    /// Checks the SignerInfo's RSA signature with the signer's key (unwrapped: swift-crypto is called directly).
    static func checkReceiptSignature(_ signed: PKCS7SignedData, key: Certificate.PublicKey) throws(VerificationError) {
        let si = signed.signerInfo
        let digestOID = si.digestAlgorithm.oid
        guard let digest = ReceiptDigest(digestOID) else {
            throw VerificationError(.invalidSignature, "SignerInfo digest algorithm \(digestOID) is not SHA-1/256/384/512")
        }
        let sigOID = si.signatureAlgorithm.oid
        if sigOID != rsaEncryptionOID {
            guard let named = rsaWithHash[sigOID] else {
                throw VerificationError(
                    .invalidSignature, "SignerInfo signature algorithm \(sigOID) is not RSA PKCS#1 v1.5")
            }
            guard named == digestOID else {
                throw VerificationError(
                    .invalidSignature, "SignerInfo signature algorithm \(sigOID) disagrees with digest algorithm \(digestOID)")
            }
        }
        let signedBytes: ArraySlice<UInt8>
        if let attrs = si.signedAttributesDER {
            // RFC 5652 §5.4: the content-type and message-digest attributes must be present and match.
            guard let md = si.signedAttributes.first(where: { $0.0 == PKCS7SignedData.messageDigestAttributeOID }),
                md.1.count == 1
            else {
                throw VerificationError(.invalidSignature, "signed attributes without exactly one message-digest value")
            }
            let expected = [UInt8](ASN1OctetString(contentBytes: ArraySlice(digest.hash(signed.content))).derBytes)
            guard md.1[0].elementsEqual(expected) else {
                throw VerificationError(.invalidSignature, "message-digest attribute does not match the receipt content")
            }
            guard let ct = si.signedAttributes.first(where: { $0.0 == PKCS7SignedData.contentTypeAttributeOID }),
                ct.1.count == 1, ct.1[0] == PKCS7SignedData.dataOID.der
            else {
                throw VerificationError(.invalidSignature, "signed attributes without a content-type attribute of id-data")
            }
            signedBytes = attrs[...]
        } else {
            signedBytes = signed.content
        }
        guard let rsa = _RSA.Signing.PublicKey(key) else {
            throw VerificationError(.invalidSignature, "the signer certificate's key is not RSA; receipts are signed with RSA")
        }
        guard digest.verify(rsa, si.signature, over: signedBytes) else {
            throw VerificationError(
                .invalidSignature,
                "RSA PKCS#1 v1.5 \(digest.signatureAlgorithm) signature does not verify with the signer certificate's key")
        }
    }
}

extension ASN1OctetString {
    var derBytes: [UInt8] {
        var s = DER.Serializer()
        try? s.serialize(self)
        return s.serializedBytes
    }
}
