import AppStoreVerification
import FleetTestPKI
import Foundation

/// Mutated valid JWS of every kind (deterministic for a seed).
public struct DifferentialCorpus: Sendable {
    public struct Case: Sendable {
        public var kind: String
        public var mutation: String
        public var jws: String
    }

    public let pki: TestPKI
    public var cases: [Case] = []

    public init(count: Int, seed: UInt64 = 21) throws {
        pki = try TestPKI()
        let other = try TestPKI()  // an unrelated chain: its certificates swapped in must never verify
        let sibling = try pki.withNewLeaf()  // same root and intermediate, another leaf key
        var rng = SplitMix(seed)
        let t0: Int64 = 1_748_736_000_000
        func payload(_ kind: String, _ i: Int) -> JSONValue {
            let id = String(2_000_000_000_000_000 + i)
            switch kind {
            case "transaction":
                return TestPayloads.transaction(transactionId: id, purchaseDate: t0 - 3_600_000, signedDate: t0 + Int64(i))
            case "renewalInfo":
                return TestPayloads.renewalInfo(originalTransactionId: id, signedDate: t0 + Int64(i))
            case "appTransaction":
                return TestPayloads.appTransaction(receiptCreationDate: t0 + Int64(i), appTransactionId: "7042" + id.suffix(8))
            default:
                return TestPayloads.notification(
                    type: .didRenew, notificationUUID: "0b8e1f0c-1111-4222-8333-\(String(100_000_000_000 + i))",
                    signedDate: t0 + Int64(i),
                    signedTransactionInfo: pki.sign(TestPayloads.transaction(transactionId: id, purchaseDate: t0 - 3_600_000, signedDate: t0)))
            }
        }
        let kinds = ["transaction", "renewalInfo", "notification", "appTransaction"]
        for i in 0..<count {
            let kind = kinds[i % kinds.count]
            var p = payload(kind, i)
            var mutation: String
            var jws: String
            switch rng.next(9) {
            case 0:
                mutation = "valid"
                jws = pki.sign(p)
            case 1, 2:
                mutation = "flip"
                var b = Array(pki.sign(p).utf8)
                let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=+/ .".utf8)
                for _ in 0..<(1 + rng.next(2)) { b[rng.next(b.count)] = alphabet[rng.next(alphabet.count)] }
                jws = String(decoding: b, as: UTF8.self)
            case 3:
                let choice = rng.next(6)
                let x5c: [String]
                switch choice {
                case 0: x5c = [other.x5c[0], pki.x5c[1], pki.x5c[2]]
                case 1: x5c = [pki.x5c[0], other.x5c[1], pki.x5c[2]]
                case 2: x5c = [pki.x5c[1], pki.x5c[0], pki.x5c[2]]
                case 3: x5c = [sibling.x5c[0], pki.x5c[1], other.x5c[2]]
                case 4: x5c = Array(pki.x5c.prefix(2))
                default: x5c = pki.x5c + [pki.x5c[2]]
                }
                mutation = "certificates:\(choice)"
                jws = pki.signer.sign(p, header: .init(x5c: x5c))
            case 4, 5:
                let claims: [(String, JSONValue?)] = [
                    ("bundleId", "com.other.app"), ("environment", "Production"), ("environment", "Xcode"),
                    ("appAppleId", 42), ("signedDate", .integer(1_500_000_000_000)), ("signedDate", .integer(2_300_000_000_000)),
                    ("signedDate", .string(String(t0))), ("signedDate", nil), ("bundleId", nil), ("environment", nil),
                    ("receiptType", "Production"), ("receiptCreationDate", .integer(1_500_000_000_000)),
                ]
                let (key, value) = claims[rng.next(claims.count)]
                p = Self.edit(p, key: key, value: value)
                let resign = rng.next(4) != 0
                mutation = "claim:\(key)" + (resign ? "" : ":stale-signature")
                jws = resign ? pki.sign(p) : Self.replacePayload(pki.sign(payload(kind, i)), with: p)
            case 6:
                mutation = "signed-by-sibling-leaf"
                jws = sibling.signer.sign(p, header: .init(x5c: pki.x5c))
            default:
                let r = rng.next(5)
                mutation = "reencode:\(r)"
                jws = Self.reencode(pki.sign(p), variant: r, signer: pki.signer)
            }
            cases.append(Case(kind: kind, mutation: mutation, jws: jws))
        }
    }

    /// Sets (or removes, with nil) `key` at the top level and, for notifications, inside `data`.
    static func edit(_ p: JSONValue, key: String, value: JSONValue?) -> JSONValue {
        guard case .object(var o) = p else { return p }
        if case .object(var data)? = o["data"], key != "signedDate" {
            data[key] = value
            o["data"] = .object(data)
        } else {
            o[key] = value
        }
        return .object(o)
    }

    static func replacePayload(_ jws: String, with p: JSONValue) -> String {
        var parts = jws.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        parts[1] = Base64.encodeURL(p.serializedBytes())
        return parts.joined(separator: ".")
    }

    /// Base64 the fleet refuses as non-canonical, some of it re-signed so the signature itself is right.
    static func reencode(_ jws: String, variant: Int, signer: JWSSigner) -> String {
        var parts = jws.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        func padded(_ s: String) -> String { s + String(repeating: "=", count: (4 - s.utf8.count % 4) % 4) }
        func resign(_ header: String, _ payload: String) -> String {
            let sig = try! signer.key.signature(for: Array((header + "." + payload).utf8))
            return header + "." + payload + "." + Base64.encodeURL(Array(sig.rawRepresentation))
        }
        switch variant {
        case 0:  // padded signature segment
            parts[2] = padded(parts[2])
            return parts.joined(separator: ".")
        case 1:  // padded payload, re-signed over the padded text
            return resign(parts[0], padded(parts[1]))
        case 2:  // standard alphabet in the header, re-signed
            return resign(parts[0].replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/"), parts[1])
        case 3:  // payload JSON with a duplicate key (the later one wins in most parsers), re-signed
            let json = String(decoding: Base64.decodeURL(parts[1])!, as: UTF8.self)
            let dup = "{\"bundleId\":\"com.other.app\"," + json.dropFirst()
            return resign(parts[0], Base64.encodeURL(Array(dup.utf8)))
        default:  // whitespace around the payload's JSON, re-signed (valid JSON: both must accept)
            let json = String(decoding: Base64.decodeURL(parts[1])!, as: UTF8.self)
            return resign(parts[0], Base64.encodeURL(Array((" \n" + json + "\n").utf8)))
        }
    }
}

/// A small deterministic generator (SplitMix64).
struct SplitMix {
    var state: UInt64
    init(_ seed: UInt64) { state = seed }
    mutating func next(_ bound: Int) -> Int {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        z ^= z >> 31
        return Int(z % UInt64(bound))
    }
}

extension DifferentialCorpus {
    /// The fleet's verdict on each case (`verified` or `rejected<TAB>CODE`), with the kind-specific entry point and
    /// the policy Apple's library is given: this root, Sandbox, the test bundle and app id.
    public func fleetVerdicts() throws -> [String] {
        let verifier = SignedDataVerifier(
            policy: try pki.policy(appAppleId: TestPayloads.appAppleId, environments: [.sandbox]),
            chainCache: ChainCache(capacity: 64))
        return cases.map { c in
            do throws(VerificationError) {
                switch c.kind {
                case "transaction": _ = try verifier.verifyTransaction(c.jws)
                case "renewalInfo": _ = try verifier.verifyRenewalInfo(c.jws)
                case "notification": _ = try verifier.verifyNotification(c.jws)
                default: _ = try verifier.verifyAppTransaction(c.jws)
                }
                return "verified"
            } catch {
                return "rejected\t\(error.reason.rawValue)"
            }
        }
    }

    /// Writes root.der, input.tsv (`kind<TAB>jws`), fleet.txt (verdicts) and mutations.txt into `dir`.
    public func write(to dir: URL) throws {
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        try Data(pki.rootDER).write(to: dir.appendingPathComponent("root.der"))
        try (cases.map { "\($0.kind)\t\($0.jws)" }.joined(separator: "\n") + "\n").write(
            to: dir.appendingPathComponent("input.tsv"), atomically: true, encoding: .utf8)
        try (fleetVerdicts().joined(separator: "\n") + "\n").write(
            to: dir.appendingPathComponent("fleet.txt"), atomically: true, encoding: .utf8)
        try (cases.map(\.mutation).joined(separator: "\n") + "\n").write(
            to: dir.appendingPathComponent("mutations.txt"), atomically: true, encoding: .utf8)
    }
}
