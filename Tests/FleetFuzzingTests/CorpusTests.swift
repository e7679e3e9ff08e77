import AppStoreVerification
import EntitlementDomain
import FleetIngestRequests
import FleetTestSupport
import Foundation
import Testing

@testable import FleetFuzzing

/// The repository's root (Tests/FleetFuzzingTests/ -> ../..).
let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()
let corpusRoot = repositoryRoot.appendingPathComponent("Fuzz/corpus")
let regressionRoot = repositoryRoot.appendingPathComponent("Fuzz/regressions")

/// Runs a target on a thread of its own, off the cooperative pool: the loader targets block their caller while async
/// loader code runs (`LoaderTargets.blocking`), and two test cases blocking the two pool threads of a 2-core machine at
/// once left that code no thread to run on (the whole suite hung).
func runOffPool(_ target: FuzzTarget, _ bytes: [UInt8]) async throws {
    try await offPool { try target.run(bytes) }
}

func files(in dir: URL) -> [(String, [UInt8])] {
    let names = (try? FileManager.default.contentsOfDirectory(atPath: dir.path)) ?? []
    return names.sorted().compactMap { name in
        guard let data = FileManager.default.contents(atPath: dir.appendingPathComponent(name).path) else { return nil }
        return (name, Array(data))
    }
}

@Suite struct SeedCorpusTests {
    @Test(arguments: FuzzTarget.allCases)
    func everySeedKeepsTheInvariants(_ target: FuzzTarget) async throws {
        let seeds = files(in: corpusRoot.appendingPathComponent(target.rawValue))
        #expect(seeds.count >= 2, "Fuzz/corpus/\(target.rawValue) has \(seeds.count) seeds")
        for (name, bytes) in seeds {
            await #expect(throws: Never.self, "seed \(name)") { try await runOffPool(target, bytes) }
            #expect(bytes.count <= target.maxLength, "seed \(name) is longer than libFuzzer's -max_len")
        }
    }

    /// The valid seeds verify under the fuzz policy (else the fuzzer would never reach the verified-verdict invariants).
    @Test func validSeedsVerify() throws {
        let verifier = VerifyTarget.shared.uncached
        var verified = 0
        for (name, bytes) in files(in: corpusRoot.appendingPathComponent("jws")) where name.hasPrefix("valid-") {
            #expect(throws: Never.self, "seed \(name)") { _ = try verifier.verify(bytes) }
            verified += 1
        }
        for name in ["sha256", "sha1", "signed-attributes", "production"] {
            let der = files(in: corpusRoot.appendingPathComponent("receipt")).first { $0.0 == name }?.1 ?? []
            #expect(throws: Never.self, "receipt seed \(name)") { _ = try verifier.verifyAppReceipt(der: der) }
        }
        #expect(verified >= 8)
    }

    /// Every crash input the fuzzer ever found stays fixed (Fuzz/regressions/<target>/<input>).
    @Test(arguments: FuzzTarget.allCases)
    func regressionInputsKeepTheInvariants(_ target: FuzzTarget) async throws {
        for (name, bytes) in files(in: regressionRoot.appendingPathComponent(target.rawValue)) {
            await #expect(throws: Never.self, "regression input \(name)") { try await runOffPool(target, bytes) }
        }
    }
}

/// The invariants catch what they claim to catch (so a green fuzz run means something).
@Suite struct InvariantTests {
    @Test func recheckRefusesATamperedOrForeignJWS() throws {
        let jws = try #require(files(in: corpusRoot.appendingPathComponent("jws")).first { $0.0 == "valid-transaction" }?.1)
        #expect(CryptoRecheck.jws(jws, roots: VerifyTarget.shared.policy.roots) == nil)
        var tampered = jws
        let dot = try #require(tampered.firstIndex(of: UInt8(ascii: ".")))
        tampered[dot + 5] = tampered[dot + 5] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
        #expect(CryptoRecheck.jws(tampered, roots: VerifyTarget.shared.policy.roots) != nil)
        let forged = try #require(files(in: corpusRoot.appendingPathComponent("jws")).first { $0.0 == "forged-chain" }?.1)
        #expect(CryptoRecheck.jws(forged, roots: VerifyTarget.shared.policy.roots) == "x5c[1] is not signed by a trusted root")
    }

    @Test func recheckRefusesATamperedReceipt() throws {
        let der = try #require(files(in: corpusRoot.appendingPathComponent("receipt")).first { $0.0 == "sha1" }?.1)
        #expect(CryptoRecheck.receipt(der: der, roots: VerifyTarget.shared.policy.roots) == nil)
        var tampered = der
        tampered[tampered.count - 10] ^= 0x01  // inside the RSA signature
        #expect(CryptoRecheck.receipt(der: tampered, roots: VerifyTarget.shared.policy.roots) != nil)
    }

    @Test func referenceBase64AgreesWithTheCodec() {
        for s in ["", "QQ", "QR", "QUI", "QUJD", "QQ==", "QR==", "QUI=", "Q===", "-_8", "+/8=", "QUJD\n"] {
            let b = Array(s.utf8)
            #expect(Reference.decodeBase64(b, url: true) == Base64.decodeURL(s), "\(s)")
            #expect(Reference.decodeBase64(b, url: false) == Base64.decodeStandard(s), "\(s)")
        }
        #expect(Reference.decodeBase64(Array("QR".utf8), url: true) == nil)  // non-canonical tail
    }

    @Test func oversizedLoaderInputsAreRefusedUnread() async throws {
        let big = "products:\n" + String(repeating: "#", count: ProductCatalogue.maxBytes)
        #expect(throws: ProductCatalogue.LoadError.self) { try ProductCatalogue.parse(big) }
        await #expect(throws: Never.self) { try await runOffPool(.catalogue, Array(big.utf8)) }
        await #expect(throws: Never.self) { try await runOffPool(.config, Array(repeating: UInt8(ascii: "#"), count: 1024 * 1024 + 1)) }
    }

    /// Every code a target may report is in the README (the invariant "every rejection carries a documented code").
    @Test func everyReasonCodeIsDocumented() throws {
        let readme = try String(contentsOf: repositoryRoot.appendingPathComponent("README.md"), encoding: .utf8)
        for code in RejectionReason.verificationCodes.map(\.rawValue) + EventDecodeFailure.reasons + BadBody.reasons {
            #expect(readme.contains("`\(code)`"), "\(code) is not in README.md")
        }
    }
}
