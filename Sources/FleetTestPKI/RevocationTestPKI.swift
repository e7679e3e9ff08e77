import Crypto
import FleetLoopback
import Foundation
import X509

/// The test PKI of the revocation tests and `fleet bench verify --revocation-check`: certificates whose Authority
/// Information Access names OCSP responders on 127.0.0.1, and the real responders (`openssl ocsp`) answering for them.
///
/// - the intermediate's status comes from `rootResponder` (signed by the root key), which knows it as good and a
///   second intermediate as revoked;
/// - leaves' statuses come from `leafResponder` (signed by the intermediate key): `good` and `goodLeaves` good,
///   `revokedLeaf` revoked, `unknownLeaf` absent (answered unknown);
/// - `revokedIntermediate`'s leaf names no responder, so only its (revoked) intermediate decides;
/// - `wrongSigner`'s leaf names `rogueResponder`, which signs with a key of its own;
/// - `down`'s leaf names a port held bound without listening (refused), `slow`'s a listener that never answers.
public final class RevocationTestPKI: @unchecked Sendable {
    public let good: TestPKI
    public let goodLeaves: [TestPKI]
    public let revokedLeaf: TestPKI
    public let unknownLeaf: TestPKI
    public let revokedIntermediate: TestPKI
    public let wrongSigner: TestPKI
    public let down: TestPKI
    public let slow: TestPKI
    public let rootResponder: OCSPTestResponder
    public let leafResponder: OCSPTestResponder
    public let rogueResponder: OCSPTestResponder
    /// Where `slow`'s leaf points: listening, never answering.
    public let silent: Loopback.HeldPort
    /// Where `down`'s leaf points: bound, never listening (connections refused).
    public let refusing: Loopback.HeldPort

    /// - Parameter extraGoodLeaves: more good leaves under the same intermediate (counting tests).
    public init(extraGoodLeaves: Int = 0, validMinutes: Int = 60) throws {
        // Three distinct ports for the responders started below (each was only free when chosen), and a port held
        // bound without listening for `down` (`Loopback.HeldPort`), so that no responder can ever answer there.
        var ports: [Int] = []
        while ports.count < 3 {
            let port = try OCSPTestResponder.freePort()
            if !ports.contains(port) { ports.append(port) }
        }
        let (rootPort, leafPort, roguePort) = (ports[0], ports[1], ports[2])
        let refusing = try Loopback.HeldPort(listening: false)
        self.refusing = refusing
        let silent = try Loopback.HeldPort(listening: true)
        self.silent = silent
        let url = { (port: Int) in "http://127.0.0.1:\(port)" }

        var o = TestPKI.Options()
        o.intermediateOCSPURL = url(rootPort)
        o.leafOCSPURL = url(leafPort)
        let good = try TestPKI(options: o)
        let goodLeaves = try (0..<extraGoodLeaves).map { _ in try good.withNewLeaf(options: o) }
        let revokedLeaf = try good.withNewLeaf(options: o)
        let unknownLeaf = try good.withNewLeaf(options: o)
        var rogue = o
        rogue.leafOCSPURL = url(roguePort)
        let wrongSigner = try good.withNewLeaf(options: rogue)
        var closed = o
        closed.leafOCSPURL = refusing.url
        let down = try good.withNewLeaf(options: closed)
        var hanging = o
        hanging.leafOCSPURL = silent.url
        let slow = try good.withNewLeaf(options: hanging)
        var noLeafAIA = o
        noLeafAIA.leafOCSPURL = nil
        let revokedIntermediate = try good.withNewIntermediate(options: noLeafAIA)
        self.good = good
        self.goodLeaves = goodLeaves
        self.revokedLeaf = revokedLeaf
        self.unknownLeaf = unknownLeaf
        self.wrongSigner = wrongSigner
        self.down = down
        self.slow = slow
        self.revokedIntermediate = revokedIntermediate

        rootResponder = try OCSPTestResponder(
            issuer: good.root, signer: good.root, signerKeyPEM: good.rootKey.pemRepresentation,
            statuses: [(good.intermediate, .good), (revokedIntermediate.intermediate, .revoked)], port: rootPort,
            validMinutes: validMinutes)
        var leaves: [(Certificate, OCSPTestResponder.Status)] = [(good.leaf, .good), (revokedLeaf.leaf, .revoked)]
        leaves += goodLeaves.map { ($0.leaf, .good) }
        leaves += [wrongSigner.leaf, down.leaf, slow.leaf].map { ($0, .good) }
        leafResponder = try OCSPTestResponder(
            issuer: good.intermediate, signer: good.intermediate, signerKeyPEM: good.intermediateKey.pemRepresentation,
            statuses: leaves, port: leafPort, validMinutes: validMinutes)
        let rogueKey = P384.Signing.PrivateKey()
        let rogueName = try DistinguishedName { CommonName("Rogue OCSP Responder") }
        let rogueCert = try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: .init(rogueKey.publicKey),
            notValidBefore: TestPKI.defaultNotBefore, notValidAfter: TestPKI.defaultNotAfter, issuer: rogueName,
            subject: rogueName, signatureAlgorithm: .ecdsaWithSHA384,
            extensions: try Certificate.Extensions([
                try Certificate.Extension(ExtendedKeyUsage([.ocspSigning]), critical: false)
            ]),
            issuerPrivateKey: .init(rogueKey))
        rogueResponder = try OCSPTestResponder(
            issuer: good.intermediate, signer: rogueCert, signerKeyPEM: rogueKey.pemRepresentation,
            statuses: [(wrongSigner.leaf, .good)], port: roguePort, validMinutes: validMinutes)
    }

    /// Stops every responder.
    public func stop() {
        rootResponder.stop()
        leafResponder.stop()
        rogueResponder.stop()
    }
}
