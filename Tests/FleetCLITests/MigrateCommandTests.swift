import FleetTestSupport
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

struct MigrateCommandTests {
    /// A server that accepts the TCP connection (the kernel does, from the listen backlog) and never says a word: a
    /// database host that is up but hung.
    private static func silentListener() throws -> (fd: Int32, port: Int) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = fd >= 0 && withUnsafeMutablePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                bind(fd, sa, len) == 0 && listen(fd, 8) == 0 && getsockname(fd, sa, &len) == 0
            }
        }
        try #require(ok)
        return (fd, Int(UInt16(bigEndian: addr.sin_port)))
    }

    @Test func aDatabaseThatNeverAnswersEndsTheMigrationWithinTheConnectTimeout() async throws {
        let (fd, port) = try Self.silentListener()
        defer { close(fd) }
        let run = try await PipelineCommandsTests.fleet(
            ["migrate", "--database-url", "postgres://fleet@127.0.0.1:\(port)/fleet", "--connect-timeout-seconds", "2"],
            timeout: .seconds(60))
        #expect(run.status != 0)
        #expect(run.stderr.contains("did not finish within 2.0 seconds"), "\(run.stderr)")
        // The process's own run time: the test's wall clock also counts the time its polling task waited for a
        // cooperative thread, up to 40 s in a full `make test` on two cores.
        #expect(try #require(run.duration) < .seconds(30), "ended by the connect timeout")
    }

    @Test func aConnectTimeoutMustBePositive() async throws {
        let run = try await PipelineCommandsTests.fleet(
            ["migrate", "--database-url", "postgres://fleet@127.0.0.1:1/fleet", "--connect-timeout-seconds", "0"], timeout: .seconds(30))
        #expect(run.status != 0)
        #expect(run.stderr.contains("--connect-timeout-seconds must be positive"), "\(run.stderr)")
    }
}
