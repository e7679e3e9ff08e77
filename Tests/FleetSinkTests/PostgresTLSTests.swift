import FleetDevStack
import FleetTestSupport
import Foundation
import PostgresNIO
import Testing

@testable import FleetSink

/// `sslmode` against a throwaway server with a certificate from a test CA made by openssl: verify-full checks the chain
/// and the name, verify-ca the chain only, require encrypts without verifying anything (documented as such).
@Suite(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl"), "openssl is not installed"))
struct PostgresTLSTests {
    /// A CA, a server certificate for DNS:localhost signed by it, and an unrelated CA.
    struct TestCA {
        let directory: String
        var ca: String { directory + "/ca.pem" }
        var otherCA: String { directory + "/other-ca.pem" }
        var serverCertificate: String { directory + "/server.crt" }
        var serverKey: String { directory + "/server.key" }

        init() throws {
            directory = NSTemporaryDirectory() + "fleet-tls-\(UUID().uuidString.prefix(8))"
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
            try Self.openssl(["req", "-x509"] + ec + ["-keyout", directory + "/ca.key", "-out", ca, "-days", "2", "-subj", "/CN=fleet test CA"], in: directory)
            try Self.openssl(["req", "-x509"] + ec + ["-keyout", directory + "/other.key", "-out", otherCA, "-days", "2", "-subj", "/CN=fleet other CA"], in: directory)
            try Self.openssl(["req"] + ec + ["-keyout", serverKey, "-out", directory + "/server.csr", "-subj", "/CN=localhost"], in: directory)
            try "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n".write(toFile: directory + "/san.cnf", atomically: true, encoding: .utf8)
            try Self.openssl(["x509", "-req", "-in", directory + "/server.csr", "-CA", ca, "-CAkey", directory + "/ca.key",
                              "-CAcreateserial", "-out", serverCertificate, "-days", "2", "-extfile", directory + "/san.cnf"], in: directory)
        }

        static func openssl(_ arguments: [String], in directory: String) throws {
            let p = Process()
            p.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
            p.arguments = arguments
            p.currentDirectoryURL = URL(fileURLWithPath: directory)
            p.standardOutput = FileHandle.nullDevice
            p.standardError = FileHandle.nullDevice
            try p.run()
            p.waitUntilExit()
            guard p.terminationStatus == 0 else { throw DatabaseURL.Failure.invalid("openssl \(arguments.prefix(2)) failed") }
        }
    }

    /// Connects with `url` and returns whether the session is encrypted (pg_stat_ssl).
    static func encrypted(_ url: String) async throws -> Bool {
        try await withConnection(url) { c in
            let rows = try await c.query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", logger: testLogger)
            for try await (ssl) in rows.decode(Bool.self) { return ssl }
            return false
        }
    }

    @Test func sslModesAgainstATestCA() async throws {
        let ca = try TestCA()
        defer { try? FileManager.default.removeItem(atPath: ca.directory) }
        let server = try await ThrowawayPostgres(database: "tls")
        defer { server.destroy() }
        try server.enableTLS(certificatePEM: try String(contentsOfFile: ca.serverCertificate, encoding: .utf8),
                             keyPEM: try String(contentsOfFile: ca.serverKey, encoding: .utf8))
        let byName = "postgres://postgres:s3cret@localhost:\(server.port)/tls"
        let byAddress = "postgres://postgres:s3cret@127.0.0.1:\(server.port)/tls"

        #expect(try await Self.encrypted(byName + "?sslmode=verify-full&sslrootcert=\(ca.ca)"))
        #expect(try await Self.encrypted(byAddress + "?sslmode=verify-ca&sslrootcert=\(ca.ca)"),
                "verify-ca checks the chain, not the name")
        await #expect(throws: (any Error).self, "verify-full refuses a certificate that does not name 127.0.0.1") {
            _ = try await Self.encrypted(byAddress + "?sslmode=verify-full&sslrootcert=\(ca.ca)")
        }
        await #expect(throws: (any Error).self, "verify-ca refuses a chain to another CA") {
            _ = try await Self.encrypted(byName + "?sslmode=verify-ca&sslrootcert=\(ca.otherCA)")
        }
        await #expect(throws: (any Error).self, "verify-full without sslrootcert uses the system roots, which do not know the test CA") {
            _ = try await Self.encrypted(byName + "?sslmode=verify-full")
        }
        #expect(try await Self.encrypted(byAddress + "?sslmode=require&sslrootcert=\(ca.otherCA)"),
                "require encrypts but verifies nothing")
        #expect(try await Self.encrypted(byAddress + "?sslmode=disable") == false)
    }

    /// A client certificate and key as libpq takes them (`sslcert`, `sslkey`: PEM files, the key usually named
    /// `postgresql.key`): the TLS context is built from them. (NIOSSL's own file loader took a `.key` file for DER.)
    @Test func clientCertificateAndPEMKeyNamedDotKey() throws {
        let ca = try TestCA()
        defer { try? FileManager.default.removeItem(atPath: ca.directory) }
        let key = ca.directory + "/postgresql.key", certificate = ca.directory + "/postgresql.crt"
        try TestCA.openssl(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                            "-keyout", key, "-out", certificate, "-days", "2", "-subj", "/CN=fleet"], in: ca.directory)
        let url = try DatabaseURL("postgres://fleet@db.example/fleet?sslmode=require&sslcert=\(certificate)&sslkey=\(key)")
        _ = try url.connectionConfiguration()
        try "not a key".write(toFile: key, atomically: true, encoding: .utf8)
        #expect(throws: (any Error).self, "a key file that is not PEM") { _ = try url.connectionConfiguration() }
    }

    @Test func badTLSParametersAreClearErrors() throws {
        #expect(throws: DatabaseURL.Failure.self) { try DatabaseURL("postgres://u@h/db?sslmode=verify-everything") }
        #expect(throws: DatabaseURL.Failure.self) { try DatabaseURL("postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem") }
        #expect(throws: DatabaseURL.Failure.self) { try DatabaseURL("postgres://u@h/db?sslmode=verify-full&sslcert=/etc/hostname") }
        let url = try DatabaseURL("postgres://fleet:hunter2@db.example:6432/fleet?sslmode=verify-full")
        #expect(url.sslMode == .verifyFull)
        #expect(!"\(url)".contains("hunter2"))
        #expect("\(url)" == "postgres://fleet@db.example:6432/fleet?sslmode=verify-full")
    }
}
