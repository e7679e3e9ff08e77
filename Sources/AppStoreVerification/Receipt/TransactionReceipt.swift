import Crypto
import Foundation
import SwiftASN1
@_spi(FixedExpiryValidationTime) import X509

/// StoreKit 1 `transactionReceipt`s (the deprecated `SKPaymentTransaction.transactionReceipt` of seed 004), verified
/// locally when their signer's issuer is configured as a trusted intermediate.
///
/// Format (checked on the real one in ../shared/fixtures/apple-receipts): base64 of an old-style (NeXTSTEP) plist
/// `{ "signature" = "<base64>"; "purchase-info" = "<base64>"; "environment" = "Sandbox"; "pod" = ...; }`.
/// `signature` decodes to: 1 byte version (2), 128 bytes RSA PKCS#1 v1.5 SHA-1 signature over (the version byte +
/// the decoded purchase-info), 4 bytes big-endian length, then the DER signer certificate ("PurchaseReceiptCertificate",
/// issued by "Apple iTunes Store Certification Authority", which is not in the receipt). `purchase-info` decodes to
/// another such plist of the purchase: `bid`, `transaction-id`, `original-transaction-id`, `product-id`, `quantity`,
/// `purchase-date-ms`, `original-purchase-date-ms`, `expires-date` (ms), `web-order-line-item-id`, `app-item-id`
/// (Production), `bvrs`.
///
/// Checks, in order: the configured intermediates (none: `LEGACY_TRANSACTION_RECEIPT_UNSUPPORTED`, saying what to
/// configure); base64 and both plists (`MALFORMED_RECEIPT`); version 2; the chain signer -> a configured
/// intermediate (`LegacySignerCertificate`: the signer's key is RSA-1024, which swift-certificates does not parse)
/// -> a configured root (swift-certificates' `Verifier`, RFC 5280), all at the purchase date, with Apple's markers on
/// these certificates (1.2.840.113635.100.6.5.1 on the signer, 1.2.840.113635.100.6.2.2 on the intermediate), through
/// the shared chain cache; the signature; then bundle id (`bid`), environment and app id.
/// The outer `environment` is not signed, so a signed non-zero `app-item-id` always means Production (a Production
/// purchase cannot be relabelled Sandbox), and Production needs `app-item-id` = the configured app id.
/// The result is an `appReceipt` with one in-app entry (`form` = `transactionReceipt`), mapped like a receipt entry.
extension SignedDataVerifier {
    static let transactionReceiptTag: UInt8 = 0x54  // 'T': trusted intermediates + signer certificate
    static let maxPlistEntries = 64
    /// Apple's marker on "Apple iTunes Store Certification Authority" (seen on the real one); the signer's is
    /// 1.2.840.113635.100.6.5.1 (`LegacySignerCertificate`).
    static let transactionReceiptIntermediateOID: ASN1ObjectIdentifier = [1, 2, 840, 113635, 100, 6, 2, 2]

    func verifyTransactionReceipt(base64 input: UnsafeBufferPointer<UInt8>) throws(VerificationError) -> VerifiedAppReceipt {
        if policy.trustedIntermediates.isEmpty {
            throw VerificationError(
                .legacyTransactionReceiptUnsupported,
                "input is a StoreKit 1 transactionReceipt (old-style plist with signature and purchase-info), not an "
                    + "app receipt; its signer is issued by \"Apple iTunes Store Certification Authority\", which is not "
                    + "configured: add that certificate with --trusted-intermediate (config key trusted-intermediate) to "
                    + "verify these, or send the app receipt (Bundle.main.appStoreReceiptURL) or the StoreKit 2 JWS")
        }
        if input.count > policy.maxReceiptBytes {
            throw VerificationError(
                .payloadTooLarge, "receipt is \(input.count) bytes; the limit is \(policy.maxReceiptBytes) bytes")
        }
        func malformed(_ detail: String) -> VerificationError {
            VerificationError(.malformedReceipt, "transactionReceipt: \(detail)")
        }
        guard let text = Self.decodeBase64Lenient(input) else { throw malformed("not valid padded standard base64") }
        let outer = try Self.plist(text, "the receipt")
        guard let signatureText = outer["signature"], let infoText = outer["purchase-info"] else {
            throw malformed("the plist has no signature or no purchase-info")
        }
        guard let blob = signatureText.withUnsafeBufferPointer({ Base64.decodeStandard($0) }) else { throw malformed("signature is not valid base64") }
        guard let info = infoText.withUnsafeBufferPointer({ Base64.decodeStandard($0) }) else { throw malformed("purchase-info is not valid base64") }
        guard blob.count > 133 else { throw malformed("signature is too short (\(blob.count) bytes)") }
        guard blob[0] == 2 else {
            throw VerificationError(
                .legacyTransactionReceiptUnsupported,
                "transactionReceipt signature version \(blob[0]) is not supported (version 2: 128-byte RSA SHA-1)")
        }
        var certLength = 0
        for k in 129..<133 { certLength = certLength << 8 | Int(blob[k]) }
        guard certLength == blob.count - 133 else {
            throw malformed("signature's certificate length \(certLength) does not match the \(blob.count - 133) bytes left")
        }
        let purchase = try Self.plist(info, "purchase-info")

        func number(_ key: String) throws(VerificationError) -> Int64? {
            guard let v = purchase[key] else { return nil }
            let s = String(decoding: v, as: UTF8.self)
            guard !s.isEmpty, s.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }), let n = Int64(s) else {
                throw malformed("purchase-info \(key) is not a decimal number: \(s)")
            }
            return n
        }
        func string(_ key: String) throws(VerificationError) -> String? {
            guard let v = purchase[key] else { return nil }
            guard let s = String(validating: v, as: UTF8.self) else { throw malformed("purchase-info \(key) is not UTF-8") }
            return s
        }
        func flag(_ key: String) throws(VerificationError) -> Bool? {
            switch try string(key) {
            case nil: return nil
            case "true": return true
            case "false": return false
            case let other?: throw malformed("purchase-info \(key) is neither true nor false: \(other)")
            }
        }
        var entry = AppReceiptInApp()
        entry.transactionId = try string("transaction-id")
        entry.originalTransactionId = try string("original-transaction-id")
        entry.productId = try string("product-id")
        entry.quantity = try number("quantity")
        entry.purchaseDate = try number("purchase-date-ms")
        entry.originalPurchaseDate = try number("original-purchase-date-ms")
        entry.expiresDate = try number("expires-date")
        entry.cancellationDate = try number("cancellation-date-ms")
        entry.webOrderLineItemId = try number("web-order-line-item-id")
        entry.isTrialPeriod = try flag("is-trial-period")
        entry.isInIntroOfferPeriod = try flag("is-in-intro-offer-period")
        guard entry.transactionId != nil, let purchased = entry.purchaseDate else {
            throw malformed("purchase-info has no transaction-id or no purchase-date-ms")
        }
        let appItemId = try number("app-item-id")
        let production = (appItemId ?? 0) != 0 || outer["environment"].map { String(decoding: $0, as: UTF8.self) } != "Sandbox"
        var receipt = AppReceipt()
        receipt.form = "transactionReceipt"
        receipt.receiptType = production ? "Production" : "ProductionSandbox"
        receipt.appAppleId = appItemId
        receipt.bundleId = try string("bid")
        receipt.applicationVersion = try string("bvrs")
        receipt.receiptCreationDate = purchased
        receipt.inApp = [entry]

        let validationTime = policy.validationTime == .now ? now() : purchased
        let certificate = Array(blob[133...])
        let key = try Self.signerKey(
            try transactionReceiptChain(certificate, validationTime: validationTime), at: validationTime)
        let signedBytes: [UInt8] = [blob[0]] + info
        guard key.isValidSignature(blob[1..<129], for: signedBytes, signatureAlgorithm: Certificate.SignatureAlgorithm.sha1WithRSAEncryption) else {
            throw VerificationError(
                .invalidSignature, "transactionReceipt RSA PKCS#1 v1.5 SHA-1 signature does not verify with the signer's key")
        }

        guard let bundle = receipt.bundleId else {
            throw VerificationError(.wrongBundleId, "transactionReceipt has no bid; expected \(policy.bundleId)")
        }
        if bundle != policy.bundleId {
            throw VerificationError(.wrongBundleId, "transactionReceipt bid is \(bundle); expected \(policy.bundleId)")
        }
        try checkEnvironmentValue(receipt.environment, field: "transactionReceipt environment")
        if production {
            guard let expected = policy.appAppleId else {
                throw VerificationError(.wrongAppAppleId, "Production transactionReceipt but no appAppleId is configured")
            }
            guard appItemId == expected else {
                throw VerificationError(
                    .wrongAppAppleId, "transactionReceipt app-item-id is \(appItemId.map(String.init) ?? "absent"); expected \(expected)")
            }
        }
        return VerifiedAppReceipt(payload: receipt)
    }

    /// The signer's chain through a configured intermediate to a configured root (cached by the signer certificate
    /// and the configured intermediates).
    func transactionReceiptChain(_ der: [UInt8], validationTime: Int64) throws(VerificationError) -> VerifiedChain {
        var keyBytes: [UInt8] = [Self.transactionReceiptTag]
        for i in policy.trustedIntermediates { keyBytes += i.fingerprint }
        keyBytes += der
        let cacheKey = ChainCacheKey(bytes: keyBytes)
        if let cache = chainCache, let c = cache.lookup(cacheKey), isTrusted(c.rootFingerprint) {
            return c
        }
        let leaf = try LegacySignerCertificate(der: der)
        guard let intermediate = policy.trustedIntermediates.first(where: { $0.certificate.subject == leaf.issuer }) else {
            throw VerificationError(
                .untrustedChain,
                "transactionReceipt signer's issuer \(leaf.issuer) is not a configured trusted intermediate (--trusted-intermediate)")
        }
        let ca = intermediate.certificate
        try leaf.check(issuedBy: ca, at: validationTime)
        if ca.extensions[oid: Self.transactionReceiptIntermediateOID] == nil {
            throw VerificationError(
                .missingAppleOID, "intermediate \(ca.subject) lacks Apple's marker extension 1.2.840.113635.100.6.2.2")
        }
        do {
            guard case .isCertificateAuthority = try ca.extensions.basicConstraints else {
                throw VerificationError(.untrustedChain, "trusted intermediate \(ca.subject) is not a CA")
            }
            if let ku = try ca.extensions.keyUsage, !ku.keyCertSign {
                throw VerificationError(.untrustedChain, "trusted intermediate \(ca.subject) key usage does not allow keyCertSign")
            }
        } catch let e as VerificationError {
            throw e
        } catch {
            throw VerificationError(.untrustedChain, "trusted intermediate \(ca.subject) has invalid extensions: \(error)")
        }
        // The intermediate -> a configured root, RFC 5280 at the same time.
        let date = EpochMillis.date(validationTime)
        let roots = policy.roots
        let outcome = SyncBridge.run {
            var verifier = Verifier(rootCertificates: CertificateStore(roots.map(\.certificate))) {
                RFC5280Policy(fixedExpiryValidationTime: date)
            }
            return await verifier.validate(leaf: ca, intermediates: CertificateStore([]))
        }
        switch outcome {
        case .validCertificate(let chain):
            let certs = Array(chain)
            guard certs.count >= 2, let top = certs.last, let anchor = roots.first(where: { $0.certificate == top }) else {
                throw VerificationError(.untrustedChain, "the trusted intermediate \(ca.subject) is not issued by a configured root")
            }
            var notBefore = leaf.notBeforeMillis
            var notAfter = leaf.notAfterMillis
            for c in certs {
                notBefore = max(notBefore, EpochMillis.millis(c.notValidBefore))
                notAfter = min(notAfter, EpochMillis.millis(c.notValidAfter))
            }
            let verified = VerifiedChain(
                leafCertificateKey: leaf.publicKey, notBeforeMillis: notBefore, notAfterMillis: notAfter,
                rootFingerprint: anchor.fingerprint)
            chainCache?.insert(cacheKey, verified)
            return verified
        case .couldNotValidate(let failures):
            throw AppleChainVerifier.map(failures, leaf: ca, intermediates: [], date: date)
        }
    }

    /// Standard base64 with whitespace ignored.
    static func decodeBase64Lenient(_ input: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        if let d = Base64.decodeStandard(input) { return d }
        let compact = input.filter { !isSpace($0) }
        return compact.withUnsafeBufferPointer { Base64.decodeStandard($0) }
    }

    static func decodeBase64Lenient(_ bytes: [UInt8]) -> [UInt8]? {
        bytes.withUnsafeBufferPointer { decodeBase64Lenient($0) }
    }

    /// A flat old-style plist dictionary of quoted strings: `{ "key" = "value"; ... }` (no escapes, no nesting, no
    /// duplicate keys, at most `maxPlistEntries`).
    static func plist(_ b: [UInt8], _ what: String) throws(VerificationError) -> [String: [UInt8]] {
        func fail(_ detail: String) -> VerificationError {
            VerificationError(.malformedReceipt, "transactionReceipt: \(what) is not an old-style plist dictionary: \(detail)")
        }
        var i = 0
        func skip() { while i < b.count && (isSpace(b[i])) { i += 1 } }
        func expect(_ c: UInt8) throws(VerificationError) {
            skip()
            guard i < b.count, b[i] == c else { throw fail("expected '\(Character(UnicodeScalar(c)))' at byte \(i)") }
            i += 1
        }
        func quoted() throws(VerificationError) -> [UInt8] {
            skip()
            guard i < b.count, b[i] == UInt8(ascii: "\"") else { throw fail("expected a quoted string at byte \(i)") }
            i += 1
            let start = i
            while i < b.count && b[i] != UInt8(ascii: "\"") {
                if b[i] == UInt8(ascii: "\\") { throw fail("escapes are not supported (byte \(i))") }
                i += 1
            }
            guard i < b.count else { throw fail("unterminated string") }
            i += 1
            return Array(b[start..<(i - 1)])
        }
        var out: [String: [UInt8]] = [:]
        try expect(UInt8(ascii: "{"))
        while true {
            skip()
            if i < b.count && b[i] == UInt8(ascii: "}") { i += 1; break }
            let key = String(decoding: try quoted(), as: UTF8.self)
            try expect(UInt8(ascii: "="))
            let value = try quoted()
            try expect(UInt8(ascii: ";"))
            if out[key] != nil { throw fail("duplicate key \(key)") }
            if out.count >= maxPlistEntries { throw fail("more than \(maxPlistEntries) entries") }
            out[key] = value
        }
        skip()
        guard i == b.count else { throw fail("trailing data after the dictionary") }
        return out
    }
}
