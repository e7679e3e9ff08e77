@testable import FleetLoopback
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The ports the demo stack hands its children: below the kernel's ephemeral range, so that no outgoing connection
/// (the stack opens dozens) can take one between the choice and the child's bind.
@Suite struct LoopbackPortTests {
    @Test("free ports come from below the ephemeral range and can be listened on")
    func belowEphemeralRange() throws {
        let text = try String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8)
        let low = try #require(text.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).first.flatMap { Int($0) })
        try #require(low > 12_000, "this machine's ephemeral range starts at \(low): the kernel's choice is used instead")
        var seen = Set<Int>()
        for _ in 0..<50 {
            let port = Loopback.freePort()
            #expect(port >= 10_000 && port < low)
            seen.insert(port)
        }
        #expect(seen.count > 40)  // random, not one fixed port

        // A taken port is not offered: the candidate test-bind refuses it.
        let held = Loopback.freePort()
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(held).bigEndian)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
        try #require(bound && listen(fd, 1) == 0)
        #expect(!Loopback.bindable(held))
        #expect(Loopback.bindable(Loopback.freePort()))
    }
}
