import FleetDevStack
import FleetOperations
import FleetTestSupport
import Foundation
import Testing

@testable import FleetKafka

/// A lagging group whose committed position was deleted by retention (the mock keeps ~5 MiB per partition): the
/// reset is logged, counted and listed, and under `fail` nothing past the gap is consumed.
@Suite(.serialized) struct OffsetResetTests {
    /// One partition; the group commits offset 10 of 20 small records, then 8 MiB more are written so that the mock
    /// deletes the records from offset 10 on. Returns the cluster, topic, group and the new low watermark.
    static func truncatedUnderLaggingGroup() async throws -> (EmbeddedKafkaCluster, String, String, Int64) {
        let topic = TestKafka.unique("reset")
        let cluster = try await TestKafka.cluster(brokers: 1, topic: topic, partitions: 1)
        try await TestKafka.produceSequenced(cluster.bootstrapServers, topic: topic, partitions: 1, perPartition: 20)
        let config = TestKafka.config(cluster.bootstrapServers)
        let group = TestKafka.unique("reset-g")
        let first = try KafkaConsumer(configuration: config, groupId: group, topics: [topic])
        let seen = try await TestKafka.consume(first, count: 20)
        #expect(seen.count == 20)
        first.markProcessed(seen.filter { $0.offset < 10 })
        #expect(await first.commit(deadline: .seconds(10)))
        #expect(await first.close(deadline: .seconds(10)))

        let producer = try KafkaProducer(configuration: config)
        let big = [UInt8](repeating: 0x61, count: 100 * 1024)
        for i in 0..<80 {
            _ = try await producer.send(OutgoingMessage(topic: topic, key: Array("big\(i)".utf8), value: big, partition: 0))
        }
        producer.close()
        let admin = KafkaAdmin(configuration: config)
        let lag = try #require(try await admin.consumerLag(groupId: group, topics: [topic]).first)
        #expect(lag.committedOffset == 10)
        #expect(lag.lowWatermark > 10, "the mock deleted the records the group had not read")
        #expect(lag.committedOutOfRange)
        return (cluster, topic, group, lag.lowWatermark)
    }

    static func metricsText() -> String {
        var buffer: [UInt8] = []
        FleetMetrics.registry.emit(into: &buffer)
        return String(decoding: buffer, as: UTF8.self)
    }

    @Test func underFailTheResetIsLoudAndNothingPastTheGapIsConsumed() async throws {
        FleetMetrics.bootstrap()
        let (cluster, topic, group, low) = try await Self.truncatedUnderLaggingGroup()
        defer { cluster.shutdown() }
        var config = TestKafka.config(cluster.bootstrapServers)
        config.offsetResetPolicy = .fail
        let consumer = try KafkaConsumer(configuration: config, groupId: group, topics: [topic])
        var received: [KafkaMessage] = []
        let deadline = ContinuousClock.now + .seconds(25)
        while ContinuousClock.now < deadline {
            received += try await consumer.nextBatch(maxMessages: 100, timeout: .milliseconds(500))
            if !consumer.blockedPartitions.isEmpty, ContinuousClock.now > deadline - .seconds(20) { break }
        }
        // Keep polling a while after the block: still nothing may arrive.
        for _ in 0..<6 { received += try await consumer.nextBatch(maxMessages: 100, timeout: .milliseconds(500)) }
        let tp = TopicPartition(topic: topic, partition: 0)
        #expect(consumer.blockedPartitions == [tp])
        let offsets = received.map(\.offset)
        #expect(offsets.isEmpty, "no record past the gap is handed out under fail: got offsets \(offsets.prefix(5))")
        #expect(!consumer.isReady, "a blocked partition makes the consumer not ready")
        let reset = try #require(OffsetResets.all.last { $0.topic == topic })
        #expect(reset.fromOffset == 10)
        #expect(reset.blocked)
        #expect(reset.skippedEstimate == low - 10)
        #expect(OffsetResets.report.contains { $0.contains("\(topic)[0] offset 10 out of range") })
        let metrics = Self.metricsText()
        #expect(metrics.contains("fleet_consumer_offset_resets_total{topic=\"\(topic)\",partition=\"0\"} 1"), "\(metrics.prefix(2000))")
        #expect(metrics.contains("fleet_consumer_offset_reset_skipped_messages_total{topic=\"\(topic)\",partition=\"0\"} \(low - 10)"))
        #expect(await consumer.close(deadline: .seconds(10)))
        // Nothing past the gap was stored: the group's committed offset is still the one before the gap.
        let after = try await KafkaAdmin(configuration: config).consumerLag(groupId: group, topics: [topic])
        #expect(after.first?.committedOffset == 10)
    }

    @Test func underEarliestTheResetIsLoudAndConsumptionContinuesAtTheLowWatermark() async throws {
        FleetMetrics.bootstrap()
        let (cluster, topic, group, low) = try await Self.truncatedUnderLaggingGroup()
        defer { cluster.shutdown() }
        var config = TestKafka.config(cluster.bootstrapServers)
        config.offsetResetPolicy = .earliest
        let consumer = try KafkaConsumer(configuration: config, groupId: group, topics: [topic])
        let expected = Int(100 - low)
        let received = try await TestKafka.consume(consumer, count: expected, timeout: .seconds(30))
        #expect(received.count == expected)
        #expect(received.first?.offset == low)
        #expect(consumer.blockedPartitions.isEmpty)
        #expect(consumer.isReady)
        let reset = try #require(OffsetResets.all.last { $0.topic == topic })
        #expect(reset.fromOffset == 10 && !reset.blocked)
        #expect(Self.metricsText().contains("fleet_consumer_offset_resets_total{topic=\"\(topic)\",partition=\"0\"} 1"))
        #expect(await consumer.close(deadline: .seconds(10)))
    }

    @Test func librdkafkaResetLinesAreParsed() throws {
        let cached = try #require(OffsetReset.parseLibrdkafkaLog(
            "[thrd:main]: appstore.raw [3]: offset reset (at offset 10, broker 1) to cached BEGINNING offset 416: fetch failed due to requested offset not available on the broker: Broker: Offset out of range"))
        #expect(cached.topic == "appstore.raw" && cached.partition == 3)
        #expect(cached.fromOffset == 10 && cached.toOffset == 416 && cached.skippedEstimate == 406)
        let logical = try #require(OffsetReset.parseLibrdkafkaLog(
            "[thrd:main]: t.with [dots] [0]: offset reset (at offset 7, broker 2) to END: fetch failed: Broker: Offset out of range"))
        #expect(logical.topic == "t.with [dots]" && logical.fromOffset == 7 && logical.toOffset == nil && logical.toLogical == "END")
        #expect(OffsetReset.parseLibrdkafkaLog("appstore.raw [3]: Fetch backoff for 500ms") == nil)
        #expect(OffsetReset.parseLibrdkafkaLog("") == nil)
        #expect(OffsetReset.parseLibrdkafkaLog(
            "[thrd:main]: t [1]: offset reset (at offset BEGINNING, broker 1) to BEGINNING: failed to query logical offset: Broker: Not leader") == nil,
            "a failed start-offset query of a new group skips nothing")
        #expect(throws: KafkaError.self) { try OffsetResetPolicy.parse("sometimes") }
        #expect(try OffsetResetPolicy.parse("LATEST") == .latest)
    }
}

/// The embedded cluster's retention watch sees a partition fill up and records being deleted.
@Suite struct EmbeddedRetentionWatchTests {
    @Test func aFullPartitionIsReportedBeforeAndWhenRecordsAreDeleted() async throws {
        let topic = TestKafka.unique("retained")
        let cluster = try await TestKafka.cluster(brokers: 1, topic: topic, partitions: 2)
        defer { cluster.shutdown() }
        let watch = try EmbeddedKafkaRetentionWatch(bootstrapServers: cluster.bootstrapServers, topics: [topic: 2])
        defer { watch.stop() }
        let producer = try KafkaProducer(configuration: TestKafka.config(cluster.bootstrapServers))
        let value = [UInt8](repeating: 0x62, count: 90 * 1024)
        for i in 0..<80 {  // 7.2 MB into partition 0, nothing into partition 1
            _ = try await producer.send(OutgoingMessage(topic: topic, key: Array("k\(i)".utf8), value: value, partition: 0))
        }
        producer.close()
        let p0 = TopicPartition(topic: topic, partition: 0)
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline, (watch.partitions[p0]?.lowWatermark ?? 0) == 0 {
            try await Task.sleep(for: .milliseconds(200))
        }
        let state = try #require(watch.partitions[p0])
        #expect(state.warned, "passed 80 % of the mock's 5 MiB")
        #expect(state.lowWatermark > 0, "the deletion was seen")
        // An estimate (deleted records' bytes are scaled off), not a count: it stays near the limit.
        #expect(state.retainedBytes < Int64(2 * EmbeddedKafkaRetentionWatch.partitionBytes))
        #expect(watch.partitions[TopicPartition(topic: topic, partition: 1)]?.warned != true)
        #expect(EmbeddedKafkaRetentionWatch.partitions(forBytes: 30 * 1024 * 1024, minimum: 6) == 12)
    }
}
