import FleetDevStack
import FleetOperations
import FleetTestSupport
import Foundation
import Testing

@testable import FleetKafka

/// The consumer stall watch: a partition with messages waiting that delivers none is reported (log, metrics,
/// `/readyz` line, not ready, then not live), and the report ends when messages flow again.
@Suite(.serialized) struct StallWatchTests {
    static let tp = TopicPartition(topic: "t", partition: 3)

    static func snapshot(_ delivered: Int64?, backpressured: Bool = false, partitions: Set<TopicPartition> = [tp]) -> StallWatch.Snapshot {
        StallWatch.Snapshot(partitions: partitions, delivered: delivered.map { [tp: $0] } ?? [:], backpressured: backpressured)
    }

    /// Rules without a cluster: the clock and the broker's answers are given.
    @Test func rules() {
        ConsumerStalls.reset()
        let group = "g-\(UUID().uuidString.prefix(6))"
        let watch = StallWatch(timeout: .seconds(10), group: group)
        let t0 = ContinuousClock.now
        var queries = 0
        let waiting: (TopicPartition) -> Result<(Int64, Int64), KafkaError> = { _ in queries += 1; return .success((0, 50)) }
        let caughtUp: (TopicPartition) -> Result<(Int64, Int64), KafkaError> = { _ in queries += 1; return .success((0, 20)) }

        watch.check(Self.snapshot(20), now: t0, query: waiting, committed: { _ in nil })
        watch.check(Self.snapshot(20), now: t0 + .seconds(9), query: waiting, committed: { _ in nil })
        #expect(queries == 0, "no query before the timeout")
        #expect(!watch.hasStall)

        // Idle at the end of the partition: not a stall.
        watch.check(Self.snapshot(20), now: t0 + .seconds(11), query: caughtUp, committed: { _ in nil })
        #expect(queries == 1)
        #expect(!watch.hasStall)

        // Messages waiting (high watermark 50 > position 20) and none delivered for the timeout: a stall.
        watch.check(Self.snapshot(20), now: t0 + .seconds(22), query: waiting, committed: { _ in nil })
        #expect(watch.hasStall)
        let stall = try? #require(ConsumerStalls.all.first { $0.group == group })
        #expect(stall?.position == 20)
        #expect(stall?.highWatermark == 50)
        #expect(ConsumerStalls.report.contains { $0.contains("t[3] group \(group)") && $0.contains("high watermark 50") })
        #expect(ConsumerStalls.isLive, "live until twice the timeout has passed since the stall was declared")

        // Progress ends it.
        watch.check(Self.snapshot(21), now: t0 + .seconds(23), query: waiting, committed: { _ in nil })
        #expect(!watch.hasStall)
        #expect(ConsumerStalls.all.isEmpty)

        // The application not taking messages (buffer full) is not a fetch stall.
        watch.check(Self.snapshot(21, backpressured: true), now: t0 + .seconds(60), query: waiting, committed: { _ in nil })
        watch.check(Self.snapshot(21, backpressured: true), now: t0 + .seconds(90), query: waiting, committed: { _ in nil })
        #expect(!watch.hasStall)

        // Nothing delivered yet: the committed offset is the position; a leader that does not answer is a stall too.
        let fresh = StallWatch(timeout: .seconds(10), group: group + "-2")
        fresh.check(Self.snapshot(nil), now: t0, query: waiting, committed: { _ in 7 })
        fresh.check(Self.snapshot(nil), now: t0 + .seconds(12), query: { _ in .failure(.invalidArgument("timed out")) }, committed: { _ in 7 })
        let down = try? #require(ConsumerStalls.all.first { $0.group == group + "-2" })
        #expect(down?.position == 7)
        #expect(down?.highWatermark == nil)
        #expect(down?.reason.contains("leader not answering") == true)

        // The application not asking for what is buffered for the whole timeout: a stall too, whatever the fetcher does.
        let app = StallWatch(timeout: .seconds(10), group: group + "-3")
        app.check(Self.snapshot(30), now: t0, query: waiting, committed: { _ in nil })
        var untaken = Self.snapshot(30, backpressured: true)
        untaken.untaken = [Self.tp: (count: 12, first: 18)]
        app.check(untaken, now: t0 + .seconds(11), query: waiting, committed: { _ in nil })
        let stuck = try? #require(ConsumerStalls.all.first { $0.group == group + "-3" })
        #expect(stuck?.position == 18)
        #expect(stuck?.reason.contains("application took none of 12") == true)
        #expect(app.hasStall)
        app.check(Self.snapshot(nil, partitions: []), now: t0 + .seconds(12), query: waiting, committed: { _ in nil })

        // Untaken messages already in a partition's very first round (buffered before any round ran): reported and
        // marked at once, so the consumer does not read as ready while its stall is reported.
        let early = StallWatch(timeout: .seconds(10), group: group + "-4")
        var firstRound = Self.snapshot(nil, backpressured: true)
        firstRound.untaken = [Self.tp: (count: 7, first: 0)]
        early.check(firstRound, now: t0, query: waiting, committed: { _ in nil })
        #expect(ConsumerStalls.all.contains { $0.group == group + "-4" })
        #expect(early.hasStall, "a stall reported is this consumer's stall")
        early.check(Self.snapshot(nil, partitions: []), now: t0 + .seconds(1), query: waiting, committed: { _ in nil })

        // A partition taken away ends its stall.
        fresh.check(Self.snapshot(nil, partitions: []), now: t0 + .seconds(13), query: waiting, committed: { _ in 7 })
        #expect(!fresh.hasStall)
        #expect(ConsumerStalls.all.filter { $0.group.hasPrefix(group) }.isEmpty)
    }

    /// On the embedded cluster: fetching paused inside librdkafka behind the consumer's back (what a wedged
    /// connection looks like from the application) while records wait. The stall is reported within the timeout plus
    /// a sampling round, the consumer is not ready, the metric counts it; resuming delivers the rest and ends it.
    @Test func aWedgedFetcherIsReportedAndRecovers() async throws {
        FleetMetrics.bootstrap()
        ConsumerStalls.reset()
        let topic = TestKafka.unique("stall")
        let cluster = try await TestKafka.cluster(brokers: 1, topic: topic, partitions: 1)
        defer { cluster.shutdown() }
        try await TestKafka.produceSequenced(cluster.bootstrapServers, topic: topic, partitions: 1, perPartition: 10)
        var config = TestKafka.config(cluster.bootstrapServers)
        config.stallTimeoutSeconds = 2
        let group = TestKafka.unique("stall-g")
        let consumer = try KafkaConsumer(configuration: config, groupId: group, topics: [topic])
        let first = try await TestKafka.consume(consumer, count: 10)
        #expect(first.count == 10)
        let tp = TopicPartition(topic: topic, partition: 0)
        consumer.core.pauseFetchBehindTheConsumersBackForTesting(tp)
        try await TestKafka.produceSequenced(cluster.bootstrapServers, topic: topic, partitions: 1, perPartition: 10)

        var stall: ConsumerStall?
        let deadline = ContinuousClock.now + .seconds(60)
        while stall == nil, ContinuousClock.now < deadline {
            _ = try await consumer.nextBatch(maxMessages: 100, timeout: .milliseconds(200))
            // The fetch-side stall (with the leader's high watermark). An application-side one may come first when
            // this test's task waited for a pool thread longer than the 2 s timeout, which is right, but not this case.
            stall = ConsumerStalls.all.first { $0.group == group && $0.highWatermark != nil }
        }
        let found = try #require(stall, "a stall is reported: \(ConsumerStalls.all.filter { $0.group == group })")
        #expect(found.topic == topic && found.partition == 0)
        #expect(found.position == 10)
        #expect(found.highWatermark == 20)
        #expect(!consumer.isReady, "a stalled consumer is not ready")
        // At least once: on a loaded machine a rebalance may end the first stall (the partition leaves and comes back)
        // and the watch declares it again.
        let line = OffsetResetTests.metricsText().split(separator: "\n")
            .first { $0.hasPrefix("fleet_consumer_stalls_total{topic=\"\(topic)\",partition=\"0\"} ") }
        #expect((line?.split(separator: " ").last.flatMap { Int($0) } ?? 0) >= 1, "\(line ?? "no stall counter")")

        // Past twice the timeout the process is no longer live (an orchestrator restarts it).
        let readiness = Readiness()
        readiness.addLivenessCheck("consumer-stalled") { ConsumerStalls.isLive }
        let liveBy = ContinuousClock.now + .seconds(30)
        while readiness.notLive.isEmpty, ContinuousClock.now < liveBy { try await Task.sleep(for: .milliseconds(200)) }
        #expect(readiness.notLive == ["consumer-stalled"])

        consumer.core.pauseFetchBehindTheConsumersBackForTesting(tp, resume: true)
        let rest = try await TestKafka.consume(consumer, count: 10)
        #expect(rest.map(\.offset) == Array(10..<20))
        let cleared = ContinuousClock.now + .seconds(30)
        while consumer.core.stallWatch?.hasStall == true, ContinuousClock.now < cleared {
            try await Task.sleep(for: .milliseconds(200))
        }
        #expect(consumer.isReady, "ready again once messages flow")
        #expect(readiness.notLive.isEmpty, "live again")
        #expect(ConsumerStalls.all.first { $0.group == group } == nil)
        #expect(await consumer.close(deadline: .seconds(10)))
    }

    /// `rd_kafka_offsets_store` refusing with `__STATE` (librdkafka not considering the partition assigned at that
    /// moment) must not make this consumer forget the partition: it once did, and every later message of it was
    /// filtered as "not assigned", silently, until the next rebalance (the chaos soak's wedged sink).
    @Test func anOffsetsStoreRefusalDoesNotDropThePartition() async throws {
        let topic = TestKafka.unique("state")
        let cluster = try await TestKafka.cluster(brokers: 1, topic: topic, partitions: 1)
        defer { cluster.shutdown() }
        try await TestKafka.produceSequenced(cluster.bootstrapServers, topic: topic, partitions: 1, perPartition: 5)
        let consumer = try KafkaConsumer(configuration: TestKafka.config(cluster.bootstrapServers),
                                         groupId: TestKafka.unique("state-g"), topics: [topic])
        let first = try await TestKafka.consume(consumer, count: 5)
        #expect(first.count == 5)
        let tp = TopicPartition(topic: topic, partition: 0)
        consumer.core.assignBehindTheConsumersBackForTesting(nil)
        consumer.markProcessed(first)  // refused by librdkafka with __STATE
        #expect(consumer.assignment.contains(tp), "the consumer still owns the partition")
        consumer.core.assignBehindTheConsumersBackForTesting(tp, offset: 5)
        try await TestKafka.produceSequenced(cluster.bootstrapServers, topic: topic, partitions: 1, perPartition: 5)
        let rest = try await TestKafka.consume(consumer, count: 5, timeout: .seconds(30))
        #expect(rest.map(\.offset) == Array(5..<10), "messages after the refusal are handed out, not filtered")
        #expect(await consumer.close(deadline: .seconds(10)))
    }

    /// An application that stops asking for messages while some are buffered (a sink writer stuck on its database,
    /// whatever inside it hangs) is a stall too: the fetcher has everything, but nothing is processed.
    @Test func anApplicationThatStopsTakingMessagesIsReported() async throws {
        ConsumerStalls.reset()
        let topic = TestKafka.unique("untaken")
        let cluster = try await TestKafka.cluster(brokers: 1, topic: topic, partitions: 1)
        defer { cluster.shutdown() }
        var config = TestKafka.config(cluster.bootstrapServers)
        config.stallTimeoutSeconds = 2
        let group = TestKafka.unique("untaken-g")
        let consumer = try KafkaConsumer(configuration: config, groupId: group, topics: [topic])
        // Join first (an empty topic), then records arrive and the application does not ask for them.
        let joinedBy = ContinuousClock.now + .seconds(60)
        while consumer.assignment.isEmpty, ContinuousClock.now < joinedBy { _ = try await consumer.nextBatch(maxMessages: 1, timeout: .milliseconds(200)) }
        try await TestKafka.produceSequenced(cluster.bootstrapServers, topic: topic, partitions: 1, perPartition: 7)
        var stall: ConsumerStall?
        let deadline = ContinuousClock.now + .seconds(60)
        while stall == nil, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(200))
            stall = ConsumerStalls.all.first { $0.group == group }
        }
        let found = try #require(stall, "a stall is reported")
        #expect(found.reason.contains("application took none of 7"), "\(found)")
        #expect(found.position == 0)
        #expect(!consumer.isReady)
        let all = try await TestKafka.consume(consumer, count: 7)
        #expect(all.count == 7)
        let cleared = ContinuousClock.now + .seconds(30)
        while consumer.core.stallWatch?.hasStall == true, ContinuousClock.now < cleared {
            _ = try await consumer.nextBatch(maxMessages: 10, timeout: .milliseconds(200))
        }
        #expect(consumer.isReady, "ready again once the application takes its messages and the partition is caught up")
        #expect(await consumer.close(deadline: .seconds(10)))
    }
}
