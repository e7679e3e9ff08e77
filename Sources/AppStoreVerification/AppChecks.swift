/// The app checks shared by every kind: bundle id, environment and appAppleId.
extension SignedDataVerifier {
    func checkBundle(_ v: JSONValue?, field: String) throws(VerificationError) {
        guard let v else {
            throw VerificationError(.wrongBundleId, "payload has no \(field); expected \(policy.bundleId)")
        }
        guard let s = v.stringValue else { throw VerificationError(.malformedJWS, "\(field) must be a string") }
        if s != policy.bundleId {
            throw VerificationError(.wrongBundleId, "\(field) is \(s); expected \(policy.bundleId)")
        }
    }

    func checkEnvironment(_ v: JSONValue?, field: String) throws(VerificationError) -> Environment {
        guard let v else {
            throw VerificationError(.wrongEnvironment, "payload has no \(field) (environment)")
        }
        guard let s = v.stringValue else { throw VerificationError(.malformedJWS, "\(field) must be a string") }
        let env = Environment(s)
        try checkEnvironmentValue(env, field: field)
        return env
    }

    func checkEnvironmentValue(_ env: Environment, field: String) throws(VerificationError) {
        if policy.environments.contains(env) { return }
        if env.isUnsigned && policy.allowUnsignedEnvironments { return }
        let accepted = policy.environments.map(\.rawValue).sorted().joined(separator: ", ")
        throw VerificationError(.wrongEnvironment, "\(field) is \(env.rawValue); accepted: \(accepted)")
    }

    /// Production data must carry the configured appAppleId; any appAppleId present must match it.
    func checkAppAppleId(
        _ v: JSONValue?, environment: Environment, present: Bool, field: String = "appAppleId"
    ) throws(VerificationError) {
        guard present else { return }
        var value: Int64?
        if let v, v != .null {
            guard let i = v.int64Value else { throw VerificationError(.malformedJWS, "\(field) must be an integer") }
            value = i
        }
        if environment == .production {
            guard let expected = policy.appAppleId else {
                throw VerificationError(.wrongAppAppleId, "Production data but no appAppleId is configured")
            }
            guard let value else {
                throw VerificationError(.wrongAppAppleId, "Production data without \(field); expected \(expected)")
            }
            if value != expected {
                throw VerificationError(.wrongAppAppleId, "\(field) is \(value); expected \(expected)")
            }
        } else if let value, let expected = policy.appAppleId, value != expected {
            throw VerificationError(.wrongAppAppleId, "\(field) is \(value); expected \(expected)")
        }
    }

    /// An empty signature segment: `alg: none` (the unsecured-JWS attack) or any other non-ES256 `alg` is
    /// UNSUPPORTED_ALGORITHM, as documented; an ES256 header with no signature is MALFORMED_JWS.
    static func rejectEmptySignature(_ headerSeg: UnsafeBufferPointer<UInt8>) throws(VerificationError) {
        if let hb = Base64.decodeURL(headerSeg),
            let hv = try? hb.withUnsafeBufferPointer({ try JSONValue.parse($0) }), case .object(let h) = hv
        {
            guard let algValue = h["alg"] else { throw VerificationError(.unsupportedAlgorithm, "JWS header has no alg") }
            if algValue.stringValue != "ES256" {
                throw VerificationError(.unsupportedAlgorithm, "alg is \(algValue.serialized()); only ES256 is accepted")
            }
        }
        throw VerificationError(.malformedJWS, "empty JWS segment (no signature)")
    }
}
