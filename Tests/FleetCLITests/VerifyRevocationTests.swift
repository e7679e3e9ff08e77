import AppStoreVerification
import FleetTestPKI
import FleetTestSupport
import Foundation
import Testing

/// `fleet verify --revocation-check`: a responder that is down gives the retryable verdict in hard mode (exit 0) and
/// a verified one in soft mode; a revoked leaf (real `openssl ocsp` responder) is rejected `CERTIFICATE_REVOKED`.
@Suite(.serialized) struct FleetVerifyRevocation {
    @Test func verdictsPerMode() async throws { try await offPool { try self.verdictsPerModeBlocking() } }

    func verdictsPerModeBlocking() throws {
        let pki = try RevocationTestPKI()
        defer { pki.stop() }
        let dir = try TemporaryFiles.directory("fleet-verify-ocsp")
        let root = dir.appendingPathComponent("root.der").path
        try Data(pki.good.rootDER).write(to: URL(fileURLWithPath: root))
        let lines = [pki.good, pki.down, pki.revokedLeaf].map { $0.sign(TestPayloads.transaction()) }
        func run(_ mode: String) throws -> FleetBinary.Output {
            try FleetBinary.run(
                ["verify", "--root-certificate", root, "--bundle-id", TestPayloads.bundleId, "--environment", "Sandbox",
                 "--revocation-check", mode, "--ocsp-timeout-ms", "2000", "-"],
                stdin: lines.joined(separator: "\n") + "\n")
        }
        let hard = try run("hard")
        #expect(hard.status == 0, "stderr: \(hard.stderr)")
        let h = hard.lines
        #expect(h.count == 3)
        guard h.count == 3 else { return }
        #expect(h[0]["verdict"] == "verified")
        #expect(h[1]["verdict"] == "retryable")
        #expect(h[1]["reason"] == "REVOCATION_STATUS_UNAVAILABLE")
        #expect(h[2]["verdict"] == "rejected")
        #expect(h[2]["reason"] == "CERTIFICATE_REVOKED")

        let soft = try run("soft").lines
        #expect(soft.map { $0["verdict"]?.stringValue ?? "" } == ["verified", "verified", "rejected"])

        let off = try run("off").lines
        #expect(off.map { $0["verdict"]?.stringValue ?? "" } == ["verified", "verified", "verified"])

        let bad = try run("sometimes")
        #expect(bad.status == 2)
        #expect(bad.stderr.contains("revocation-check"))
    }
}
