import Crypto
import Foundation

/// Where the App Store Server API lives.
public enum APIEnvironment: String, Sendable, CaseIterable {
    case production = "Production"
    case sandbox = "Sandbox"

    public var baseURL: String {
        switch self {
        case .production: return "https://api.storekit.apple.com"
        case .sandbox: return "https://api.storekit-sandbox.apple.com"
        }
    }

    /// Accepts `Production`/`Sandbox` in any case.
    public init?(parsing text: String) {
        switch text.lowercased() {
        case "production": self = .production
        case "sandbox": self = .sandbox
        default: return nil
        }
    }
}

/// The in-app purchase key from App Store Connect and what identifies the app. The private key never appears in
/// `description`, errors or logs.
public struct APICredentials: Sendable, CustomStringConvertible {
    public let keyId: String
    public let issuerId: String
    public let bundleId: String
    let privateKey: P256.Signing.PrivateKey

    public init(keyId: String, issuerId: String, bundleId: String, privateKey: P256.Signing.PrivateKey) {
        self.keyId = keyId
        self.issuerId = issuerId
        self.bundleId = bundleId
        self.privateKey = privateKey
    }

    /// Reads the `.p8` file (PKCS#8 PEM, as App Store Connect downloads it; a SEC1 PEM is accepted too).
    public init(keyId: String, issuerId: String, bundleId: String, privateKeyPath: String) throws(CredentialError) {
        guard let data = FileManager.default.contents(atPath: privateKeyPath) else {
            throw .unreadableKeyFile(path: privateKeyPath)
        }
        try self.init(keyId: keyId, issuerId: issuerId, bundleId: bundleId, privateKeyPEM: String(decoding: data, as: UTF8.self),
                      source: privateKeyPath)
    }

    public init(keyId: String, issuerId: String, bundleId: String, privateKeyPEM: String, source: String = "the key") throws(CredentialError) {
        guard !keyId.isEmpty else { throw .missing("key id") }
        guard !issuerId.isEmpty else { throw .missing("issuer id") }
        guard !bundleId.isEmpty else { throw .missing("bundle id") }
        let key: P256.Signing.PrivateKey
        do {
            key = try P256.Signing.PrivateKey(pemRepresentation: privateKeyPEM.trimmingCharacters(in: .whitespacesAndNewlines))
        } catch {
            // The underlying error is not echoed: it could quote key material.
            throw .invalidKey(source: source)
        }
        self.init(keyId: keyId, issuerId: issuerId, bundleId: bundleId, privateKey: key)
    }

    public var description: String { "APICredentials(keyId: \(keyId), issuerId: \(issuerId), bundleId: \(bundleId), privateKey: <redacted>)" }
}

public enum CredentialError: Error, Equatable, CustomStringConvertible, Sendable {
    case unreadableKeyFile(path: String)
    case invalidKey(source: String)
    case missing(String)

    public var description: String {
        switch self {
        case .unreadableKeyFile(let path): return "cannot read the API private key file \(path)"
        case .invalidKey(let source):
            return "\(source) is not an ES256 (P-256) private key in PEM (PKCS#8 .p8 from App Store Connect expected)"
        case .missing(let what): return "missing the App Store Server API \(what)"
        }
    }
}

/// Makes and caches the ES256 bearer token of Apple's "Generating JSON Web Tokens for API requests".
public final class APITokenSigner: Sendable {
    public static let audience = "appstoreconnect-v1"
    public let credentials: APICredentials
    /// Token lifetime (Apple allows at most 60 minutes).
    public let lifetime: TimeInterval
    /// A cached token is replaced this long before it expires.
    public let renewBefore: TimeInterval
    private let cache = LockedValue<(token: String, expires: Date)?>(nil)

    public init(credentials: APICredentials, lifetime: TimeInterval = 20 * 60, renewBefore: TimeInterval = 5 * 60) {
        self.credentials = credentials
        self.lifetime = min(lifetime, 3600)
        self.renewBefore = min(renewBefore, self.lifetime / 2)
    }

    /// A valid token: the cached one until `renewBefore` its expiry, then a new one.
    public func token(now: Date = Date()) -> String {
        cache.withLock { cached in
            if let c = cached, c.expires.timeIntervalSince(now) > renewBefore { return c.token }
            let iat = Int64(now.timeIntervalSince1970)
            let exp = iat + Int64(lifetime)
            let t = makeToken(iat: iat, exp: exp)
            cached = (t, Date(timeIntervalSince1970: TimeInterval(exp)))
            return t
        }
    }

    /// Forgets the cached token (after a 401, say).
    public func reset() { cache.withLock { $0 = nil } }

    func makeToken(iat: Int64, exp: Int64) -> String {
        let header = #"{"alg":"ES256","kid":\#(jsonString(credentials.keyId)),"typ":"JWT"}"#
        let claims = #"{"aud":"\#(Self.audience)","bid":\#(jsonString(credentials.bundleId)),"exp":\#(exp),"iat":\#(iat),"iss":\#(jsonString(credentials.issuerId))}"#
        let input = base64URL(Data(header.utf8)) + "." + base64URL(Data(claims.utf8))
        // Signing with a valid in-memory P-256 key cannot fail.
        let signature = try! credentials.privateKey.signature(for: Data(input.utf8))
        return input + "." + base64URL(signature.rawRepresentation)
    }
}

func jsonString(_ s: String) -> String {
    let data = try! JSONEncoder().encode(s)
    return String(decoding: data, as: UTF8.self)
}

public func base64URL(_ data: Data) -> String {
    data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        .replacingOccurrences(of: "=", with: "")
}

public func base64URLDecode(_ text: some StringProtocol) -> Data? {
    var b64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
    while b64.count % 4 != 0 { b64 += "=" }
    return Data(base64Encoded: b64)
}
