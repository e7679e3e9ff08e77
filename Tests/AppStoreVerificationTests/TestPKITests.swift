import AppStoreVerification
import Crypto
import Foundation
import FleetTestPKI
import SwiftASN1
import Testing
import X509

@Suite struct TestPKIShape {
    @Test func chainIsShapedLikeApples() throws {
        let pki = Fixtures.pki
        #expect(P384.Signing.PublicKey(pki.root.publicKey) != nil)
        #expect(P384.Signing.PublicKey(pki.intermediate.publicKey) != nil)
        #expect(P256.Signing.PublicKey(pki.leaf.publicKey) != nil)
        #expect(pki.leaf.extensions[oid: TestPKI.appleLeafOID] != nil)
        #expect(pki.intermediate.extensions[oid: TestPKI.appleIntermediateOID] != nil)
        #expect(try pki.intermediate.extensions.basicConstraints == .isCertificateAuthority(maxPathLength: 0))
        #expect(pki.x5c.count == 3)
        #expect(pki.rootPEM.hasPrefix("-----BEGIN CERTIFICATE-----"))
        #expect(try Certificate(derEncoded: pki.rootDER) == pki.root)
    }

    @Test func signerHeaderIsStableForOneChain() {
        let a = Fixtures.pki.sign(Fixtures.transaction())
        let b = Fixtures.pki.sign(TestPayloads.renewalInfo(originalTransactionId: "1"))
        #expect(a.split(separator: ".")[0] == b.split(separator: ".")[0])
    }
}

@Suite struct PathRules {
    @Test func unhandledCriticalExtensionIsUntrusted() throws {
        var o = TestPKI.Options()
        o.extraLeafExtensions = [Certificate.Extension(oid: [1, 3, 6, 1, 4, 1, 99999, 1], critical: true, value: [0x05, 0x00])]
        let bad = try Fixtures.pki.withNewLeaf(options: o)
        let e = expectRejected(.untrustedChain) { () throws(VerificationError) in
            _ = try Fixtures.verifier().verify(bad.sign(Fixtures.transaction()))
        }
        #expect(e?.detail.contains("critical") == true)
        // The same extension, not critical, is fine.
        o.extraLeafExtensions = [Certificate.Extension(oid: [1, 3, 6, 1, 4, 1, 99999, 1], critical: false, value: [0x05, 0x00])]
        _ = try Fixtures.verifier().verify(try Fixtures.pki.withNewLeaf(options: o).sign(Fixtures.transaction()))
    }
}
