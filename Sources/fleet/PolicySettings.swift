import AppStoreVerification
import ArgumentParser
import FleetOperations
import FleetRevocation
import Foundation
import Logging

/// The verification policy from its settings, shared by `fleet worker` and `fleet ingest` (one policy for both): the
/// roots (DER or PEM files), accepted environments (default Production), validation time, bundle id, app id, the
/// legacy receipt size bound and the extra trusted intermediates (StoreKit 1 transaction receipts).
func verificationPolicy(
    rootPaths: [String], environments: [String], validationTime: String, bundleId: String, appAppleId: Int64?,
    allowUnsignedEnvironments: Bool, maxReceiptBytes: Int = VerificationPolicy.defaultMaxReceiptBytes,
    trustedIntermediatePaths: [String] = []
) throws -> VerificationPolicy {
    guard !rootPaths.isEmpty else { throw FleetSettings.Error.missing(key: "root-certificate") }
    let roots = try loadCertificates(rootPaths, key: "root-certificate")
    let intermediates = try loadCertificates(trustedIntermediatePaths, key: "trusted-intermediate")
    var envs = Set<AppStoreVerification.Environment>()
    for name in environments.isEmpty ? ["Production"] : environments {
        guard let e = AppStoreVerification.Environment(parsing: name) else {
            throw FleetSettings.Error.invalidValue(key: "environment", value: name, expected: "Production, Sandbox, Xcode or LocalTesting")
        }
        envs.insert(e)
    }
    guard let time = ValidationTime(rawValue: validationTime) else {
        throw FleetSettings.Error.invalidValue(key: "validation-time", value: validationTime, expected: "signed-date or now")
    }
    return try VerificationPolicy(
        roots: roots, bundleId: bundleId, appAppleId: appAppleId, environments: envs, validationTime: time,
        allowUnsignedEnvironments: allowUnsignedEnvironments, maxReceiptBytes: maxReceiptBytes,
        trustedIntermediates: intermediates)
}

/// Certificates from DER or PEM files (every PEM block counts).
func loadCertificates(_ paths: [String], key: String) throws -> [TrustedRoot] {
    var certificates: [TrustedRoot] = []
    for path in paths {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw FleetSettings.Error.invalidValue(key: key, value: path, expected: "a readable DER or PEM file")
        }
        certificates += try TrustedRoot.load(derOrPEM: Array(data))
    }
    return certificates
}

/// The verification flags of `fleet worker` and `fleet ingest` (one policy for both; the same keys in the config file).
struct VerificationOptions: ParsableArguments {
    @Option(name: .customLong("root-certificate"), help: "Trusted root certificate, DER or PEM (repeatable).")
    var rootCertificates: [String] = []

    @Option(help: "The app's bundle id.")
    var bundleId: String?

    @Option(name: .customLong("environment"), help: "Accepted environment: Production, Sandbox (repeatable).")
    var environments: [String] = []

    @Option(help: "The app's Apple id (required for Production).")
    var appAppleId: Int64?

    @Option(help: "Product catalogue (YAML or JSON).")
    var products: String?

    @Flag(help: "Reject purchases of products missing from the catalogue (UNKNOWN_PRODUCT).")
    var requireKnownProducts = false

    @Option(help: "Validation time of certificates: signed-date (offline, default) or now.")
    var validationTime: String?

    @Flag(help: "Development only: accept Xcode/LocalTesting data, which is not signed by Apple.")
    var allowUnsignedEnvironments = false

    @Option(help: "Size bound of a legacy App Store receipt, bytes (default 1048576; JWS keep 65536).")
    var maxReceiptBytes: Int?

    @Option(
        name: .customLong("trusted-intermediate"),
        help: "Extra trusted intermediate certificate, DER or PEM (repeatable): \"Apple iTunes Store Certification Authority\" verifies StoreKit 1 transaction receipts.")
    var trustedIntermediates: [String] = []

    @OptionGroup var revocation: RevocationOptions
}

/// `--revocation-check off|soft|hard` and its OCSP settings (worker, ingest, `fleet verify`; config keys of the same
/// names, `FLEET_REVOCATION_CHECK`, ...).
struct RevocationOptions: ParsableArguments {
    @Option(help: """
        Online revocation checks of certificate chains (OCSP, answers cached per certificate until their \
        nextUpdate): off (default), soft (status unavailable: verify anyway, counted and logged) or hard (status \
        unavailable: retry later, never reject).
        """)
    var revocationCheck: String?

    @Option(help: "OCSP request timeout in milliseconds (default 5000).")
    var ocspTimeoutMs: Int?

    @Option(help: "Longest an OCSP answer is kept, in seconds, even when its nextUpdate is later (default 86400).")
    var ocspMaxAgeSeconds: Int?

    /// The process's revocation checker (nil for `off`), from flags > environment > config (`lookup` is the layered
    /// settings' string lookup; pass `{ $1 }` for flags only).
    func checker(lookup: (String, String?) -> String?, logger: Logger) throws -> RevocationChecker? {
        let text = lookup("revocation-check", revocationCheck) ?? "off"
        guard let mode = RevocationSettings.Mode(rawValue: text) else {
            throw FleetSettings.Error.invalidValue(key: "revocation-check", value: text, expected: "off, soft or hard")
        }
        func positive(_ key: String, _ flag: Int?, _ defaultValue: Int) throws -> Int {
            let raw = lookup(key, flag.map(String.init)) ?? String(defaultValue)
            guard let v = Int(raw), v > 0 else {
                throw FleetSettings.Error.invalidValue(key: key, value: raw, expected: "a positive integer")
            }
            return v
        }
        let timeout = try positive("ocsp-timeout-ms", ocspTimeoutMs, 5_000)
        let maxAge = try positive("ocsp-max-age-seconds", ocspMaxAgeSeconds, 86_400)
        return RevocationSetup.checker(
            settings: RevocationSettings(mode: mode, maxAgeMillis: Int64(maxAge) * 1000), timeout: .milliseconds(timeout),
            logger: logger)
    }
}
