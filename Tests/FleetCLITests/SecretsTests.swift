import FleetDevStack
import FleetOperations
import FleetTestSupport
import Foundation
import FleetTestPKI
import Testing

/// Secrets given as flags or `FLEET_*` variables (database password, SASL password) never appear in anything a command
/// prints: stdout, stderr (logs, errors), `--help`, `/metrics` and `/readyz`.
@Suite(.serialized) struct SecretsTests {
    static let databaseSecret = "dbPw-7f3a9c1e"
    static let saslSecret = "saslPw-5b8d2e4a"

    /// Runs `fleet` with `environment` added, for at most `seconds`, scraping the operations port (when given) while it
    /// runs; then SIGTERM (SIGKILL after 10 s). Returns everything it printed and everything scraped.
    static func capture(_ args: [String], environment: [String: String] = [:], seconds: Double, scrapePort: Int? = nil) async throws -> String {
        let url = try #require(FleetBinary.url, "fleet executable not built")
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("fleet-secrets-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let out = dir.appendingPathComponent("out"), err = dir.appendingPathComponent("err")
        _ = FileManager.default.createFile(atPath: out.path, contents: nil)
        _ = FileManager.default.createFile(atPath: err.path, contents: nil)
        let p = Process()
        p.executableURL = url
        p.arguments = args
        p.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        p.standardOutput = try FileHandle(forWritingTo: out)
        p.standardError = try FileHandle(forWritingTo: err)
        p.standardInput = FileHandle.nullDevice
        try p.run()
        var scraped = ""
        let deadline = ContinuousClock.now + .seconds(seconds)
        while p.isRunning && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(500))
            if let port = scrapePort {
                for path in ["/metrics", "/readyz", "/healthz"] {
                    if let r = HTTPProbe.get(port: port, path: path) { scraped += r.body }
                }
            }
        }
        if p.isRunning {
            kill(p.processIdentifier, SIGTERM)
            let stop = ContinuousClock.now + .seconds(10)
            while p.isRunning && ContinuousClock.now < stop { try await Task.sleep(for: .milliseconds(100)) }
            if p.isRunning { kill(p.processIdentifier, SIGKILL) }
        }
        p.waitUntilExit()
        return (try String(contentsOf: out, encoding: .utf8)) + (try String(contentsOf: err, encoding: .utf8)) + scraped
    }

    static func freePort() -> Int { Loopback.freePort() }

    static func expectNoSecret(_ text: String, _ what: String) {
        #expect(!text.contains(databaseSecret), "\(what) printed the database password")
        #expect(!text.contains(saslSecret), "\(what) printed the SASL password")
    }

    var dbURL: String { "postgres://fleet:\(Self.databaseSecret)@127.0.0.1:1/fleet" }
    let sasl = ["--kafka-property", "security.protocol=SASL_PLAINTEXT", "--kafka-property", "sasl.mechanisms=PLAIN",
                "--kafka-property", "sasl.username=fleet", "--kafka-property", "sasl.password=\(saslSecret)"]

    @Test func migrateWithAPasswordInTheURL() async throws {
        let text = try await Self.capture(["migrate", "--database-url", dbURL], seconds: 30)
        #expect(text.contains("127.0.0.1"), "the error names the server: \(text.prefix(300))")
        Self.expectNoSecret(text, "fleet migrate")
        let env = try await Self.capture(["migrate"], environment: ["FLEET_DATABASE_URL": dbURL], seconds: 30)
        Self.expectNoSecret(env, "fleet migrate (FLEET_DATABASE_URL)")
    }

    @Test func sinkWithDatabaseAndSASLPasswords() async throws {
        let port = Self.freePort()
        let text = try await Self.capture(
            ["sink", "--bootstrap-servers", "127.0.0.1:1", "--database-url", dbURL, "--metrics-port", "\(port)",
             "--log-level", "debug"] + sasl, seconds: 6, scrapePort: port)
        #expect(text.contains("fleet_ready"), "the operations port was scraped")
        Self.expectNoSecret(text, "fleet sink")
        let env = try await Self.capture(
            ["sink", "--metrics-port", "\(Self.freePort())"],
            environment: ["FLEET_BOOTSTRAP_SERVERS": "127.0.0.1:1", "FLEET_DATABASE_URL": dbURL,
                          "FLEET_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "FLEET_KAFKA_SASL_MECHANISMS": "PLAIN",
                          "FLEET_KAFKA_SASL_USERNAME": "fleet", "FLEET_KAFKA_SASL_PASSWORD": Self.saslSecret],
            seconds: 6, scrapePort: nil)
        Self.expectNoSecret(env, "fleet sink (environment)")
    }

    @Test func workerWithASASLPassword() async throws {
        let pki = try TestPKI()
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("fleet-secrets-root-\(UUID().uuidString.prefix(8)).der")
        try Data(pki.rootDER).write(to: root)
        defer { try? FileManager.default.removeItem(at: root) }
        let port = Self.freePort()
        let text = try await Self.capture(
            ["worker", "--bootstrap-servers", "127.0.0.1:1", "--root-certificate", root.path, "--bundle-id", "com.example.app",
             "--environment", "Sandbox", "--metrics-port", "\(port)", "--log-level", "debug"] + sasl,
            seconds: 6, scrapePort: port)
        #expect(text.contains("fleet_ready"))
        Self.expectNoSecret(text, "fleet worker")
        // A malformed secret property is reported without its value.
        let bad = try await Self.capture(["worker", "--bootstrap-servers", "127.0.0.1:1", "--root-certificate", root.path,
                                          "--bundle-id", "b", "--environment", "Sandbox",
                                          "--kafka-property", "sasl.password\(Self.saslSecret)"], seconds: 20)
        #expect(bad.contains("kafka-property"), "\(bad.prefix(300))")
        Self.expectNoSecret(bad, "fleet worker (malformed property)")
    }

    @Test func helpNeverShowsSecrets() async throws {
        let env = ["FLEET_DATABASE_URL": dbURL, "FLEET_KAFKA_SASL_PASSWORD": Self.saslSecret]
        for command in [["worker"], ["sink"], ["migrate"], ["publish"], ["lag"], ["demo"], []] {
            let text = try await Self.capture(command + ["--help"], environment: env, seconds: 20)
            #expect(text.contains("USAGE"), "\(command) --help printed its usage")
            Self.expectNoSecret(text, "fleet \(command.joined()) --help")
        }
    }
}
