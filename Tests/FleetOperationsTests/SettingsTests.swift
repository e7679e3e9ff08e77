import FleetDevStack
import Foundation
import Logging
import Testing

@testable import FleetOperations

struct SettingsTests {
    private func writeConfig(_ text: String) throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("fleet-\(UUID().uuidString).yaml").path
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    let yaml = """
    kafka:
      bootstrap-servers: file-broker:9092
      properties:
        security.protocol: SASL_SSL
        sasl.mechanisms: SCRAM-SHA-512
    worker:
      group: file-group
      input-topic: [raw-a, raw-b]
      metrics-port: 9100
      require-known-products: true
    sink:
      group: sink-group
    """

    @Test func flagBeatsEnvironmentBeatsFileBeatsDefault() async throws {
        let path = try writeConfig(yaml)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let env = ["FLEET_GROUP": "env-group", "FLEET_KAFKA_SASL_USERNAME": "svc", "FLEET_KAFKA_SECURITY_PROTOCOL": "SSL"]
        let s = try await FleetSettings(section: "worker", configFile: path, environment: env)
        #expect(s.string("group", flag: "flag-group") == "flag-group")
        #expect(s.string("group", flag: nil) == "env-group")
        #expect(s.string("bootstrap-servers", flag: nil) == "file-broker:9092", "kafka.bootstrap-servers is the file fallback")
        #expect(s.strings("input-topic", flag: []) == ["raw-a", "raw-b"])
        #expect(s.strings("input-topic", flag: ["cli"]) == ["cli"])
        #expect(try s.int("metrics-port", flag: nil, default: 9090) == 9100)
        #expect(try s.int("shutdown-deadline-seconds", flag: nil, default: 25) == 25)
        #expect(try s.bool("require-known-products", flag: false) == true)
        let props = try s.kafkaProperties(flag: ["sasl.mechanisms=PLAIN"])
        #expect(props["security.protocol"] == "SSL", "environment overrides the file")
        #expect(props["sasl.username"] == "svc")
        #expect(props["sasl.mechanisms"] == "PLAIN", "flags override everything")
        let sink = try await FleetSettings(section: "sink", configFile: path, environment: [:])
        #expect(sink.string("group", flag: nil) == "sink-group", "sections keep worker and sink apart")
    }

    @Test func environmentListsAreCommaSeparated() async throws {
        let s = try await FleetSettings(section: "worker", configFile: nil, environment: ["FLEET_INPUT_TOPIC": "a, b,c", "FLEET_METRICS_PORT": "x"])
        #expect(s.strings("input-topic", flag: []) == ["a", "b", "c"])
        #expect(throws: FleetSettings.Error.self) { try s.int("metrics-port", flag: nil, default: 1) }
        #expect(throws: FleetSettings.Error.self) { try s.requiredString("result-topic", flag: nil) }
        #expect(throws: FleetSettings.Error.self) { try s.kafkaProperties(flag: ["novalue"]) }
    }

    @Test func missingConfigFileIsAClearError() async throws {
        await #expect(throws: FleetSettings.Error.self) {
            _ = try await FleetSettings(section: "worker", configFile: "/nonexistent/fleet.yaml", environment: [:])
        }
    }
}

struct OperationsServerTests {
    @Test func servesMetricsHealthAndReadiness() async throws {
        FleetMetrics.bootstrap()
        let readiness = Readiness()
        // A port test-bound just now (an unchecked random one once landed on another test's listener and never answered).
        let port = Loopback.freePort()
        let server = OperationsServer(host: "127.0.0.1", port: port, readiness: readiness, logger: Logger(label: "test"))
        let task = Task { try await server.run() }
        defer { task.cancel() }
        func get(_ path: String) async -> (Int, String)? {
            for _ in 0..<200 {  // up to ~20 s: a loaded 2-core CI machine starts the server slowly
                if let r = try? await httpGet(port: port, path: path) { return r }
                try? await Task.sleep(for: .milliseconds(100))
            }
            return nil
        }
        let health = try #require(await get("/healthz"))
        #expect(health.0 == 200)
        let notReady = try #require(await get("/readyz"))
        #expect(notReady.0 == 503)
        readiness.set("kafka", true)
        readiness.set("database", false)
        #expect(try #require(await get("/readyz")).1.contains("database"))
        readiness.set("database", true)
        #expect(try #require(await get("/readyz")).0 == 200)
        let metrics = try #require(await get("/metrics"))
        #expect(metrics.0 == 200)
        // One gauge per process; other tests in this process may own Readiness objects too, so check presence only.
        #expect(metrics.1.contains("# TYPE fleet_ready gauge"))
        #expect(HTTPProbe.sumMetric(metrics.1, name: "fleet_ready")[""] != nil)
    }
}

func httpGet(port: Int, path: String) async throws -> (Int, String) {
    guard let r = HTTPProbe.get(port: port, path: path) else { throw POSIXError(.ECONNREFUSED) }
    return (r.status, r.body)
}

struct ExampleConfigTests {
    @Test func theShippedExampleConfigLoads() async throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let path = root.appendingPathComponent("config/fleet.yaml").path
        let worker = try await FleetSettings(section: "worker", configFile: path, environment: [:])
        #expect(worker.string("group", flag: nil) == "fleet-verifiers")
        #expect(worker.strings("input-topic", flag: []) == ["appstore.raw"])
        #expect(worker.string("bootstrap-servers", flag: nil) == "localhost:9092")
        #expect(try worker.int("metrics-port", flag: nil, default: 0) == 9090)
        #expect(try worker.optionalInt64("app-apple-id", flag: nil) == 1_234_567_890)
        #expect(try worker.kafkaProperties(flag: [])["client.id"] == "entitlement-fleet")
        let sink = try await FleetSettings(section: "sink", configFile: path, environment: [:])
        #expect(try sink.int("metrics-port", flag: nil, default: 0) == 9091)
        #expect(sink.string("rejected-topic", flag: nil) == "entitlements.sink-rejected")
        #expect(try sink.int("max-batch-size", flag: nil, default: 0) == 4000)
        #expect(try sink.int("batch-target-ms", flag: nil, default: 0) == 150)
        #expect(try sink.int("writers", flag: nil, default: 0) == 1)
        #expect(worker.string("validation-time", flag: nil) == "signed-date")
        #expect(try worker.bool("allow-unsigned-environments", flag: false) == false)
        let ingest = try await FleetSettings(section: "ingest", configFile: path, environment: [:])
        #expect(try ingest.int("port", flag: nil, default: 0) == 8080)
        #expect(ingest.string("metrics-host", flag: nil) == "127.0.0.1")
        #expect(ingest.string("bootstrap-servers", flag: nil) == "localhost:9092")
        // An environment variable still beats the file.
        let overridden = try await FleetSettings(section: "worker", configFile: path, environment: ["FLEET_VALIDATION_TIME": "now"])
        #expect(overridden.string("validation-time", flag: nil) == "now")
    }
}
