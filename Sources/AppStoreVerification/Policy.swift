import Crypto
import Foundation
import X509

/// An App Store environment. Unknown values are kept as they are.
public struct Environment: RawRepresentable, Hashable, Sendable, Codable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public var description: String { rawValue }

    public static let production = Environment("Production")
    public static let sandbox = Environment("Sandbox")
    public static let xcode = Environment("Xcode")
    public static let localTesting = Environment("LocalTesting")

    /// Environments whose data is signed locally (one-certificate x5c), never by Apple.
    public var isUnsigned: Bool { self == .xcode || self == .localTesting }

    public init(from decoder: any Decoder) throws {
        self.rawValue = try decoder.singleValueContainer().decode(String.self)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(rawValue)
    }

    /// Parses a command-line / config spelling, case-insensitively (`production`, `Sandbox`, `xcode`, `local-testing`).
    public init?(parsing text: String) {
        switch text.lowercased().replacingOccurrences(of: "-", with: "").replacingOccurrences(of: "_", with: "") {
        case "production": self = .production
        case "sandbox": self = .sandbox
        case "xcode": self = .xcode
        case "localtesting": self = .localTesting
        default: return nil
        }
    }
}

/// Which instant the certificate validity windows are checked at.
public enum ValidationTime: String, Sendable, Hashable, CaseIterable {
    /// The payload's own `signedDate` (an AppTransaction without one: `receiptCreationDate`); offline, the default.
    case signedDate = "signed-date"
    /// The current time.
    case now = "now"
}

/// A configuration error of a `VerificationPolicy` (not a verdict about an input).
public struct PolicyError: Error, Sendable, CustomStringConvertible, Equatable {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// A trusted root certificate (Apple Root CA - G3 in production).
public struct TrustedRoot: Sendable, Hashable {
    public let certificate: Certificate
    public let der: [UInt8]
    /// SHA-256 of the DER encoding.
    public let fingerprint: [UInt8]

    public init(der: some Collection<UInt8>) throws(PolicyError) {
        let bytes = Array(der)
        do {
            self.certificate = try Certificate(derEncoded: bytes)
        } catch {
            throw PolicyError("root certificate is not a valid DER X.509 certificate: \(error)")
        }
        self.der = bytes
        self.fingerprint = Array(SHA256.hash(data: bytes))
    }

    public init(certificate: Certificate) throws(PolicyError) {
        var serializer = DER.Serializer()
        do {
            try serializer.serialize(certificate)
        } catch {
            throw PolicyError("cannot serialize root certificate: \(error)")
        }
        try self.init(der: serializer.serializedBytes)
    }

    /// Accepts DER or PEM (one or more `-----BEGIN CERTIFICATE-----` blocks; every block becomes a root).
    public static func load(derOrPEM bytes: [UInt8]) throws(PolicyError) -> [TrustedRoot] {
        let text = String(decoding: bytes, as: UTF8.self)
        if text.contains("-----BEGIN CERTIFICATE-----") {
            let certs: [Certificate]
            do {
                certs = try PEMDocument.parseMultiple(pemString: text).map { try Certificate(pemDocument: $0) }
            } catch {
                throw PolicyError("root certificate PEM cannot be parsed: \(error)")
            }
            if certs.isEmpty { throw PolicyError("root certificate PEM holds no certificate") }
            var roots: [TrustedRoot] = []
            for c in certs { roots.append(try TrustedRoot(certificate: c)) }
            return roots
        }
        return [try TrustedRoot(der: bytes)]
    }
}

import SwiftASN1

/// What the verifier accepts: trust anchors, the app, environments and time rules.
public struct VerificationPolicy: Sendable {
    public let roots: [TrustedRoot]
    public let bundleId: String
    /// Required when `environments` contains Production.
    public let appAppleId: Int64?
    public let environments: Set<Environment>
    public let validationTime: ValidationTime
    /// Development only: accept `Xcode` / `LocalTesting` data, which is signed locally and not verified (Apple's
    /// libraries skip all cryptography for it). Never enable in production.
    public let allowUnsignedEnvironments: Bool
    /// Bound on each input (and each nested JWS), in bytes.
    public let maxInputBytes: Int
    /// Bound on a legacy app receipt (base64 or a `{"receipt-data": ...}` body), in bytes: receipts with hundreds of
    /// in-app entries are ~100 KB.
    public let maxReceiptBytes: Int
    /// Extra trusted intermediates, never anchors: a chain through one still ends at one of `roots`. Used by StoreKit 1
    /// transaction receipts, whose signer's issuer ("Apple iTunes Store Certification Authority") is not in the
    /// receipt. Empty: those receipts are refused (`LEGACY_TRANSACTION_RECEIPT_UNSUPPORTED`).
    public let trustedIntermediates: [TrustedRoot]

    public static let defaultMaxInputBytes = 64 * 1024
    public static let defaultMaxReceiptBytes = 1024 * 1024

    public init(
        roots: [TrustedRoot],
        bundleId: String,
        appAppleId: Int64? = nil,
        environments: Set<Environment>,
        validationTime: ValidationTime = .signedDate,
        allowUnsignedEnvironments: Bool = false,
        maxInputBytes: Int = VerificationPolicy.defaultMaxInputBytes,
        maxReceiptBytes: Int = VerificationPolicy.defaultMaxReceiptBytes,
        trustedIntermediates: [TrustedRoot] = []
    ) throws(PolicyError) {
        if roots.isEmpty { throw PolicyError("at least one root certificate is required") }
        if bundleId.isEmpty { throw PolicyError("bundle id must not be empty") }
        if environments.isEmpty { throw PolicyError("at least one environment is required") }
        if environments.contains(.production) && appAppleId == nil {
            throw PolicyError(
                "the Production environment requires the app's appAppleId (--app-apple-id): Apple's Production "
                    + "payloads are bound to an app id, and without it any app's data would be accepted")
        }
        for env in environments where env.isUnsigned {
            if !allowUnsignedEnvironments {
                throw PolicyError(
                    "environment \(env.rawValue) is signed locally, not by Apple; it can only be accepted with the "
                        + "development-only allowUnsignedEnvironments option")
            }
        }
        if maxInputBytes < 1024 { throw PolicyError("maxInputBytes must be at least 1024") }
        if maxReceiptBytes < 1024 { throw PolicyError("maxReceiptBytes must be at least 1024") }
        var seen = Set<[UInt8]>()
        self.roots = roots.filter { seen.insert($0.fingerprint).inserted }
        self.bundleId = bundleId
        self.appAppleId = appAppleId
        self.environments = environments
        self.validationTime = validationTime
        self.allowUnsignedEnvironments = allowUnsignedEnvironments
        self.maxInputBytes = maxInputBytes
        self.maxReceiptBytes = maxReceiptBytes
        var seenIntermediates = Set<[UInt8]>()
        self.trustedIntermediates = trustedIntermediates.filter { seenIntermediates.insert($0.fingerprint).inserted }
    }

    /// Convenience: roots given as DER bytes.
    public init(
        rootDERs: [[UInt8]],
        bundleId: String,
        appAppleId: Int64? = nil,
        environments: Set<Environment>,
        validationTime: ValidationTime = .signedDate,
        allowUnsignedEnvironments: Bool = false,
        maxInputBytes: Int = VerificationPolicy.defaultMaxInputBytes
    ) throws(PolicyError) {
        var roots: [TrustedRoot] = []
        for der in rootDERs { roots.append(try TrustedRoot(der: der)) }
        try self.init(
            roots: roots, bundleId: bundleId, appAppleId: appAppleId, environments: environments,
            validationTime: validationTime, allowUnsignedEnvironments: allowUnsignedEnvironments,
            maxInputBytes: maxInputBytes)
    }

    /// Convenience: roots given as swift-certificates `Certificate`s.
    public init(
        rootCertificates: [Certificate],
        bundleId: String,
        appAppleId: Int64? = nil,
        environments: Set<Environment>,
        validationTime: ValidationTime = .signedDate,
        allowUnsignedEnvironments: Bool = false,
        maxInputBytes: Int = VerificationPolicy.defaultMaxInputBytes
    ) throws(PolicyError) {
        var roots: [TrustedRoot] = []
        for c in rootCertificates { roots.append(try TrustedRoot(certificate: c)) }
        try self.init(
            roots: roots, bundleId: bundleId, appAppleId: appAppleId, environments: environments,
            validationTime: validationTime, allowUnsignedEnvironments: allowUnsignedEnvironments,
            maxInputBytes: maxInputBytes)
    }
}
