import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Dev code for `fleet bench chaos`: a loopback TCP proxy (the sink -> PostgreSQL) that can stall every connection
/// through it. While paused it reads nothing from either side, so the sink's queries hang with their connection
/// open, as behind a network partition or a stuck load balancer; `resume()` lets the bytes through again. A closed
/// side closes the other (a PostgreSQL restart reaches the sink as a dropped connection). One thread per connection:
/// meant for a handful of connections.
public final class StallableProxy: Sendable {
    public let port: Int
    private let upstreamPort: Int
    private let listenFD: Int32
    private let state = Mutex(State())

    private struct State {
        var paused = false
        var closed = false
        var connections = 0
    }

    /// Listens on 127.0.0.1 (a free port) and forwards each connection to 127.0.0.1:`upstreamPort`.
    public init(upstreamPort: Int) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw DemoError("proxy: socket() failed: errno \(errno)") }
        var addr = Self.loopback(port: 0)
        let bound = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let named = withUnsafeMutablePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard bound == 0, named == 0, listen(fd, 64) == 0 else {
            let e = errno
            close(fd)
            throw DemoError("proxy: cannot listen on 127.0.0.1: errno \(e)")
        }
        listenFD = fd
        port = Int(UInt16(bigEndian: addr.sin_port))
        self.upstreamPort = upstreamPort
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    /// Stops forwarding on every connection (new ones are accepted and stall too).
    public func pause() { state.withLock { $0.paused = true } }

    public func resume() { state.withLock { $0.paused = false } }

    public var isPaused: Bool { state.withLock { $0.paused } }

    /// Connections currently open through the proxy.
    public var openConnections: Int { state.withLock { $0.connections } }

    /// Stops listening and closes every connection (within ~0.2 s). Idempotent.
    public func shutdown() { state.withLock { $0.closed = true } }

    private var isClosed: Bool { state.withLock { $0.closed } }

    private static func loopback(port: Int) -> sockaddr_in {
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = UInt16(port).bigEndian
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        return addr
    }

    private func acceptLoop() {
        defer { close(listenFD) }
        while !isClosed {
            var p = pollfd(fd: listenFD, events: Int16(POLLIN), revents: 0)
            guard poll(&p, 1, 200) > 0 else { continue }
            let client = accept(listenFD, nil, nil)
            guard client >= 0 else { continue }
            let upstream = connectUpstream()
            guard upstream >= 0 else {
                close(client)  // PostgreSQL is down: the sink sees a refused connection, as it would directly
                continue
            }
            state.withLock { $0.connections += 1 }
            Thread.detachNewThread { [self] in pump(client, upstream) }
        }
    }

    private func connectUpstream() -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return -1 }
        var addr = Self.loopback(port: upstreamPort)
        let connected = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        if connected != 0 {
            close(fd)
            return -1
        }
        return fd
    }

    /// Forwards both ways until either side closes or the proxy shuts down; reads nothing while paused.
    private func pump(_ a: Int32, _ b: Int32) {
        defer {
            close(a)
            close(b)
            state.withLock { $0.connections -= 1 }
        }
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let (paused, closed) = state.withLock { ($0.paused, $0.closed) }
            if closed { return }
            if paused {
                usleep(20_000)
                continue
            }
            var fds = [pollfd(fd: a, events: Int16(POLLIN), revents: 0), pollfd(fd: b, events: Int16(POLLIN), revents: 0)]
            let ready = poll(&fds, 2, 100)
            if ready < 0 && errno != EINTR { return }
            guard ready > 0 else { continue }
            for i in 0..<2 where fds[i].revents != 0 {
                let n = buffer.withUnsafeMutableBytes { read(fds[i].fd, $0.baseAddress, $0.count) }
                if n <= 0 { return }
                if !sendAll(fds[1 - i].fd, buffer, count: n) { return }
            }
        }
    }

    private func sendAll(_ fd: Int32, _ buffer: [UInt8], count: Int) -> Bool {
        var sent = 0
        while sent < count {
            let n = buffer.withUnsafeBytes { send(fd, $0.baseAddress! + sent, count - sent, Int32(MSG_NOSIGNAL)) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return false }
            sent += n
        }
        return true
    }
}
