import FleetKafka
import Foundation

/// Reads a topic from the beginning with a private group until at least `count` messages arrived, and then on until
/// everything the topic held at that moment was read (so duplicates after a crash cannot hide a missing message,
/// nor can extra messages hide).
public func readTopic(_ bootstrap: String, _ topic: String, atLeast count: Int, timeout: Duration = .seconds(60)) async throws -> [KafkaMessage] {
    let config = KafkaConfiguration(bootstrapServers: bootstrap, clientId: "test-reader", sessionTimeoutMilliseconds: 6000,
                                    heartbeatIntervalMilliseconds: 500)
    let group = "reader-\(UUID().uuidString.prefix(8))"
    let consumer = try KafkaConsumer(configuration: config, groupId: group, topics: [topic])
    var out: [KafkaMessage] = []
    let deadline = ContinuousClock.now + timeout
    while out.count < count && ContinuousClock.now < deadline {
        out += try await consumer.nextBatch(maxMessages: 5000, timeout: .milliseconds(300))
    }
    let held = try await KafkaAdmin(configuration: config).consumerLag(groupId: group, topics: [topic])
        .reduce(0) { $0 + Int($1.highWatermark - $1.lowWatermark) }
    let rest = ContinuousClock.now + .seconds(20)
    while out.count < held && ContinuousClock.now < rest {
        out += try await consumer.nextBatch(maxMessages: 5000, timeout: .milliseconds(300))
    }
    _ = await consumer.close(deadline: .seconds(5))
    return out
}

/// The last value of header `key`, as text.
public func header(_ m: KafkaMessage, _ key: String) -> String? {
    m.headers.last { $0.key == key }.map { String(decoding: $0.value, as: UTF8.self) }
}
