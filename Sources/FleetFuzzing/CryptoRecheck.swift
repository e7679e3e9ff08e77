import AppStoreVerification
import Crypto
import SwiftASN1
import X509
import _CryptoExtras

/// Re-checks a verified verdict with swift-crypto directly, on the same bytes, sharing no code with the verifier
/// beyond the JSON and PKCS#7 field readers (base64 goes through `Reference`, the signatures through swift-crypto).
/// Returns nil when the input really is signed by the chain, else what does not hold.
enum CryptoRecheck {
    static func jws(_ jws: [UInt8], roots: [TrustedRoot]) -> String? {
        let parts = jws.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard parts.count == 3 else { return "not three segments" }
        guard let headerBytes = Reference.decodeBase64(Array(parts[0]), url: true),
              let header = try? JSONValue.parse(bytes: headerBytes)
        else { return "header is not base64url JSON" }
        guard header["alg"]?.stringValue == "ES256" else { return "alg is not ES256" }
        guard let x5c = header["x5c"]?.arrayValue, x5c.count == 3 else { return "x5c is not three certificates" }
        var certs: [Certificate] = []
        for entry in x5c.prefix(2) {
            guard let s = entry.stringValue, let der = Reference.decodeBase64(Array(s.utf8), url: false),
                  let cert = try? Certificate(derEncoded: der)
            else { return "an x5c entry is not a base64 DER certificate" }
            certs.append(cert)
        }
        guard let leafKey = P256.Signing.PublicKey(certs[0].publicKey) else { return "leaf key is not P-256" }
        guard let sigBytes = Reference.decodeBase64(Array(parts[2]), url: true), sigBytes.count == 64,
              let signature = try? P256.Signing.ECDSASignature(rawRepresentation: sigBytes)
        else { return "signature is not 64 raw bytes" }
        let signingInput = Array(jws[0..<(parts[0].count + 1 + parts[1].count)])
        guard leafKey.isValidSignature(signature, for: signingInput) else { return "ES256 signature does not verify" }
        guard certs[1].publicKey.isValidSignature(certs[0].signature, for: certs[0]) else {
            return "leaf is not signed by x5c[1]"
        }
        guard roots.contains(where: { $0.certificate.publicKey.isValidSignature(certs[1].signature, for: certs[1]) }) else {
            return "x5c[1] is not signed by a trusted root"
        }
        return nil
    }

    static let sha1: ASN1ObjectIdentifier = [1, 3, 14, 3, 2, 26]
    static let sha256: ASN1ObjectIdentifier = [2, 16, 840, 1, 101, 3, 4, 2, 1]
    static let sha384: ASN1ObjectIdentifier = [2, 16, 840, 1, 101, 3, 4, 2, 2]
    static let sha512: ASN1ObjectIdentifier = [2, 16, 840, 1, 101, 3, 4, 2, 3]

    static func receipt(der: [UInt8], roots: [TrustedRoot]) -> String? {
        guard let signed = try? PKCS7SignedData(der: der) else { return "not a SignedData" }
        let si = signed.signerInfo
        var certs: [Certificate] = []
        for d in signed.certificates {
            guard let c = try? Certificate(derEncoded: d) else { return "a certificate of the set does not parse" }
            certs.append(c)
        }
        let signer = certs.firstIndex { c in
            if let serial = si.serialNumber, let issuer = si.issuerDER {
                var s = DER.Serializer()
                guard (try? s.serialize(c.issuer)) != nil else { return false }
                return s.serializedBytes == Array(issuer) && Array(c.serialNumber.bytes) == Array(serial)
            }
            if let ski = si.subjectKeyIdentifier, let id = try? c.extensions.subjectKeyIdentifier {
                return Array(id.keyIdentifier) == Array(ski)
            }
            return false
        }
        guard let signer else { return "no certificate of the set is the signer" }
        let leaf = certs[signer]
        guard let key = _RSA.Signing.PublicKey(leaf.publicKey) else { return "signer key is not RSA" }
        let content = si.signedAttributesDER ?? Array(signed.content)
        guard let digestOID = try? ASN1ObjectIdentifier(derEncoded: si.digestAlgorithm.oid.der) else { return "digest algorithm OID does not parse" }
        if si.signedAttributesDER != nil {
            guard let md = si.signedAttributes.first(where: { $0.0 == PKCS7SignedData.messageDigestAttributeOID }),
                  md.1.count == 1, let value = try? ASN1OctetString(derEncoded: md.1[0]),
                  let expected = hash(digestOID, Array(signed.content)), Array(value.bytes) == expected
            else { return "message-digest attribute does not match the content" }
        }
        let signature = _RSA.Signing.RSASignature(rawRepresentation: si.signature)
        let valid: Bool
        switch digestOID {
        case sha1: valid = key.isValidSignature(signature, for: Insecure.SHA1.hash(data: content), padding: .insecurePKCS1v1_5)
        case sha256: valid = key.isValidSignature(signature, for: SHA256.hash(data: content), padding: .insecurePKCS1v1_5)
        case sha384: valid = key.isValidSignature(signature, for: SHA384.hash(data: content), padding: .insecurePKCS1v1_5)
        case sha512: valid = key.isValidSignature(signature, for: SHA512.hash(data: content), padding: .insecurePKCS1v1_5)
        default: return "digest algorithm is not SHA-1/256/384/512"
        }
        guard valid else { return "RSA PKCS#1 v1.5 signature does not verify" }
        // The signer chains through a certificate of the set to a trusted root (signatures only; names, windows and
        // extensions are the verifier's business and are tested elsewhere).
        let chained = certs.indices.contains { i in
            i != signer && certs[i].publicKey.isValidSignature(leaf.signature, for: leaf)
                && roots.contains { $0.certificate.publicKey.isValidSignature(certs[i].signature, for: certs[i]) }
        }
        return chained ? nil : "signer does not chain to a trusted root through the set"
    }

    static func hash(_ oid: ASN1ObjectIdentifier, _ bytes: [UInt8]) -> [UInt8]? {
        switch oid {
        case sha1: return Array(Insecure.SHA1.hash(data: bytes))
        case sha256: return Array(SHA256.hash(data: bytes))
        case sha384: return Array(SHA384.hash(data: bytes))
        case sha512: return Array(SHA512.hash(data: bytes))
        default: return nil
        }
    }
}

/// Deliberately simple reference implementations the invariants compare against.
enum Reference {
    static func isSpace(_ c: UInt8) -> Bool { c == 0x20 || c == 0x0A || c == 0x0D || c == 0x09 }

    static func trimmed(_ b: [UInt8]) -> [UInt8] {
        var lo = 0, hi = b.count
        while lo < hi && isSpace(b[lo]) { lo += 1 }
        while hi > lo && isSpace(b[hi - 1]) { hi -= 1 }
        return Array(b[lo..<hi])
    }

    /// Bit-by-bit base64: `url` = unpadded (JWS segments), else padded to a multiple of 4; canonical only (the bits
    /// below the last full byte are zero). `urlAlphabet` picks `-_` instead of `+/`.
    static func decodeBase64(_ s: [UInt8], url: Bool, urlAlphabet: Bool? = nil) -> [UInt8]? {
        let useURL = urlAlphabet ?? url
        var body = s[...]
        if !url {
            guard s.count % 4 == 0 else { return nil }
            var pads = 0
            while pads < 2, body.last == UInt8(ascii: "=") { body = body.dropLast(); pads += 1 }
        }
        if body.count % 4 == 1 { return nil }
        var bits: [Bool] = []
        for c in body {
            let v: Int
            switch c {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): v = Int(c) - 65
            case UInt8(ascii: "a")...UInt8(ascii: "z"): v = Int(c) - 97 + 26
            case UInt8(ascii: "0")...UInt8(ascii: "9"): v = Int(c) - 48 + 52
            case UInt8(ascii: "+") where !useURL, UInt8(ascii: "-") where useURL: v = 62
            case UInt8(ascii: "/") where !useURL, UInt8(ascii: "_") where useURL: v = 63
            default: return nil
            }
            for k in stride(from: 5, through: 0, by: -1) { bits.append(v >> k & 1 == 1) }
        }
        var out: [UInt8] = []
        var i = 0
        while i + 8 <= bits.count {
            var byte: UInt8 = 0
            for k in 0..<8 where bits[i + k] { byte |= 1 << (7 - k) }
            out.append(byte)
            i += 8
        }
        if bits[i...].contains(true) { return nil }
        return out
    }

    /// The JWS inside a verified non-receipt input: the bare text, or the `signedPayload` of a JSON body.
    static func outerJWS(_ text: [UInt8]) -> [UInt8]? {
        guard let first = text.first else { return nil }
        if first != UInt8(ascii: "{") { return text }
        guard let body = try? JSONValue.parse(bytes: text), let sp = body["signedPayload"]?.stringValue else { return nil }
        return Array(sp.utf8)
    }

    /// The base64 of a verified receipt input: the bare line, or the `receipt-data` of a JSON body.
    static func receiptBase64(_ text: [UInt8]) -> [UInt8]? {
        guard let first = text.first else { return nil }
        if first != UInt8(ascii: "{") { return text }
        guard let body = try? JSONValue.parse(bytes: text), let rd = body["receipt-data"]?.stringValue else { return nil }
        return Array(rd.utf8)
    }
}
