#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation

/// Loopback helpers for the processes the fleet starts itself (demo, benchmarks, tests).
public enum Loopback {
    /// A TCP port that was free on 127.0.0.1 a moment ago, for a child process to listen on.
    ///
    /// Chosen below the kernel's ephemeral range (`ip_local_port_range`, 32768-60999 by default) when there is room:
    /// a port the kernel hands out for `bind(0)` is also what it hands out as the local port of any outgoing
    /// connection, and the demo stack opens dozens of those (Kafka clients) between choosing a port and the child
    /// binding it. Once a fresh-clone `make test` beside a `make demo` failed that way ("ingest exited with status 1":
    /// `bind: Address already in use`). Below the range only another explicit bind can collide, and each candidate is
    /// test-bound first. Falls back to the kernel's choice when the range starts too low to leave room.
    public static func freePort() -> Int {
        let low = ephemeralRangeStart()
        if low > 12_000 {
            for _ in 0..<64 {
                let candidate = Int.random(in: 10_000..<low)
                if bindable(candidate) { return candidate }
            }
        }
        return kernelChosenPort()
    }

    /// The first port of the kernel's ephemeral range (32768 when it cannot be read).
    static func ephemeralRangeStart() -> Int {
        let text = (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8)) ?? ""
        return text.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).first.flatMap { Int($0) } ?? 32_768
    }

    /// Whether 127.0.0.1:`port` can be bound (and listened on) right now.
    static func bindable(_ port: Int) -> Bool { bindLoopback(port: port, listening: true) != nil }

    /// A port the kernel picks for `bind(0)` (in its ephemeral range).
    static func kernelChosenPort() -> Int { bindLoopback(port: 0, listening: false) ?? 0 }

    /// Binds a socket to 127.0.0.1:`port` (0: the kernel picks), listening if asked, then closes it; the bound port,
    /// or nil when the bind failed.
    private static func bindLoopback(port: Int, listening: Bool) -> Int? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        return bindSocket(fd, port: port, listening: listening)
    }

    /// Binds `fd` to 127.0.0.1:`port` (0: the kernel picks), listening if asked; the bound port, or nil on failure.
    static func bindSocket(_ fd: Int32, port: Int, listening: Bool) -> Int? {
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                bind(fd, sa, len) == 0 && (!listening || listen(fd, 64) == 0) && getsockname(fd, sa, &len) == 0
            }
        }
        return ok ? Int(UInt16(bigEndian: addr.sin_port)) : nil
    }

    /// A loopback port held for as long as this object lives (the kernel picks it), so that nothing else can listen
    /// there meanwhile. Listening: connections complete and are never answered (a server that hangs). Not listening:
    /// connections are refused at once (a server that is down).
    public final class HeldPort: @unchecked Sendable {
        public let port: Int
        private let fd: Int32

        public struct BindFailed: Error, CustomStringConvertible {
            public var description: String { "could not bind a port on 127.0.0.1" }
        }

        public init(listening: Bool) throws {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            guard fd >= 0, let port = Loopback.bindSocket(fd, port: 0, listening: listening) else {
                if fd >= 0 { close(fd) }
                throw BindFailed()
            }
            self.fd = fd
            self.port = port
        }

        /// `http://127.0.0.1:port`.
        public var url: String { "http://127.0.0.1:\(port)" }

        deinit { close(fd) }
    }
}
