import FleetDevStack
import FleetTestSupport
import PostgresNIO
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

private struct CannotTakeAPort: Error {}

/// A socket listening on 127.0.0.1: the port another process took between the check and PostgreSQL's bind.
private final class TakenPort: Sendable {
    let fd: Int32
    let port: Int

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = 0
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = fd >= 0 && withUnsafeMutablePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                bind(fd, sa, len) == 0 && listen(fd, 1) == 0 && getsockname(fd, sa, &len) == 0
            }
        }
        guard ok else {
            if fd >= 0 { close(fd) }
            throw CannotTakeAPort()
        }
        self.fd = fd
        self.port = Int(UInt16(bigEndian: addr.sin_port))
    }

    deinit { close(fd) }
}

@Suite("The throwaway PostgreSQL of the demo, the tests and the benchmarks")
struct ThrowawayPostgresTests {
    @Test("--database-locale: icu:NAME or a locale name; anything that could reach the SQL otherwise is refused")
    func databaseLocaleParsing() throws {
        #expect(try ThrowawayPostgres.DatabaseLocale(parsing: "icu:en-US") == .icu("en-US"))
        #expect(try ThrowawayPostgres.DatabaseLocale(parsing: "en_US.UTF-8") == .libc("en_US.UTF-8"))
        #expect(try ThrowawayPostgres.DatabaseLocale(parsing: "de_DE@euro").description == "de_DE@euro")
        #expect(try ThrowawayPostgres.DatabaseLocale(parsing: "icu:und-u-ks-level2").description == "icu:und-u-ks-level2")
        for bad in ["", "icu:", "en_US'; DROP DATABASE x; --", "en US", "icu:en-US'"] {
            #expect(throws: ThrowawayPostgres.Failure.self, "\(bad.debugDescription) accepted") {
                try ThrowawayPostgres.DatabaseLocale(parsing: bad)
            }
        }
    }

    @Test("a first start whose port was taken meanwhile starts on another port")
    func takenPort() async throws {
        let taken = try TakenPort()
        let asked = Mutex<[Int]>([])
        let server = try await ThrowawayPostgres(database: "fleet", logger: testLogger, choosePort: {
            asked.withLock { list in
                list.append(list.isEmpty ? taken.port : Loopback.freePort())
                return list.last!
            }
        })
        registerForCleanup(server)
        defer { server.destroy() }
        #expect(asked.withLock { $0.count } == 2)
        #expect(server.port != taken.port)
        #expect(server.url.contains(":\(server.port)/"))
        let one = try await withConnection(server.url) { try await scalar($0, "SELECT 1", as: Int32.self) }
        #expect(one == 1)
    }

    @Test("a port taken on every try fails after three, with the server's own words")
    func portTakenEveryTime() async throws {
        let taken = try TakenPort()
        let asked = Mutex(0)
        do {
            let server = try await ThrowawayPostgres(database: "fleet", logger: testLogger, choosePort: {
                asked.withLock { $0 += 1 }
                return taken.port
            })
            server.destroy()
            Issue.record("started on a port that another socket holds")
        } catch {
            #expect(asked.withLock { $0 } == 3)
            let text = "\(error)"
            #expect(text.contains("server log"), "\(text)")
            #expect(text.contains("could not bind") || text.contains("already in use"), "\(text)")
        }
    }
}
