import Foundation
import NIOSSL
import PostgresNIO

/// A parsed `postgres://user[:password]@host[:port]/database[?sslmode=disable|prefer|require]` URL.
/// `postgresql://` is accepted too. A `host=/path` query item selects a unix socket directory instead of TCP.
public struct DatabaseURL: Sendable, Equatable, CustomStringConvertible {
    public enum Failure: Error, CustomStringConvertible {
        case invalid(String)
        public var description: String {
            switch self {
            case .invalid(let reason): return "invalid database URL: \(reason)"
            }
        }
    }

    public enum SSLMode: String, Sendable { case disable, prefer, require }

    public var host: String
    public var port: Int
    public var username: String
    public var password: String?
    public var database: String
    public var sslMode: SSLMode
    public var socketDirectory: String?

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
        case "require", "verify-ca", "verify-full": sslMode = .require
        default: throw Failure.invalid("unknown sslmode \(mode.debugDescription)")
        }
    }

    /// The URL without its password (for logs).
    public var description: String {
        "postgres://\(username)@\(host):\(port)/\(database)"
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
        case .prefer: tls = .prefer(try NIOSSLContext(configuration: .makeClientConfiguration()))
        case .require: tls = .require(try NIOSSLContext(configuration: .makeClientConfiguration()))
        }
        return PostgresConnection.Configuration(
            host: host, port: port, username: username, password: password, database: database, tls: tls)
    }
}
