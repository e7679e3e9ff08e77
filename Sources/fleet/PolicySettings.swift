import AppStoreVerification
import FleetOperations
import Foundation

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
