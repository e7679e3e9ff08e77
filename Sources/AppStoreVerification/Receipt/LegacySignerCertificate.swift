import Foundation
import SwiftASN1
import _CryptoExtras
import X509

/// The signer certificate of a StoreKit 1 transaction receipt ("PurchaseReceiptCertificate"), checked by hand against
/// its issuer: its key is RSA-1024 (the signature is 128 bytes), which swift-certificates' `Certificate` refuses to
/// parse (it needs 2048 bits), so this one link (signer -> configured intermediate) follows RFC 5280 here, and the
/// intermediate -> root link goes through swift-certificates' `Verifier`.
///
/// Rules: strict DER `Certificate` (v3, no unique ids), the inner and outer signature algorithms equal and
/// sha1WithRSAEncryption or sha256WithRSAEncryption, issuer = the intermediate's subject and the signature valid
/// with its key, validity window (UTCTime / GeneralizedTime), no unknown critical extension, basic constraints not a
/// CA, key usage (where present) with digitalSignature, Apple's marker 1.2.840.113635.100.6.5.1, an RSA key of at
/// least 1024 bits.
struct LegacySignerCertificate {
    let tbs: [UInt8]
    let signatureAlgorithm: Certificate.SignatureAlgorithm
    let signature: [UInt8]
    let issuer: DistinguishedName
    let subject: DistinguishedName
    let notBeforeMillis: Int64
    let notAfterMillis: Int64
    let extensions: Certificate.Extensions
    let publicKey: Certificate.PublicKey

    static let markerOID: ASN1ObjectIdentifier = [1, 2, 840, 113635, 100, 6, 5, 1]
    static let sha1WithRSA: ASN1ObjectIdentifier = [1, 2, 840, 113549, 1, 1, 5]
    static let sha256WithRSA: ASN1ObjectIdentifier = [1, 2, 840, 113549, 1, 1, 11]
    static let basicConstraintsOID: ASN1ObjectIdentifier = [2, 5, 29, 19]
    static let keyUsageOID: ASN1ObjectIdentifier = [2, 5, 29, 15]

    static func fail(_ detail: String) -> VerificationError {
        VerificationError(.untrustedChain, "transactionReceipt signer certificate: \(detail)")
    }

    init(der: [UInt8]) throws(VerificationError) {
        do {
            let root = try DER.parse(der)
            var certificate = try Self.children(root)
            guard let tbsNode = certificate.next(), let algNode = certificate.next(), let sigNode = certificate.next(),
                certificate.next() == nil
            else { throw Self.fail("not a Certificate SEQUENCE of three elements") }
            let outerAlg = try Self.algorithm(algNode)
            let sig = try ASN1BitString(derEncoded: sigNode)
            guard sig.paddingBits == 0 else { throw Self.fail("signature BIT STRING has padding bits") }
            signature = Array(sig.bytes)
            tbs = Array(tbsNode.encodedBytes)

            var t = try Self.children(tbsNode)
            var node = t.next()
            if let v = node, v.identifier == ASN1Identifier(tagWithNumber: 0, tagClass: .contextSpecific) {
                var inner = try Self.children(v)
                guard let n = inner.next(), inner.next() == nil, try Int(derEncoded: n) == 2 else {
                    throw Self.fail("version is not v3")
                }
                node = t.next()
            } else {
                throw Self.fail("version is not v3")
            }
            guard let serial = node else { throw Self.fail("no serial number") }
            _ = try ArraySlice<UInt8>(derEncoded: serial)
            guard let innerAlgNode = t.next(), try Self.algorithm(innerAlgNode) == outerAlg else {
                throw Self.fail("the inner signature algorithm differs from the outer one")
            }
            switch outerAlg {
            case Self.sha1WithRSA: signatureAlgorithm = .sha1WithRSAEncryption
            case Self.sha256WithRSA: signatureAlgorithm = .sha256WithRSAEncryption
            default: throw Self.fail("signature algorithm \(outerAlg) is not sha1/sha256WithRSAEncryption")
            }
            guard let issuerNode = t.next(), let validityNode = t.next(), let subjectNode = t.next(),
                let spkiNode = t.next()
            else { throw Self.fail("TBSCertificate is incomplete") }
            issuer = try DistinguishedName(derEncoded: issuerNode)
            subject = try DistinguishedName(derEncoded: subjectNode)
            var validity = try Self.children(validityNode)
            guard let nb = validity.next(), let na = validity.next(), validity.next() == nil else {
                throw Self.fail("validity is not two times")
            }
            notBeforeMillis = try Self.millis(nb)
            notAfterMillis = try Self.millis(na)
            guard spkiNode.identifier == .sequence else { throw Self.fail("no SubjectPublicKeyInfo") }
            do {
                publicKey = Certificate.PublicKey(try _RSA.Signing.PublicKey(unsafeDERRepresentation: Array(spkiNode.encodedBytes)))
            } catch {
                throw Self.fail("the key is not an RSA key of at least 1024 bits: \(error)")
            }
            var extensions: [Certificate.Extension] = []
            if let e = t.next() {
                guard e.identifier == ASN1Identifier(tagWithNumber: 3, tagClass: .contextSpecific) else {
                    throw Self.fail("unexpected element (unique identifiers are not allowed) in TBSCertificate")
                }
                var wrapper = try Self.children(e)
                guard let list = wrapper.next(), wrapper.next() == nil else { throw Self.fail("bad extensions wrapper") }
                var items = try Self.children(list)
                while let item = items.next() { extensions.append(try Certificate.Extension(derEncoded: item)) }
                guard !extensions.isEmpty else { throw Self.fail("empty extensions") }
            }
            guard t.next() == nil else { throw Self.fail("trailing elements in TBSCertificate") }
            self.extensions = try Certificate.Extensions(extensions)
        } catch let e as VerificationError {
            throw e
        } catch {
            throw Self.fail("not a strict DER X.509 certificate: \(error)")
        }
    }

    static func children(_ node: ASN1Node) throws(VerificationError) -> ASN1NodeCollection.Iterator {
        guard case .constructed(let c) = node.content else { throw fail("expected a constructed element") }
        return c.makeIterator()
    }

    static func algorithm(_ node: ASN1Node) throws -> ASN1ObjectIdentifier {
        var a = try children(node)
        guard let o = a.next() else { throw fail("empty AlgorithmIdentifier") }
        let oid = try ASN1ObjectIdentifier(derEncoded: o)
        if let p = a.next() {
            // RSA algorithms take a NULL parameter (or none).
            _ = try ASN1Null(derEncoded: p)
            guard a.next() == nil else { throw fail("AlgorithmIdentifier has trailing elements") }
        }
        return oid
    }

    static func millis(_ node: ASN1Node) throws -> Int64 {
        let c: (Int, Int, Int, Int, Int, Int)
        if node.identifier == .utcTime {
            let t = try UTCTime(derEncoded: node)
            c = (t.year, t.month, t.day, t.hours, t.minutes, t.seconds)
        } else {
            let t = try GeneralizedTime(derEncoded: node)
            c = (t.year, t.month, t.day, t.hours, t.minutes, t.seconds)
        }
        return ReceiptDate.epochMillis(year: c.0, month: c.1, day: c.2, hour: c.3, minute: c.4, second: c.5)
    }

    /// The RFC 5280 checks of this certificate as issued by `issuerCertificate` at `validationTime` (ms).
    func check(issuedBy issuerCertificate: Certificate, at validationTime: Int64) throws(VerificationError) {
        guard issuer == issuerCertificate.subject else {
            throw Self.fail("issuer \(issuer) is not the intermediate \(issuerCertificate.subject)")
        }
        guard issuerCertificate.publicKey.isValidSignature(signature, for: tbs, signatureAlgorithm: signatureAlgorithm) else {
            throw Self.fail("its signature does not verify with the key of \(issuerCertificate.subject)")
        }
        for e in extensions where e.critical {
            guard [Self.basicConstraintsOID, Self.keyUsageOID, Self.markerOID].contains(e.oid) else {
                throw Self.fail("unhandled critical extension \(e.oid)")
            }
        }
        do {
            if case .isCertificateAuthority = try extensions.basicConstraints {
                throw Self.fail("it is a CA certificate, not a signer")
            }
            if let ku = try extensions.keyUsage, !ku.digitalSignature {
                throw Self.fail("key usage does not allow digitalSignature")
            }
        } catch let e as VerificationError {
            throw e
        } catch {
            throw Self.fail("invalid basic constraints or key usage: \(error)")
        }
        if extensions[oid: Self.markerOID] == nil {
            throw VerificationError(
                .missingAppleOID, "transactionReceipt signer lacks Apple's marker extension 1.2.840.113635.100.6.5.1")
        }
        if validationTime < notBeforeMillis || validationTime > notAfterMillis {
            throw VerificationError(
                .certificateNotValidAtTime,
                "validation time \(SignedDataVerifier.iso(validationTime)) is outside the validity of \(subject) "
                    + "[\(SignedDataVerifier.iso(notBeforeMillis)), \(SignedDataVerifier.iso(notAfterMillis))]")
        }
    }
}
