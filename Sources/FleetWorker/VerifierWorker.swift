import AppStoreVerification
import Dispatch
import EntitlementDomain
import FleetKafka
import FleetOperations
import Foundation
import Logging
import Metrics
import ServiceLifecycle
import Synchronization

/// Everything a verifier worker needs, resolved from flags / environment / config file.
public struct WorkerConfiguration: Sendable {
    public var kafka: KafkaConfiguration
    public var group: String
    public var inputTopics: [String]
    public var resultTopic: String
    public var rejectedTopic: String
    public var policy: VerificationPolicy
    public var catalogue: ProductCatalogue
    public var requireKnownProducts: Bool
    /// Verification threads (default: every core).
    public var threads: Int
    public var maxBatch: Int
    public var shutdownDeadline: Duration
    public var chainCacheCapacity: Int
    public var lagInterval: Duration
    /// Online revocation checks (`--revocation-check`); nil: off.
    public var revocation: RevocationChecker?
    /// Consecutive retries of inputs whose revocation status is unavailable before readiness reports not ready.
    public var revocationRetriesBeforeNotReady: Int

    public init(
        kafka: KafkaConfiguration, group: String, inputTopics: [String], resultTopic: String, rejectedTopic: String,
        policy: VerificationPolicy, catalogue: ProductCatalogue = ProductCatalogue(), requireKnownProducts: Bool = false,
        threads: Int = ProcessInfo.processInfo.activeProcessorCount, maxBatch: Int = 1000,
        shutdownDeadline: Duration = .seconds(25), chainCacheCapacity: Int = 1024, lagInterval: Duration = .seconds(5),
        revocation: RevocationChecker? = nil, revocationRetriesBeforeNotReady: Int = 3
    ) {
        self.kafka = kafka
        self.group = group
        self.inputTopics = inputTopics
        self.resultTopic = resultTopic
        self.rejectedTopic = rejectedTopic
        self.policy = policy
        self.catalogue = catalogue
        self.requireKnownProducts = requireKnownProducts
        self.threads = max(1, threads)
        self.maxBatch = max(1, maxBatch)
        self.shutdownDeadline = shutdownDeadline
        self.chainCacheCapacity = chainCacheCapacity
        self.lagInterval = lagInterval
        self.revocation = revocation
        self.revocationRetriesBeforeNotReady = max(1, revocationRetriesBeforeNotReady)
    }
}

/// Consumes raw JWS topics, verifies in parallel, produces entitlement events (or rejections) in input order per
/// partition, and stores an input's offset only after every one of its outputs was acknowledged by the broker.
public final class VerifierWorker: Service, Sendable {
    /// Between attempts at a batch held for an unavailable revocation responder.
    static let revocationBackoff = Backoff(initial: .milliseconds(250), maximum: .seconds(30))
    /// Between attempts at delivering an output the broker refused.
    static let deliveryBackoff = Backoff(initial: .milliseconds(100), maximum: .seconds(5))
    public let configuration: WorkerConfiguration
    public let readiness: Readiness
    public let chainCache: ChainCache
    private let processor: InputProcessor
    private let logger: Logger
    private let metrics = WorkerMetrics()
    private let stats = Mutex(WorkerStats())

    public struct WorkerStats: Sendable {
        public var inputs = 0
        public var verified = 0
        public var rejected = 0
        public var events = 0
        public var deliveryRetries = 0
    }

    public var statistics: WorkerStats { stats.withLock { $0 } }

    public init(configuration: WorkerConfiguration, readiness: Readiness = Readiness(), logger: Logger) throws {
        self.configuration = configuration
        self.readiness = readiness
        self.logger = logger
        self.chainCache = ChainCache(capacity: configuration.chainCacheCapacity)
        let verifier = SignedDataVerifier(
            policy: configuration.policy, chainCache: chainCache, revocation: configuration.revocation)
        self.processor = InputProcessor(
            verifier: verifier,
            mapper: EntitlementMapper(catalogue: configuration.catalogue, requireKnownProducts: configuration.requireKnownProducts))
    }

    public func run() async throws {
        let c = configuration
        let consumer = try KafkaConsumer(configuration: c.kafka, groupId: c.group, topics: c.inputTopics)
        let producer = try KafkaProducer(configuration: c.kafka)
        readiness.set("kafka-assignment", false)
        logger.info("worker started", metadata: [
            "group": "\(c.group)", "topics": "\(c.inputTopics.joined(separator: ","))", "threads": "\(c.threads)",
        ])
        let inFlight = InFlightInputs()
        let lagTask = Task { [logger] in await Self.reportLag(configuration: c, logger: logger) }
        defer { lagTask.cancel() }

        await withGracefulShutdownHandler {
            while !Task.isCancelled && !Task.isShuttingDownGracefully {
                let batch: [KafkaMessage]
                do {
                    batch = try await consumer.nextBatch(maxMessages: c.maxBatch, timeout: .milliseconds(200))
                } catch {
                    logger.error("consume failed; retrying", metadata: ["error": "\(error)"])
                    readiness.set("kafka-assignment", false)
                    try? await Task.sleep(for: .milliseconds(500))
                    continue
                }
                readiness.set("kafka-assignment", consumer.isReady)
                self.publishCacheCounters()
                if batch.isEmpty { continue }
                metrics.batchSize.record(batch.count)
                await self.processBatch(batch, consumer: consumer, producer: producer, inFlight: inFlight)
            }
        } onGracefulShutdown: { [logger] in
            logger.info("graceful shutdown requested: finishing in-flight work")
        }
        readiness.set("kafka-assignment", false)
        // Finish: every output already enqueued gets its delivery report (or the deadline passes), then offsets of
        // completed inputs are stored and committed by the consumer's close.
        let deadline = ContinuousClock.now + c.shutdownDeadline
        await drainEmission()
        let flushed = await producer.flush(deadline: max(.milliseconds(100), (deadline - .now) * 0.6))
        if !flushed {
            logger.warning("some outputs were not acknowledged before the deadline; their inputs stay uncommitted and will be redelivered", metadata: ["outstanding": "\(inFlight.count)"])
        }
        let closed = await consumer.close(deadline: max(.milliseconds(100), deadline - .now))
        producer.close(timeout: .milliseconds(200))
        logger.info("worker stopped", metadata: ["consumer-closed-cleanly": "\(closed)", "inputs": "\(statistics.inputs)"])
    }

    /// Serial queue that enqueues outputs in input order (so per-partition order is kept across batches).
    private let emitQueue = DispatchQueue(label: "fleet.worker.emit")
    /// Batches verified but not yet fully enqueued: one may be emitting while the next is verified.
    private let emitSlots = DispatchSemaphore(value: 1)

    /// Verification (and mapping and event encoding) runs on dedicated threads (never the cooperative pool),
    /// `threads` at a time. The outputs are then enqueued in input order on a serial queue while the next batch is
    /// already being verified (the producer may block there for backpressure); at most one batch waits for it.
    /// Inputs whose revocation status is unavailable (`--revocation-check hard`) hold the whole batch back: they are
    /// verified again with backoff until they are verified or rejected, and nothing of the batch is emitted (nor new
    /// work taken) before; readiness goes not ready after `revocationRetriesBeforeNotReady` attempts. On shutdown the
    /// held batch is dropped unemitted: its offsets were never stored, so it is redelivered.
    func processBatch(_ batch: [KafkaMessage], consumer: KafkaConsumer, producer: KafkaProducer, inFlight: InFlightInputs) async {
        var prepared = await verifyOnThreads(batch)
        var attempt = 0
        while true {
            let held = prepared.indices.filter { if case .retryable = prepared[$0].outcome { return true }; return false }
            if held.isEmpty { break }
            attempt += 1
            if attempt == 1 { consumer.setHolding(true) }
            metrics.revocationRetries.increment(by: held.count)
            if attempt == configuration.revocationRetriesBeforeNotReady { readiness.set("revocation-status", false) }
            let backoff = Self.revocationBackoff.delay(afterAttempt: attempt)
            logger.warning("revocation status unavailable: batch held, retrying", metadata: [
                "inputs": "\(held.count)", "attempt": "\(attempt)", "backoff": "\(backoff)",
            ])
            let until = ContinuousClock.now + backoff
            while ContinuousClock.now < until {
                if Task.isCancelled || Task.isShuttingDownGracefully {
                    logger.info("shutdown while a batch waits for revocation status: left for redelivery", metadata: ["inputs": "\(batch.count)"])
                    consumer.setHolding(false)
                    return
                }
                try? await Task.sleep(for: .milliseconds(50))
            }
            let again = await verifyOnThreads(held.map { batch[$0] })
            for (k, i) in held.enumerated() { prepared[i] = again[k] }
        }
        if attempt > 0 {
            consumer.setHolding(false)
            readiness.set("revocation-status", true)
        }
        let settled = prepared
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            DispatchQueue.global(qos: .userInitiated).async {
                self.emitSlots.wait()
                self.emitQueue.async {
                    for (message, item) in zip(batch, settled) {
                        self.emit(message: message, outcome: item.outcome, outputs: item.outputs, consumer: consumer, producer: producer, inFlight: inFlight)
                    }
                    self.emitSlots.signal()
                }
                done.resume()
            }
        }
    }

    private func verifyOnThreads(_ batch: [KafkaMessage]) async -> [Prepared] {
        let threads = configuration.threads
        let processor = self.processor
        return await withCheckedContinuation { (done: CheckedContinuation<[Prepared], Never>) in
            DispatchQueue.global(qos: .userInitiated).async {
                done.resume(returning: Self.verifyInParallel(batch, processor: processor, threads: threads, metrics: self.metrics) { m, outcome in
                    self.outputs(for: m, outcome: outcome)
                })
            }
        }
    }

    /// Waits until every verified batch has been handed to the producer.
    func drainEmission() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in emitQueue.async { c.resume() } }
    }

    static func verifyInParallel(
        _ batch: [KafkaMessage], processor: InputProcessor, threads: Int, metrics: WorkerMetrics,
        outputs: @Sendable (KafkaMessage, ProcessOutcome) -> [OutgoingMessage] = { _, _ in [] }
    ) -> [Prepared] {
        let n = batch.count
        let results = ResultSlots(count: n)
        let chunks = min(n, threads * 4)
        let chunkSize = (n + chunks - 1) / chunks
        DispatchQueue.concurrentPerform(iterations: chunks) { chunk in
            let start = chunk * chunkSize
            let end = min(n, start + chunkSize)
            guard start < end else { return }
            for i in start..<end {
                let m = batch[i]
                let began = ContinuousClock.now
                let device = m.headers.last(where: { $0.key == FleetHeaders.deviceVerificationId })
                    .map { String(decoding: $0.value, as: UTF8.self) }
                let outcome = processor.process(
                    value: m.value, deviceVerificationId: device,
                    at: InputCoordinates(topic: m.topic, partition: m.partition, offset: m.offset))
                metrics.verifyLatency.recordNanoseconds((ContinuousClock.now - began).nanoseconds)
                // Only what emission needs is kept: the verified payloads are freed as soon as they are encoded,
                // so a batch waiting to be emitted holds its encoded outputs, not its decoded JSON trees.
                results.set(i, Prepared(outcome: OutcomeSummary(outcome), outputs: outputs(m, outcome)))
            }
        }
        return results.values
    }

    /// The messages an input produces: its entitlement events, or one rejected record carrying the original bytes.
    private func outputs(for m: KafkaMessage, outcome: ProcessOutcome) -> [OutgoingMessage] {
        switch outcome {
        case .events(let events, _):
            return events.map { e in
                OutgoingMessage(
                    topic: configuration.resultTopic,
                    key: Array(EntitlementMapper.partitionKey(for: e).utf8),
                    value: e.jsonBytes(),
                    headers: FleetHeaders.result(e, KafkaHeader.init(key:string:)))
            }
        case .rejected(let reason, let detail):
            return [OutgoingMessage(
                topic: configuration.rejectedTopic, key: m.key, value: m.value,
                headers: FleetHeaders.rejected(
                    reason: reason.rawValue, detail: detail, sourceTopic: m.topic, sourcePartition: m.partition,
                    sourceOffset: m.offset, KafkaHeader.init(key:string:)))]
        case .retryable:
            return []  // never emitted: processBatch verifies it again
        }
    }

    private func emit(
        message m: KafkaMessage, outcome: OutcomeSummary, outputs: [OutgoingMessage], consumer: KafkaConsumer,
        producer: KafkaProducer, inFlight: InFlightInputs
    ) {
        metrics.inputs(topic: m.topic).increment()
        switch outcome {
        case .verified(let events):
            metrics.verdict(verified: true, reason: "VERIFIED").increment()
            for e in events { metrics.events(kind: e.kind, effect: e.effect).increment() }
            stats.withLock { $0.inputs += 1; $0.verified += 1; $0.events += events.count }
        case .rejected(let reason):
            metrics.verdict(verified: false, reason: reason.rawValue).increment()
            stats.withLock { $0.inputs += 1; $0.rejected += 1 }
        case .retryable:
            return  // unreachable: processBatch emits only settled batches
        }
        if outputs.isEmpty {
            consumer.markProcessed(m)
            return
        }
        let remaining = Atomic<Int>(outputs.count)
        inFlight.add(1)
        let coordinates = (m.topic, m.partition, m.offset)
        for out in outputs {
            send(out, attempt: 0, producer: producer) {
                if remaining.subtract(1, ordering: .acquiringAndReleasing).newValue == 0 {
                    consumer.markProcessed(topic: coordinates.0, partition: coordinates.1, offset: coordinates.2)
                    inFlight.add(-1)
                }
            }
        }
    }

    /// Enqueues one output; a failed delivery is retried with backoff (broker errors are retryable) for as long as the
    /// process runs. The input's offset is not stored until every output is acknowledged, so a process that stops with
    /// outputs pending leaves the input to be redelivered.
    private func send(_ message: OutgoingMessage, attempt: Int, producer: KafkaProducer, onDelivered: @escaping @Sendable () -> Void) {
        let logger = self.logger
        let metrics = self.metrics
        let completion: @Sendable (Result<DeliveryReport, KafkaError>) -> Void = { [weak self] result in
            switch result {
            case .success:
                onDelivered()
            case .failure(let error):
                metrics.deliveryRetries.increment()
                self?.stats.withLock { $0.deliveryRetries += 1 }
                let backoff = Self.deliveryBackoff.delay(afterAttempt: attempt + 1)
                logger.warning("delivery failed; retrying", metadata: ["topic": "\(message.topic)", "error": "\(error)", "attempt": "\(attempt + 1)", "backoff": "\(backoff)"])
                DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(Int(backoff.nanoseconds))) { [weak self] in
                    self?.send(message, attempt: attempt + 1, producer: producer, onDelivered: onDelivered)
                }
            }
        }
        do {
            try producer.enqueue(message, completion: completion)
        } catch {
            completion(.failure(error))
        }
    }

    private func publishCacheCounters() {
        metrics.publishCache(hits: chainCache.hits, misses: chainCache.misses)
    }

    /// Publishes this group's consumer lag as `fleet_consumer_lag{group,topic,partition}` every `lagInterval`.
    static func reportLag(configuration c: WorkerConfiguration, logger: Logger) async {
        let admin = KafkaAdmin(configuration: c.kafka)
        await ConsumerLagGauge.run(group: c.group, every: c.lagInterval) {
            try await admin.consumerLag(groupId: c.group, topics: c.inputTopics)
                .map { ConsumerLagGauge.Sample(topic: $0.topic, partition: $0.partition, lag: $0.lag) }
        }
    }
}

/// Inputs whose outputs are not all acknowledged yet.
final class InFlightInputs: Sendable {
    private let value = Atomic<Int>(0)
    func add(_ n: Int) { value.add(n, ordering: .relaxed) }
    var count: Int { value.load(ordering: .relaxed) }
}

/// One verified input: its outcome and the messages it produces.
struct Prepared: Sendable {
    var outcome: OutcomeSummary
    var outputs: [OutgoingMessage]
}

/// What emission needs of an input's outcome (metrics and statistics): the kind and effect of each event, or the
/// rejection reason.
enum OutcomeSummary: Sendable {
    case verified(events: [(kind: String, effect: String)])
    case rejected(reason: RejectionReason)
    case retryable

    init(_ outcome: ProcessOutcome) {
        switch outcome {
        case .events(let events, _): self = .verified(events: events.map { ($0.kind, $0.effect.rawValue) })
        case .rejected(let reason, _): self = .rejected(reason: reason)
        case .retryable: self = .retryable
        }
    }
}

/// Pre-sized result slots written by index from several threads (each index exactly once).
final class ResultSlots: @unchecked Sendable {
    // Safety: every index is written by exactly one thread inside concurrentPerform, and read only after it returns.
    private let storage: UnsafeMutableBufferPointer<Prepared?>

    init(count: Int) {
        storage = .allocate(capacity: count)
        storage.initialize(repeating: nil)
    }

    deinit {
        storage.deinitialize()
        storage.deallocate()
    }

    func set(_ i: Int, _ v: Prepared) { storage[i] = v }

    var values: [Prepared] {
        storage.map { $0 ?? Prepared(outcome: .rejected(reason: RejectionReason(rawValue: "INTERNAL_ERROR")), outputs: []) }
    }
}

/// The worker's Prometheus metrics (names in the README and the chart's dashboard).
final class WorkerMetrics: Sendable {
    let batchSize = Recorder(label: "fleet_worker_batch_size", aggregate: true)
    let verifyLatency = Metrics.Timer(label: "fleet_worker_verify_seconds")
    let deliveryRetries = Counter(label: "fleet_worker_delivery_retries_total")
    let revocationRetries = Counter(label: "fleet_worker_revocation_retries_total")
    private let cacheHits = Counter(label: "fleet_verifier_chain_cache_hits_total")
    private let cacheMisses = Counter(label: "fleet_verifier_chain_cache_misses_total")
    private let published = Mutex<(hits: Int, misses: Int)>((0, 0))
    private let counters = Mutex<[CounterKey: Counter]>([:])

    /// A counter's label and dimension values (the dimension names are fixed per label).
    private struct CounterKey: Hashable {
        var label: String
        var values: [String]
    }

    private func counter(_ label: String, _ dims: [(String, String)]) -> Counter {
        let key = CounterKey(label: label, values: dims.map(\.1))
        return counters.withLock { c in
            if let existing = c[key] { return existing }
            let made = Counter(label: label, dimensions: dims)
            c[key] = made
            return made
        }
    }

    func inputs(topic: String) -> Counter { counter("fleet_worker_inputs_total", [("topic", topic)]) }

    func verdict(verified: Bool, reason: String) -> Counter {
        counter("fleet_worker_verdicts_total", [("verdict", verified ? "verified" : "rejected"), ("reason", reason)])
    }

    func events(kind: String, effect: String) -> Counter {
        counter("fleet_worker_events_total", [("kind", kind), ("effect", effect)])
    }

    func publishCache(hits: Int, misses: Int) {
        let (dh, dm) = published.withLock { p -> (Int, Int) in
            let d = (hits - p.hits, misses - p.misses)
            p = (hits, misses)
            return d
        }
        if dh > 0 { cacheHits.increment(by: dh) }
        if dm > 0 { cacheMisses.increment(by: dm) }
    }
}
