import Foundation
import NIOSSL
import PostgresNIO

/// A parsed `postgres://user[:password]@host[:port]/database[?sslmode=...&sslrootcert=PATH&sslcert=PATH&sslkey=PATH]`
/// URL. `postgresql://` is accepted too. A `host=/path` query item selects a unix socket directory instead of TCP.
///
/// `sslmode` as libpq defines it: `disable` (plain TCP), `prefer` and `require` (TLS, the server's certificate NOT
/// verified: protects against passive eavesdropping only), `verify-ca` (the chain must lead to `sslrootcert`, or to the
/// system's roots without it), `verify-full` (as verify-ca, and the certificate must name the host connected to). Use
/// verify-full in production. `sslcert`/`sslkey` add a client certificate. The password is never printed.
public struct DatabaseURL: Sendable, Equatable, CustomStringConvertible {
    public enum Failure: Error, CustomStringConvertible {
        case invalid(String)
        public var description: String {
            switch self {
            case .invalid(let reason): return "invalid database URL: \(reason)"
            }
        }
    }

    public enum SSLMode: String, Sendable {
        case disable, prefer, require
        case verifyCA = "verify-ca"
        case verifyFull = "verify-full"
    }

    public var host: String
    public var port: Int
    public var username: String
    public var password: String?
    public var database: String
    public var sslMode: SSLMode
    public var socketDirectory: String?
    /// PEM file of the certificate authorities trusted for the server's certificate (`sslrootcert`).
    public var sslRootCertificate: String?
    /// PEM client certificate chain and key (`sslcert`, `sslkey`).
    public var sslCertificate: String?
    public var sslKey: String?

    public init(_ string: String) throws {
        guard let components = URLComponents(string: string) else {
            throw Failure.invalid("cannot parse \(Self.redacted(string).debugDescription)")
        }
        guard let scheme = components.scheme, scheme == "postgres" || scheme == "postgresql" else {
            throw Failure.invalid("the scheme must be postgres:// or postgresql://")
        }
        let items = components.queryItems ?? []
        socketDirectory = items.first(where: { $0.name == "host" })?.value
        host = components.host.flatMap { $0.isEmpty ? nil : $0 } ?? "localhost"
        port = components.port ?? 5432
        guard (1...65535).contains(port) else { throw Failure.invalid("port \(port) out of range") }
        username = components.user.flatMap { $0.removingPercentEncoding } ?? "postgres"
        password = components.password.flatMap { $0.removingPercentEncoding }
        let path = components.path.hasPrefix("/") ? String(components.path.dropFirst()) : components.path
        database = path.removingPercentEncoding ?? path
        if database.isEmpty { database = username }
        let mode = items.first(where: { $0.name == "sslmode" })?.value ?? "disable"
        switch mode {
        case "disable", "allow": sslMode = .disable
        case "prefer": sslMode = .prefer
        case "require": sslMode = .require
        case "verify-ca": sslMode = .verifyCA
        case "verify-full": sslMode = .verifyFull
        default: throw Failure.invalid("unknown sslmode \(mode.debugDescription) (disable, prefer, require, verify-ca, verify-full)")
        }
        func readableFile(_ name: String) throws -> String? {
            guard let value = items.first(where: { $0.name == name })?.value, !value.isEmpty else { return nil }
            guard FileManager.default.isReadableFile(atPath: value) else {
                throw Failure.invalid("\(name) \(value.debugDescription) is not a readable file")
            }
            return value
        }
        sslRootCertificate = try readableFile("sslrootcert")
        sslCertificate = try readableFile("sslcert")
        sslKey = try readableFile("sslkey")
        if (sslCertificate == nil) != (sslKey == nil) { throw Failure.invalid("sslcert and sslkey go together") }
    }

    /// The URL without its password (for logs).
    public var description: String {
        "postgres://\(username)@\(host):\(port)/\(database)" + (sslMode == .disable ? "" : "?sslmode=\(sslMode.rawValue)")
    }

    /// A database error in full detail (PostgresNIO's own description is deliberately generic), with this URL's
    /// password masked wherever it might appear.
    public func describe(_ error: any Error) -> String {
        var text = String(reflecting: error)
        if let password, !password.isEmpty { text = text.replacingOccurrences(of: password, with: "***") }
        return "\(self): \(text)"
    }

    static func redacted(_ string: String) -> String {
        guard var c = URLComponents(string: string) else { return "<unparseable URL>" }
        if c.password != nil { c.password = "***" }
        return c.string ?? "<unparseable URL>"
    }

    public func connectionConfiguration() throws -> PostgresConnection.Configuration {
        if let socketDirectory {
            return PostgresConnection.Configuration(
                unixSocketPath: socketDirectory + "/.s.PGSQL.\(port)", username: username, password: password,
                database: database)
        }
        let tls: PostgresConnection.Configuration.TLS
        switch sslMode {
        case .disable: tls = .disable
        case .prefer: tls = .prefer(try NIOSSLContext(configuration: tlsConfiguration()))
        case .require, .verifyCA, .verifyFull: tls = .require(try NIOSSLContext(configuration: tlsConfiguration()))
        }
        return PostgresConnection.Configuration(
            host: host, port: port, username: username, password: password, database: database, tls: tls)
    }

    /// The client TLS configuration of `sslmode`, `sslrootcert`, `sslcert` and `sslkey`.
    func tlsConfiguration() throws -> TLSConfiguration {
        var tls = TLSConfiguration.makeClientConfiguration()
        switch sslMode {
        case .disable, .prefer, .require: tls.certificateVerification = .none
        case .verifyCA: tls.certificateVerification = .noHostnameVerification
        case .verifyFull: tls.certificateVerification = .fullVerification
        }
        if let root = sslRootCertificate { tls.trustRoots = .file(root) }
        if let cert = sslCertificate, let key = sslKey {
            tls.certificateChain = try NIOSSLCertificate.fromPEMFile(cert).map { .certificate($0) }
            tls.privateKey = .privateKey(try NIOSSLPrivateKey(file: key, format: .pem))
        }
        return tls
    }
}
