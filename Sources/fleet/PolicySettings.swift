import AppStoreVerification
import ArgumentParser
import FleetOperations
import FleetRevocation
import Foundation
import Logging

/// The verification policy from its settings, shared by `fleet worker` and `fleet ingest` (one policy for both): the
/// roots (DER or PEM files), accepted environments (default Production), validation time, bundle id, app id.
func verificationPolicy(
    rootPaths: [String], environments: [String], validationTime: String, bundleId: String, appAppleId: Int64?,
    allowUnsignedEnvironments: Bool
) throws -> VerificationPolicy {
    guard !rootPaths.isEmpty else { throw FleetSettings.Error.missing(key: "root-certificate") }
    var roots: [TrustedRoot] = []
    for path in rootPaths {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw FleetSettings.Error.invalidValue(key: "root-certificate", value: path, expected: "a readable DER or PEM file")
        }
        roots += try TrustedRoot.load(derOrPEM: Array(data))
    }
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
        allowUnsignedEnvironments: allowUnsignedEnvironments)
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
