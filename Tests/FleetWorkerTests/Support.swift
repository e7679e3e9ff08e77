import AppStoreVerification
import EntitlementDomain
import FleetKafka
import FleetTestSupport
import Foundation

enum TestPaths {
    static let repoRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// The built `fleet` executable (`FLEET_EXECUTABLE`, else beside the tests).
    static var fleet: String? { FleetBinary.path }

    static var eventSchema: String { repoRoot.appendingPathComponent("config/entitlement-event.schema.json").path }

    static func tempFile(_ name: String, _ bytes: [UInt8]) -> String {
        let dir = (try? TemporaryFiles.directory("fleet-worker-tests"))
            ?? FileManager.default.temporaryDirectory.appendingPathComponent("fleet-worker-tests-\(UUID().uuidString)")
        let path = dir.appendingPathComponent(name).path
        _ = FileManager.default.createFile(atPath: path, contents: Data(bytes))
        return path
    }
}

/// Publishes values in order to one partition each (round robin by explicit partition) and returns their coordinates.
func publish(_ bootstrap: String, topic: String, partitions: Int32, values: [(value: [UInt8], headers: [KafkaHeader])]) async throws -> [InputRef] {
    let producer = try KafkaProducer(configuration: KafkaConfiguration(bootstrapServers: bootstrap, clientId: "test-publisher"))
    var refs: [InputRef] = []
    for (i, v) in values.enumerated() {
        let report = try await producer.send(OutgoingMessage(topic: topic, key: nil, value: v.value, headers: v.headers, partition: Int32(i) % partitions))
        refs.append(InputRef(partition: report.partition, offset: report.offset))
    }
    producer.close()
    return refs
}

struct InputRef: Hashable, Sendable {
    var partition: Int32
    var offset: Int64
}
