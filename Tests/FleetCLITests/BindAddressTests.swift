import FleetDevStack
import FleetTestPKI
import FleetTestSupport
import Foundation
import Testing

/// Which address each port of a service binds: operations ports on 127.0.0.1 unless told otherwise (the chart sets
/// 0.0.0.0), the ingest's public endpoints on `--host` (default 0.0.0.0). Read from the kernel's socket table, so the
/// test sees the actual bind, not a log line.
@Suite(.serialized)
struct BindAddressTests {
    /// IPv4 addresses listening on `port`, from /proc/net/tcp (local address column, hex, little-endian on Linux).
    static func listeningAddresses(port: Int) -> [String] {
        // Read to EOF: /proc files report size 0, and a one-shot read returns only the first page of a table that,
        // with the whole suite running, holds hundreds of sockets.
        guard let handle = FileHandle(forReadingAtPath: "/proc/net/tcp"),
              let data = try? handle.readToEnd() else { return [] }
        try? handle.close()
        let table = String(decoding: data, as: UTF8.self)
        var out: [String] = []
        for line in table.split(separator: "\n").dropFirst() {
            let cols = line.split(separator: " ", omittingEmptySubsequences: true)
            guard cols.count > 3, cols[3] == "0A" else { continue }  // 0A: LISTEN
            let local = cols[1].split(separator: ":")
            guard local.count == 2, Int(local[1], radix: 16) == port, let raw = UInt32(local[0], radix: 16) else { continue }
            out.append((0..<4).map { String((raw >> (8 * UInt32($0))) & 0xff) }.joined(separator: "."))
        }
        return out
    }

    /// Starts `fleet <arguments>`, waits until every port in `ports` listens, returns their addresses, stops it.
    static func bound(_ arguments: [String], ports: [Int]) async throws -> [Int: [String]] {
        guard let url = FleetBinary.url else {
            Issue.record("fleet executable not built")
            return [:]
        }
        let p = Process()
        p.executableURL = url
        p.arguments = arguments
        p.standardOutput = FileHandle.nullDevice
        // stderr to a file, not a pipe: nobody reads a pipe while the child runs, and a child blocked on a full pipe
        // (librdkafka logs its refused connections every second) never gets to bind.
        let errorsPath = FileManager.default.temporaryDirectory.appendingPathComponent("bind-\(UUID().uuidString.prefix(8)).err")
        _ = FileManager.default.createFile(atPath: errorsPath.path, contents: nil)
        defer { try? FileManager.default.removeItem(at: errorsPath) }
        p.standardError = try FileHandle(forWritingTo: errorsPath)
        var env = ProcessInfo.processInfo.environment
        for key in env.keys where key.hasPrefix("FLEET_") { env[key] = nil }
        p.environment = env
        try p.run()
        defer {
            if p.isRunning {
                kill(p.processIdentifier, SIGKILL)
                p.waitUntilExit()
            }
        }
        let deadline = ContinuousClock.now + .seconds(60)
        var found: [Int: [String]] = [:]
        while ContinuousClock.now < deadline, p.isRunning {
            found = Dictionary(uniqueKeysWithValues: ports.map { ($0, listeningAddresses(port: $0)) })
            if found.values.allSatisfy({ !$0.isEmpty }) { return found }
            try await Task.sleep(for: .milliseconds(100))
        }
        // One look after the deadline too: on a loaded machine this task may not run again until after it (a make
        // test beside a make demo once starved the test pool for 60 s), while the child had bound long before.
        if p.isRunning {
            found = Dictionary(uniqueKeysWithValues: ports.map { ($0, listeningAddresses(port: $0)) })
            if found.values.allSatisfy({ !$0.isEmpty }) { return found }
        }
        #expect(p.isRunning, "fleet \(arguments.first ?? "") exited: \((try? String(contentsOf: errorsPath, encoding: .utf8))?.suffix(2000) ?? "")")
        return found
    }

    @Test("fleet ingest: operations port on 127.0.0.1 and endpoints on 0.0.0.0 by default; --metrics-host/--host move them")
    func ingest() async throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("bind-root-\(UUID().uuidString.prefix(8)).der")
        try Data(TestPKI().rootDER).write(to: root)
        defer { try? FileManager.default.removeItem(at: root) }
        func args(_ http: Int, _ ops: Int, _ extra: [String]) -> [String] {
            // The broker is never contacted before the first request: a closed port is enough.
            ["ingest", "--bootstrap-servers", "127.0.0.1:1", "--port", String(http), "--metrics-port", String(ops),
             "--root-certificate", root.path, "--bundle-id", TestPayloads.bundleId, "--environment", "Sandbox",
             "--app-apple-id", String(TestPayloads.appAppleId)] + extra
        }
        var http = Loopback.freePort(), ops = Loopback.freePort()
        var seen = try await Self.bound(args(http, ops, []), ports: [http, ops])
        #expect(seen[ops] == ["127.0.0.1"], "operations port: \(seen)")
        #expect(seen[http] == ["0.0.0.0"], "HTTP port: \(seen)")
        http = Loopback.freePort()
        ops = Loopback.freePort()
        seen = try await Self.bound(args(http, ops, ["--host", "127.0.0.1", "--metrics-host", "0.0.0.0"]), ports: [http, ops])
        #expect(seen[ops] == ["0.0.0.0"], "operations port: \(seen)")
        #expect(seen[http] == ["127.0.0.1"], "HTTP port: \(seen)")
    }

    @Test("fleet dashboard: 127.0.0.1 by default, --host moves it")
    func dashboard() async throws {
        var port = Loopback.freePort()
        var seen = try await Self.bound(["dashboard", "--bootstrap-servers", "127.0.0.1:1", "--port", String(port)], ports: [port])
        #expect(seen[port] == ["127.0.0.1"], "\(seen)")
        port = Loopback.freePort()
        seen = try await Self.bound(["dashboard", "--bootstrap-servers", "127.0.0.1:1", "--port", String(port), "--host", "0.0.0.0"],
                                    ports: [port])
        #expect(seen[port] == ["0.0.0.0"], "\(seen)")
    }
}
