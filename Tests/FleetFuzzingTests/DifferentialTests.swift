import AppStoreVerification
import FleetFuzzing
import FleetTestPKI
import FleetTestSupport
import Foundation
import Testing

/// Verdicts against Apple's own library (`app-store-server-library` from PyPI, `make deps-differential`), offline
/// with the same test root, on a few thousand mutated valid JWS: flipped bytes, swapped certificates, edited claims
/// (re-signed or not), re-encoded base64. Skipped when Python or the library is missing.
///
/// Every disagreement on verified-vs-rejected must be one of `explained` (the reason is in the README's fuzzing
/// section); any other fails the test with the inputs, so a new one is a bug in one of the two to fix or explain.
@Suite struct DifferentialTests {
    static let script = repositoryRoot.appendingPathComponent("Fuzz/differential/apple_verdicts.py").path
    static let python = ProcessInfo.processInfo.environment["PYTHON"] ?? "python3"

    static let available: Bool = {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = [python, "-c", "import appstoreserverlibrary"]
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        do { try p.run() } catch { return false }
        p.waitUntilExit()
        return p.terminationStatus == 0
    }()

    /// Runs wherever the library is installed (`make test` installs it: `make deps-differential`); set
    /// FLEET_DIFFERENTIAL=0 to skip it.
    @Test(.enabled(if: DifferentialTests.available && ProcessInfo.processInfo.environment["FLEET_DIFFERENTIAL"] != "0",
                   "python3 with app-store-server-library (make deps-differential)"))
    func verdictsAgreeWithApplesLibrary() async throws { try await offPool { try Self.compare() } }

    static func compare() throws {
        let corpus = try DifferentialCorpus(count: Int(ProcessInfo.processInfo.environment["FLEET_DIFFERENTIAL_COUNT"] ?? "") ?? 3000)
        let ours = try corpus.fleetVerdicts()
        let theirs = try applesVerdicts(corpus)
        try #require(theirs.count == corpus.cases.count, "the Python side answered \(theirs.count) of \(corpus.cases.count)")

        var agreed = 0, bothVerified = 0
        var explainedCount: [String: Int] = [:]
        var unexplained: [String] = []
        for (i, c) in corpus.cases.enumerated() {
            let weVerify = ours[i] == "verified", theyVerify = theirs[i] == "verified"
            if weVerify == theyVerify {
                agreed += 1
                if weVerify { bothVerified += 1 }
                continue
            }
            if let why = explain(c, ours: ours[i], theirs: theirs[i]) {
                explainedCount[why, default: 0] += 1
            } else {
                unexplained.append("\(c.mutation): ours \(ours[i]), Apple's \(theirs[i]): \(c.jws)")
            }
        }
        print("differential: \(corpus.cases.count) inputs, \(agreed) agree (\(bothVerified) verified by both), "
              + "explained disagreements \(explainedCount.sorted { $0.key < $1.key }), unexplained \(unexplained.count)")
        #expect(bothVerified >= corpus.cases.count / 20, "too few inputs verify on both sides: the corpus is not exercising verified verdicts")
        #expect(unexplained.isEmpty, "\(unexplained.prefix(5).joined(separator: "\n"))")
    }

    /// The known, explained disagreements (see README "Fuzzing and the differential check").
    static func explain(_ c: DifferentialCorpus.Case, ours: String, theirs: String) -> String? {
        // Apple's library checks appAppleId only for Production; the fleet refuses any appAppleId other than the
        // configured one in every environment (a Sandbox notification of another app is not ours either).
        if c.mutation == "claim:appAppleId", ours == "rejected\tWRONG_APP_APPLE_ID", theirs == "verified" {
            return "appAppleId checked in Sandbox too (ours stricter)"
        }
        // RFC 7515 compact serialisation is unpadded base64url; the fleet refuses padding, the standard alphabet and a
        // payload with a duplicate member (here a second bundleId: which one counts depends on the parser, so the
        // fleet accepts neither). Apple's library decodes leniently and keeps the last member.
        if c.mutation.hasPrefix("reencode:"), ours == "rejected\tMALFORMED_JWS", theirs == "verified" {
            return "non-canonical base64url or duplicate JSON member refused (ours stricter)"
        }
        // signedDate missing or not a JSON number: the fleet needs it to order events and refuses the payload; Apple's
        // library does not look at its type.
        if c.mutation == "claim:signedDate", ours == "rejected\tMALFORMED_JWS", theirs == "verified" {
            return "signedDate missing or not a number refused (ours stricter)"
        }
        return nil
    }

    static func applesVerdicts(_ corpus: DifferentialCorpus) throws -> [String] {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("fleet-differential-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let root = dir.appendingPathComponent("root.der")
        try Data(corpus.pki.rootDER).write(to: root)
        let input = dir.appendingPathComponent("input.tsv")
        try corpus.cases.map { "\($0.kind)\t\($0.jws)" }.joined(separator: "\n").write(to: input, atomically: true, encoding: .utf8)
        let output = dir.appendingPathComponent("output.txt")
        _ = FileManager.default.createFile(atPath: output.path, contents: nil)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = [python, script, root.path, TestPayloads.bundleId, String(TestPayloads.appAppleId), "Sandbox"]
        p.standardInput = try FileHandle(forReadingFrom: input)
        p.standardOutput = try FileHandle(forWritingTo: output)
        try p.run()
        p.waitUntilExit()
        try #require(p.terminationStatus == 0, "apple_verdicts.py exited \(p.terminationStatus)")
        let text = try String(contentsOf: output, encoding: .utf8)
        return text.split(separator: "\n", omittingEmptySubsequences: false).dropLast().map(String.init)
    }
}

