import FleetOperations
import FleetTestSupport
import Foundation
import Synchronization
import Testing

@testable import FleetKafka

/// Real TCP against librdkafka's mock cluster hosted in the test process. Serialized: each test is CPU-heavy on
/// a 2-core machine and consumer-group timing (session.timeout 6 s) must not be starved.
@Suite(.serialized) struct KafkaIntegrationTests {

    /// Consumes until every partition reached `perPartition` messages (or the timeout), marking each processed.
    /// Returns values per partition in delivery order.
    static func consumeAll(_ consumer: KafkaConsumer, partitions: Int, perPartition: Int, timeout: Duration) async throws
        -> [Int32: [(Int64, String)]]
    {
        var seen: [Int32: [(Int64, String)]] = [:]
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            let batch = try await consumer.nextBatch(maxMessages: 1000, timeout: .milliseconds(500))
            for m in batch { seen[m.partition, default: []].append((m.offset, String(decoding: m.value, as: UTF8.self))) }
            consumer.markProcessed(batch)
            let distinct = (0..<partitions).map { p in Set(seen[Int32(p)]?.map(\.0) ?? []).count }
            if distinct.allSatisfy({ $0 >= perPartition }) { break }
        }
        return seen
    }

    @Test func produceThenConsume100kAcrossSixPartitions() async throws {
        let perPartition = 100_000 / 6 + 1  // 100,002 messages
        let (cluster, topic) = try await TestKafka.sequencedCluster("bulk", partitions: 6, perPartition: perPartition)
        defer { cluster.shutdown() }

        let consumer = try KafkaConsumer(configuration: TestKafka.config(cluster.bootstrapServers),
                                         groupId: TestKafka.unique("bulk-g"), topics: [topic])
        let seen = try await Self.consumeAll(consumer, partitions: 6, perPartition: perPartition, timeout: .seconds(60))
        #expect(await consumer.close(deadline: .seconds(10)))

        for p in 0..<6 {
            let got = seen[Int32(p)] ?? []
            // Single consumer, no rebalance: every offset exactly once, in order, with the producer's sequence.
            #expect(got.count == perPartition, "partition \(p): \(got.count) messages")
            let orderedAndComplete = got.enumerated().allSatisfy { i, e in e.0 == Int64(i) && e.1 == "\(p):\(i)" }
            #expect(orderedAndComplete, "partition \(p) lost or reordered messages")
        }
        // Everything processed was committed on close.
        let lag = try await KafkaAdmin(configuration: TestKafka.config(cluster.bootstrapServers))
            .consumerLag(groupId: consumer.groupId, topics: [topic])
        #expect(lag.map(\.committedOffset) == Array(repeating: Int64(perPartition), count: 6))
        #expect(lag.totalLag == 0)
    }

    /// A slow application and a tiny prefetch queue: librdkafka 2.0.2's queue fills again and again and its fetch
    /// stops; the consumer's seek that wakes it (`ConsumerState.stalledFetchPositions`) must neither skip nor repeat a
    /// message, across three brokers (one broker thread each).
    @Test func fetchWokenAfterBackpressureDeliversEveryOffsetOnceInOrder() async throws {
        let (wakes, metric) = try await consumeThroughATinyQueue("wake", maxBuffered: 100, maxBatch: 50, pause: .microseconds(200))
        #expect(wakes > 0, "the fetch was never woken: the test did not exercise the seek")
        #expect(metric["backpressure", default: 0] > 0, "fleet_consumer_fetch_wakes_total by cause: \(metric)")
    }

    /// A fast application and a tiny prefetch queue, with no backpressure at all (the buffer is never full): the
    /// fetch still outruns the poll thread, librdkafka 2.0.2's queue reaches its limit and its fetch stops for a
    /// second. The poll round that sees the queue near its limit arms the wake (`PrefetchLimit`); every offset still
    /// arrives once, in order.
    @Test func fetchWokenAfterTheQueueNearedItsLimitWithoutBackpressure() async throws {
        let (wakes, metric) = try await consumeThroughATinyQueue("wake-fast", maxBuffered: 1_000_000, maxBatch: 5_000, pause: nil)
        #expect(wakes > 0, "the queue never came near its limit, or the wake was not armed by it")
        #expect(metric == ["queue_limit": wakes], "fleet_consumer_fetch_wakes_total by cause: \(metric)")
    }

    /// Consumes 6 partitions of 3,000 sequenced messages through a 16 KB librdkafka queue, marking each batch processed
    /// (after `pause`, when given: the application behind the fetch), checks every offset arrived once and in order,
    /// and returns how often the consumer woke the fetch, and `fleet_consumer_fetch_wakes_total` of its group by cause.
    private func consumeThroughATinyQueue(
        _ name: String, maxBuffered: Int, maxBatch: Int, pause: Duration?
    ) async throws -> (wakes: Int, metric: [String: Int]) {
        FleetMetrics.bootstrap()
        let perPartition = 3_000
        let (cluster, topic) = try await TestKafka.sequencedCluster(name, partitions: 6, perPartition: perPartition)
        defer { cluster.shutdown() }
        var config = TestKafka.config(cluster.bootstrapServers)
        config.properties = ["queued.max.messages.kbytes": "16", "max.partition.fetch.bytes": "4096"]
        config.maxBufferedMessages = maxBuffered
        let consumer = try KafkaConsumer(configuration: config, groupId: TestKafka.unique("\(name)-g"), topics: [topic])
        var seen: [Int32: [(Int64, String)]] = [:]
        let deadline = ContinuousClock.now + .seconds(120)
        while ContinuousClock.now < deadline {
            let batch = try await consumer.nextBatch(maxMessages: maxBatch, timeout: .milliseconds(500))
            for m in batch { seen[m.partition, default: []].append((m.offset, String(decoding: m.value, as: UTF8.self))) }
            consumer.markProcessed(batch)
            if (0..<6).allSatisfy({ (seen[Int32($0)]?.count ?? 0) >= perPartition }) { break }
            if let pause { try await Task.sleep(for: pause) }  // behind the fetch: the buffer fills, polling stops
        }
        let wakes = consumer.core.fetchWakes
        let group = consumer.groupId
        #expect(await consumer.close(deadline: .seconds(10)))
        var metric: [String: Int] = [:]
        for line in OffsetResetTests.metricsText().split(separator: "\n")
        where line.hasPrefix("fleet_consumer_fetch_wakes_total{group=\"\(group)\",") {
            let cause = line.split(separator: "cause=\"").last?.split(separator: "\"").first.map(String.init) ?? "?"
            metric[cause] = line.split(separator: " ").last.flatMap { Int($0) }
        }
        for p in 0..<6 {
            let got = seen[Int32(p)] ?? []
            #expect(got.count == perPartition, "partition \(p): \(got.count) messages")
            let orderedAndComplete = got.enumerated().allSatisfy { i, e in e.0 == Int64(i) && e.1 == "\(p):\(i)" }
            #expect(orderedAndComplete, "partition \(p) lost, repeated or reordered messages")
        }
        return (wakes, metric)
    }

    @Test func lagIsProducedMinusCommittedAndOutOfOrderCompletionNeverSkipsWork() async throws {
        let topic = TestKafka.unique("lag")
        let cluster = try await TestKafka.cluster(brokers: 1, topic: topic, partitions: 3)
        defer { cluster.shutdown() }
        try await TestKafka.produceSequenced(cluster.bootstrapServers, topic: topic, partitions: 3, perPartition: 100)
        let config = TestKafka.config(cluster.bootstrapServers)
        let group = TestKafka.unique("lag-g")
        let consumer = try KafkaConsumer(configuration: config, groupId: group, topics: [topic])
        let messages = Dictionary(grouping: try await TestKafka.consume(consumer, count: 300), by: \.partition)
        #expect(consumer.isReady)
        #expect(consumer.assignment.count == 3)
        // Partition 0: finished in reverse order, except offset 40 which never finishes -> committed 40.
        for m in (messages[0] ?? []).reversed() where m.offset != 40 { consumer.markProcessed(m) }
        // Partition 1: offsets 0..<70 finished in a shuffled order -> committed 70.
        for m in (messages[1] ?? []).prefix(70).shuffled() {
            consumer.markProcessed(topic: m.topic, partition: m.partition, offset: m.offset)
        }
        // Partition 2: nothing finished -> no committed offset.
        #expect(consumer.outstanding[TopicPartition(topic: topic, partition: 0)] == 60)
        #expect(await consumer.close(deadline: .seconds(10)))

        // 50 more on partition 0 after the commit.
        let producer = try KafkaProducer(configuration: config)
        for i in 0..<50 {
            _ = try await producer.send(OutgoingMessage(topic: topic, value: Array("extra \(i)".utf8), partition: 0))
        }
        producer.close()

        let lag = try await KafkaAdmin(configuration: config).consumerLag(groupId: group, topics: [topic])
        let byPartition = Dictionary(uniqueKeysWithValues: lag.map { ($0.partition, $0) })
        #expect(byPartition[0]?.committedOffset == 40)
        #expect(byPartition[0]?.highWatermark == 150)
        #expect(byPartition[0]?.lag == 110)
        #expect(byPartition[1]?.committedOffset == 70)
        #expect(byPartition[1]?.lag == 30)
        #expect(byPartition[2]?.committedOffset == nil)
        #expect(byPartition[2]?.lag == 100)
        #expect(lag.totalLag == 240)
    }

    @Test func commitStoresTheFinishedPrefixWhileStillAMember() async throws {
        let topic = TestKafka.unique("commit")
        let cluster = try await TestKafka.cluster(brokers: 1, topic: topic, partitions: 2)
        defer { cluster.shutdown() }
        try await TestKafka.produceSequenced(cluster.bootstrapServers, topic: topic, partitions: 2, perPartition: 50)
        var config = TestKafka.config(cluster.bootstrapServers)
        config.autoCommitIntervalMilliseconds = 600_000  // only the explicit commit can commit within this test
        let group = TestKafka.unique("commit-g")
        let consumer = try KafkaConsumer(configuration: config, groupId: group, topics: [topic])
        let seen = try await TestKafka.consume(consumer, count: 100)
        #expect(seen.count == 100)
        for m in seen where m.partition == 0 || m.offset < 20 { consumer.markProcessed(m) }
        let admin = KafkaAdmin(configuration: config)
        let before = try await admin.consumerLag(groupId: group, topics: [topic])
        #expect(before.allSatisfy { $0.committedOffset == nil }, "nothing committed before the explicit commit")
        #expect(await consumer.commit(deadline: .seconds(10)))
        #expect(consumer.isReady, "still a member after committing")
        let after = Dictionary(uniqueKeysWithValues: try await admin.consumerLag(groupId: group, topics: [topic])
            .map { ($0.partition, $0.committedOffset) })
        #expect(after[0] == 50)
        #expect(after[1] == 20)
        #expect(await consumer.close(deadline: .seconds(10)))
        #expect(await consumer.commit(deadline: .seconds(2)) == false, "a closed consumer has nothing to commit with")
    }

    @Test func brokerDownForSecondsDuringProductionAndConsumptionLosesNothing() async throws {
        let topic = TestKafka.unique("down")
        let cluster = try await TestKafka.cluster(brokers: 3, topic: topic, partitions: 6, replicationFactor: 3)
        defer { cluster.shutdown() }
        let config = TestKafka.config(cluster.bootstrapServers)
        let consumer = try KafkaConsumer(configuration: config, groupId: TestKafka.unique("down-g"), topics: [topic])
        let producer = try KafkaProducer(configuration: config)
        let counts = Counts()
        let perPartition = 1_500
        let total = perPartition * 6

        // Produce for ~6 s in small steps while the consumer consumes; broker 2 is down from ~1.5 s to ~5.5 s.
        let produceTask = Task {
            for seq in 0..<perPartition {
                for p in 0..<6 {
                    try producer.enqueue(OutgoingMessage(topic: topic, value: Array("\(p):\(seq)".utf8),
                                                         partition: Int32(p))) { counts.record($0) }
                }
                if seq % 50 == 0 { try await Task.sleep(for: .milliseconds(200)) }
            }
        }
        let faultTask = Task {
            try await Task.sleep(for: .milliseconds(1500))
            try cluster.setBrokerDown(2)
            try await Task.sleep(for: .seconds(4))
            try cluster.setBrokerUp(2)
        }
        let consumeTask = Task {
            try await Self.consumeAll(consumer, partitions: 6, perPartition: perPartition, timeout: .seconds(90))
        }
        try await produceTask.value
        try await faultTask.value
        #expect(await producer.flush(deadline: .seconds(60)))
        producer.close()
        #expect(counts.ok == total, "delivered \(counts.ok) of \(total); failures: \(counts.failures.prefix(3))")
        #expect(counts.failures.isEmpty)

        let seen = try await consumeTask.value
        #expect(await consumer.close(deadline: .seconds(10)))
        for p in 0..<6 {
            let got = seen[Int32(p)] ?? []
            let values = Set(got.map(\.1))
            let missing = (0..<perPartition).filter { !values.contains("\(p):\($0)") }
            #expect(missing.isEmpty, "partition \(p) lost \(missing.count) messages, e.g. \(missing.prefix(5))")
            // Per-partition order of first deliveries is the production order.
            var firstSeen: [String] = []
            var dedup = Set<String>()
            for (_, v) in got where dedup.insert(v).inserted { firstSeen.append(v) }
            #expect(firstSeen == (0..<perPartition).map { "\(p):\($0)" }, "partition \(p) out of order")
        }
    }

    @Test func retriableProduceErrorsAreRetriedWithoutLossOrDuplicates() async throws {
        let topic = TestKafka.unique("retry")
        let cluster = try await TestKafka.cluster(brokers: 1, topic: topic, partitions: 1)
        defer { cluster.shutdown() }
        let config = TestKafka.config(cluster.bootstrapServers)
        let producer = try KafkaProducer(configuration: config)
        // Warm up (producer id, metadata), then inject errors for the next Produce requests.
        _ = try await producer.send(OutgoingMessage(topic: topic, value: Array("warmup".utf8)))
        try cluster.pushRequestErrors(apiKey: KafkaAPIKey.produce, errors: [
            KafkaErrorCode.notLeaderForPartition, KafkaErrorCode.notEnoughReplicas,
            KafkaErrorCode.leaderNotAvailable, KafkaErrorCode.requestTimedOut, KafkaErrorCode.notEnoughReplicas,
        ])
        var reports: [DeliveryReport] = []
        try await withThrowingTaskGroup(of: DeliveryReport.self) { group in
            for i in 0..<200 {
                group.addTask { try await producer.send(OutgoingMessage(topic: topic, value: Array("m\(i)".utf8))) }
            }
            for try await r in group { reports.append(r) }
        }
        producer.close()
        #expect(reports.count == 200)

        let consumer = try KafkaConsumer(configuration: config, groupId: TestKafka.unique("retry-g"), topics: [topic])
        let seen = try await Self.consumeAll(consumer, partitions: 1, perPartition: 201, timeout: .seconds(30))
        await consumer.close(deadline: .seconds(5))
        let values = (seen[0] ?? []).map(\.1)
        #expect(values.count == 201, "idempotent producer: exactly one copy of each message")
        #expect(Set(values) == Set(["warmup"] + (0..<200).map { "m\($0)" }))
    }

    @Test(arguments: [
        (KafkaErrorCode.messageSizeTooLarge, "MSG_SIZE_TOO_LARGE", true),
        (KafkaErrorCode.invalidRecord, "INVALID_RECORD", true),
        (KafkaErrorCode.topicAuthorizationFailed, "TOPIC_AUTHORIZATION_FAILED", false),
    ])
    func permanentProduceErrorsSurfaceAsTypedErrors(code: Int32, name: String, idempotent: Bool) async throws {
        let topic = TestKafka.unique("perm")
        let cluster = try await TestKafka.cluster(brokers: 1, topic: topic, partitions: 1)
        defer { cluster.shutdown() }
        var config = TestKafka.config(cluster.bootstrapServers)
        config.idempotence = idempotent
        let producer = try KafkaProducer(configuration: config)
        _ = try await producer.send(OutgoingMessage(topic: topic, value: Array("warmup".utf8)))
        try cluster.pushRequestErrors(apiKey: KafkaAPIKey.produce, errors: [code])
        do {
            let r = try await producer.send(OutgoingMessage(topic: topic, value: Array("denied".utf8)))
            Issue.record("expected a typed error, got a delivery report \(r)")
        } catch {
            #expect(error.code == code)
            #expect(error.name == name)
            #expect(!error.isRetriable)
        }
        // Afterwards the producer still delivers (or, if librdkafka keeps the topic failed, reports that typed).
        do {
            let ok = try await producer.send(OutgoingMessage(topic: topic, value: Array("after".utf8)))
            #expect(ok.offset >= 1)
        } catch {
            #expect(error.code == code, "unexpected follow-up error \(error)")
        }
        producer.close()
    }

    @Test func unreachableLeaderSurfacesMessageTimeout() async throws {
        let topic = TestKafka.unique("timeout")
        let cluster = try await TestKafka.cluster(brokers: 1, topic: topic, partitions: 1)
        defer { cluster.shutdown() }
        var config = TestKafka.config(cluster.bootstrapServers)
        config.messageTimeoutMilliseconds = 1500
        let producer = try KafkaProducer(configuration: config)
        _ = try await producer.send(OutgoingMessage(topic: topic, value: Array("warmup".utf8)))
        try cluster.setBrokerDown(1)
        let started = ContinuousClock.now
        do {
            _ = try await producer.send(OutgoingMessage(topic: topic, value: Array("lost?".utf8)))
            Issue.record("expected _MSG_TIMED_OUT")
        } catch {
            #expect(error.code == KafkaErrorCode.messageTimedOut)
            #expect(error.isRetriable)
        }
        #expect(ContinuousClock.now - started < .seconds(15))
        try cluster.setBrokerUp(1)
        producer.close()
    }

    @Test func consumerCloseRespectsItsDeadlineAndRevokeDropsWork() async throws {
        let topic = TestKafka.unique("close")
        let cluster = try await TestKafka.cluster(brokers: 1, topic: topic, partitions: 2)
        defer { cluster.shutdown() }
        try await TestKafka.produceSequenced(cluster.bootstrapServers, topic: topic, partitions: 2, perPartition: 10)
        let consumer = try KafkaConsumer(configuration: TestKafka.config(cluster.bootstrapServers),
                                         groupId: TestKafka.unique("close-g"), topics: [topic])
        let changes = Recorder<AssignmentChange>()
        consumer.onAssignmentChange { c in changes.append(c) }
        var got: [KafkaMessage] = []
        let deadline = ContinuousClock.now + .seconds(20)
        while got.count < 20, ContinuousClock.now < deadline {
            got += try await consumer.nextBatch(maxMessages: 100, timeout: .milliseconds(500))
        }
        #expect(got.count == 20)
        let all = Set((0..<2).map { TopicPartition(topic: topic, partition: Int32($0)) })
        #expect(changes.values.contains(.assigned(all)))
        #expect(consumer.assignment == all)
        // Kill the only broker: the close cannot reach the coordinator and must still return by the deadline.
        try cluster.setBrokerDown(1)
        let started = ContinuousClock.now
        _ = await consumer.close(deadline: .seconds(3))
        #expect(ContinuousClock.now - started < .seconds(5))
        // After close nothing is tracked and late completions are ignored (no crash, no store).
        consumer.markProcessed(got)
        #expect(consumer.assignment.isEmpty)
        #expect(!consumer.isReady)
        #expect(try await consumer.nextBatch(maxMessages: 10, timeout: .milliseconds(100)).isEmpty)
        try cluster.setBrokerUp(1)
    }

    @Test func rebalanceRevokesPartitionsAndDropsTheirPendingWork() async throws {
        let topic = TestKafka.unique("rebalance")
        let cluster = try await TestKafka.cluster(brokers: 1, topic: topic, partitions: 2)
        defer { cluster.shutdown() }
        try await TestKafka.produceSequenced(cluster.bootstrapServers, topic: topic, partitions: 2, perPartition: 20)
        let config = TestKafka.config(cluster.bootstrapServers)
        let group = TestKafka.unique("rebalance-g")
        let a = try KafkaConsumer(configuration: config, groupId: group, topics: [topic])
        let changes = Recorder<AssignmentChange>()
        a.onAssignmentChange { changes.append($0) }
        var fromA: [KafkaMessage] = []
        var deadline = ContinuousClock.now + .seconds(20)
        while fromA.count < 40, ContinuousClock.now < deadline {
            fromA += try await a.nextBatch(maxMessages: 100, timeout: .milliseconds(300))
        }
        #expect(fromA.count == 40)
        #expect(a.outstanding.values.reduce(0, +) == 40)  // handed out, none finished

        // B joins: the group rebalances and A loses one partition, with its unfinished work.
        let b = try KafkaConsumer(configuration: config, groupId: group, topics: [topic])
        var fromB: [KafkaMessage] = []
        deadline = ContinuousClock.now + .seconds(30)
        while fromB.count < 20, ContinuousClock.now < deadline {
            _ = try await a.nextBatch(maxMessages: 100, timeout: .milliseconds(100))  // keeps A serving the rebalance
            fromB += try await b.nextBatch(maxMessages: 100, timeout: .milliseconds(100))
        }
        #expect(a.assignment.count == 1 && b.assignment.count == 1)
        #expect(a.assignment.isDisjoint(with: b.assignment))
        #expect(changes.values.contains { if case .revoked = $0 { return true } else { return false } })
        // The partition B owns now is redelivered to B from the start: nothing A left unfinished is lost.
        let bPartition = try #require(b.assignment.first)
        #expect(fromB.map(\.offset) == Array(0..<20))
        #expect(fromB.allSatisfy { $0.topicPartition == bPartition })
        // A's late completions for the lost partition store nothing and leave no bookkeeping behind.
        a.markProcessed(fromA.filter { $0.topicPartition == bPartition })
        #expect(a.outstanding[bPartition] == nil)
        b.markProcessed(fromB)
        #expect(await b.close(deadline: .seconds(10)))
        #expect(await a.close(deadline: .seconds(10)))
        let lag = try await KafkaAdmin(configuration: config).consumerLag(groupId: group, topics: [topic])
        #expect(lag.first { $0.partition == bPartition.partition }?.committedOffset == 20)
    }
}

@Suite struct KafkaConfigurationTests {
    @Test func propertiesAreAppliedLastAndValidated() throws {
        var c = KafkaConfiguration(bootstrapServers: "b:9092", properties: ["linger.ms": "50", "enable.idempotence": "false"])
        c.lingerMilliseconds = 5
        let producer = c.producerProperties()
        // Later entries win when librdkafka applies them in order.
        #expect(producer.last { $0.0 == "linger.ms" }?.1 == "50")
        #expect(producer.last { $0.0 == "enable.idempotence" }?.1 == "false")
        let consumer = KafkaConfiguration(bootstrapServers: "b:9092").consumerProperties(groupId: "g")
        #expect(consumer.last { $0.0 == "enable.auto.offset.store" }?.1 == "false")
        #expect(consumer.last { $0.0 == "enable.auto.commit" }?.1 == "true")
        #expect(try KafkaConfiguration.parseProperties(["security.protocol=SASL_SSL", "sasl.password=a=b"])
                == ["security.protocol": "SASL_SSL", "sasl.password": "a=b"])
        #expect(throws: KafkaError.self) { try KafkaConfiguration.parseProperties(["novalue"]) }
        // An unknown librdkafka property is a typed error naming it, not a crash.
        let bad = KafkaConfiguration(bootstrapServers: "b:9092", properties: ["no.such.property": "1"])
        do {
            _ = try KafkaProducer(configuration: bad)
            Issue.record("expected a configuration error")
        } catch {
            #expect(error.message.contains("no.such.property"))
        }
        // SASL/SSL settings pass through verbatim (librdkafka accepts them at configuration time).
        let sasl = KafkaConfiguration(bootstrapServers: "127.0.0.1:1", properties: [
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "u", "sasl.password": "p",
        ])
        let p = try KafkaProducer(configuration: sasl)
        p.close(timeout: .milliseconds(10))
    }

    @Test func boundedFetchFillsOnlyWhatTheOperatorLeftOut() async throws {
        let sink = KafkaConfiguration.withBoundedFetch([:])
        #expect(sink == ["queued.max.messages.kbytes": "20480", "max.partition.fetch.bytes": "131072", "fetch.max.bytes": "8388608"])
        // The worker's smaller requests (a fetch response is held whole while it is parsed).
        let worker = KafkaConfiguration.withBoundedFetch(["linger.ms": "1"], requestBytes: 4 << 20, queueKilobytes: 10 << 10)
        #expect(worker["fetch.max.bytes"] == "4194304")
        #expect(worker["queued.max.messages.kbytes"] == "10240" && worker["linger.ms"] == "1")
        // An operator's value wins over either default.
        let own = KafkaConfiguration.withBoundedFetch(["fetch.max.bytes": "1048576", "queued.max.messages.kbytes": "65536"],
                                                      requestBytes: 4 << 20, queueKilobytes: 10 << 10)
        #expect(own["fetch.max.bytes"] == "1048576" && own["queued.max.messages.kbytes"] == "65536")
        // librdkafka accepts the worker's set as consumer properties.
        let consumer = try KafkaConsumer(
            configuration: KafkaConfiguration(bootstrapServers: "127.0.0.1:1", properties: worker), groupId: "g", topics: ["t"])
        _ = await consumer.close(deadline: .seconds(2))
    }
}
