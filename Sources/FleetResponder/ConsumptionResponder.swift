import AppStoreServerAPI
import EntitlementDomain
import FleetKafka
import FleetOperations
import FleetSink
import Foundation
import Logging
import PostgresNIO
import ServiceLifecycle
import Synchronization

public struct ResponderConfiguration: Sendable {
    public var kafka: KafkaConfiguration
    public var group: String
    public var resultTopic: String
    public var databaseURL: DatabaseURL
    public var policy: ConsumptionPolicy
    /// Pause before a request that failed retryably (after the client's own retries) is tried again.
    public var retryInterval: Duration
    /// How often due rows are looked for when no events arrive.
    public var sweepInterval: Duration
    /// The bound on each database call (a call past it closes the connection, and the responder reconnects).
    public var statementTimeout: Duration
    /// Back-off between reconnection attempts while the database is unavailable: doubling from `initialBackoff`.
    public var initialBackoff: Duration
    public var maxBackoff: Duration

    public init(kafka: KafkaConfiguration, group: String = "fleet-responder", resultTopic: String = FleetTopics.result,
                databaseURL: DatabaseURL, policy: ConsumptionPolicy = .init(), retryInterval: Duration = .seconds(60),
                sweepInterval: Duration = .seconds(5), statementTimeout: Duration = .seconds(30),
                initialBackoff: Duration = .milliseconds(100), maxBackoff: Duration = .seconds(5)) {
        self.kafka = kafka
        self.group = group
        self.resultTopic = resultTopic
        self.databaseURL = databaseURL
        self.policy = policy
        self.retryInterval = retryInterval
        self.sweepInterval = sweepInterval
        self.statementTimeout = statementTimeout
        self.initialBackoff = initialBackoff
        self.maxBackoff = maxBackoff
    }
}

/// Answers Apple's CONSUMPTION_REQUESTs: reads them from the result topic (as verified events), records each once in
/// `consumption_answers` (the Kafka offset is committed only after that), then sends Consumption Information v2 for
/// every due row and records Apple's response. A request is sent at most once; retryable failures (429, 5xx, network)
/// go back to `pending` until the 12-hour window closes.
///
/// The database may go away (a restart, a failover): the responder then reports itself not ready, closes its
/// connection, backs off and reconnects, and goes on where it stopped: the messages not yet recorded are claimed again
/// (a claim is idempotent) before their offsets are marked, and Apple's answer to a request already sent, if it could
/// not be recorded, is recorded first. A message whose request PostgreSQL refuses for its data (SQLSTATE class 22/23)
/// is logged and skipped, so it cannot hold the partition.
public final class ConsumptionResponder: Service {
    let configuration: ResponderConfiguration
    let client: AppStoreServerAPIClient
    let logger: Logger
    let onDatabaseReady: @Sendable (Bool) -> Void
    /// Apple's answers to requests that were sent but whose record failed: written before anything else.
    private let unrecorded = Mutex<[SendOutcome]>([])

    public init(
        configuration: ResponderConfiguration, client: AppStoreServerAPIClient, logger: Logger,
        onDatabaseReady: @escaping @Sendable (Bool) -> Void = { _ in }
    ) {
        self.configuration = configuration
        self.client = client
        self.logger = logger
        self.onDatabaseReady = onDatabaseReady
    }

    /// What happened to one request sent to Apple, as `consumption_answers` records it.
    enum SendOutcome: Sendable {
        case sent(uuid: String, status: Int)
        case retry(uuid: String, status: Int?, error: String, retryIn: Duration)
        case failed(uuid: String, status: Int?, error: String)

        func record(in store: ConsumptionStore) async throws {
            switch self {
            case .sent(let uuid, let status): try await store.markSent(uuid, status: status)
            case .retry(let uuid, let status, let error, let retryIn):
                try await store.markRetry(uuid, status: status, error: error, retryIn: retryIn)
            case .failed(let uuid, let status, let error): try await store.markFailed(uuid, status: status, error: error)
            }
        }
    }

    public func run() async throws {
        let consumer = try KafkaConsumer(configuration: configuration.kafka, groupId: configuration.group, topics: [configuration.resultTopic])
        var store: ConsumptionStore?
        var pending: [KafkaMessage] = []
        var lastSweep = ContinuousClock.now - configuration.sweepInterval
        var attempt = 0
        onDatabaseReady(false)
        defer { onDatabaseReady(false) }
        do {
            while !Task.isCancelled && !Task.isShuttingDownGracefully {
                if pending.isEmpty {
                    pending = try await consumer.nextBatch(maxMessages: 200, timeout: .milliseconds(500))
                }
                do {
                    if store == nil {
                        store = try await connect()
                        onDatabaseReady(true)
                    }
                    guard let live = store else { continue }
                    try await recordUnrecorded(live)
                    var claimed = 0
                    while let message = pending.first {
                        if try await claim(message, store: live) { claimed += 1 }
                        consumer.markProcessed(message)
                        pending.removeFirst()
                    }
                    if claimed > 0 || ContinuousClock.now - lastSweep >= configuration.sweepInterval {
                        lastSweep = ContinuousClock.now
                        try await sweep(live)
                    }
                    attempt = 0
                } catch {
                    attempt += 1
                    onDatabaseReady(false)
                    await store?.close()
                    store = nil
                    let delay = Backoff(initial: configuration.initialBackoff, maximum: configuration.maxBackoff).delay(afterAttempt: attempt)
                    logger.warning("database unavailable; retrying", metadata: [
                        "attempt": "\(attempt)", "delay": "\(delay)", "error": "\(SinkService.brief(error))",
                        "unclaimed": "\(pending.count)", "unrecorded": "\(unrecorded.withLock { $0.count })",
                    ])
                    if Task.isShuttingDownGracefully { break }
                    try await Task.sleep(for: delay)
                }
            }
        } catch {
            _ = await consumer.close(deadline: .seconds(10))
            await store?.close()
            throw error
        }
        _ = await consumer.close(deadline: .seconds(10))
        await store?.close()
    }

    /// Connects within the statement timeout (a connect that never completes must not hold the responder either).
    private func connect() async throws -> ConsumptionStore {
        let connection = try await GuardedConnection.connect(
            try configuration.databaseURL.connectionConfiguration(), id: 1, within: configuration.statementTimeout, logger: logger)
        return ConsumptionStore(guarded: connection, logger: logger, statementTimeout: configuration.statementTimeout)
    }

    /// Records the claim in `message`, if it holds one; true when this call created it. A claim PostgreSQL refuses for
    /// its data is logged and skipped (false); any other error is thrown (the message is claimed again later).
    private func claim(_ message: KafkaMessage, store: ConsumptionStore) async throws -> Bool {
        guard let event = try? EntitlementEvent(jsonBytes: message.value), let claim = ConsumptionClaim(event: event) else {
            return false
        }
        do {
            return try await store.claim(claim, window: configuration.policy.answerWindow)
        } catch {
            guard let state = SinkService.refusedData(error) else { throw error }
            logger.error("consumption request refused by the database; skipped", metadata: [
                "notificationUUID": "\(claim.notificationUUID)", "sqlstate": "\(state)",
                "topic": "\(message.topic)", "partition": "\(message.partition)", "offset": "\(message.offset)",
            ])
            return false
        }
    }

    private func recordUnrecorded(_ store: ConsumptionStore) async throws {
        while let outcome = unrecorded.withLock({ $0.first }) {
            try await outcome.record(in: store)
            unrecorded.withLock { _ = $0.removeFirst() }
        }
    }

    /// Sends every due answer once; returns how many were sent.
    @discardableResult
    public func sweep(_ store: ConsumptionStore) async throws -> Int {
        let expired = try await store.expireOverdue()
        if expired > 0 { logger.warning("consumption requests expired unanswered", metadata: ["count": "\(expired)"]) }
        var sent = 0
        for claim in try await store.due() {
            let answer = try await store.answer(for: claim, policy: configuration.policy)
            guard try await store.markSending(claim.notificationUUID, request: answer) else { continue }
            let outcome = await send(answer, for: claim)
            if case .sent = outcome { sent += 1 }
            do {
                try await outcome.record(in: store)
            } catch {
                // Apple has answered; the row must not stay `sending`. Recorded first once the database is back.
                unrecorded.withLock { $0.append(outcome) }
                throw error
            }
        }
        return sent
    }

    /// Sends one answer to Apple; what happened, for `consumption_answers`.
    private func send(_ answer: ConsumptionRequest, for claim: ConsumptionClaim) async -> SendOutcome {
        let uuid = claim.notificationUUID
        do {
            try await client.sendConsumptionInformation(transactionId: claim.transactionId, answer)
        } catch {
            var status: Int? = nil
            if case .api(let s, _, _, _) = error { status = s }
            if case .unauthorized = error { status = 401 }
            if error.isRetryable {
                logger.warning("consumption information failed; will retry", metadata: ["notificationUUID": "\(uuid)", "error": "\(error)"])
                return .retry(uuid: uuid, status: status, error: error.description, retryIn: configuration.retryInterval)
            }
            logger.error("consumption information refused", metadata: ["notificationUUID": "\(uuid)", "error": "\(error)"])
            return .failed(uuid: uuid, status: status, error: error.description)
        }
        logger.info("consumption information sent", metadata: [
            "notificationUUID": "\(uuid)", "transactionId": "\(claim.transactionId)",
            "deliveryStatus": "\(answer.deliveryStatus.rawValue)", "customerConsented": "\(answer.customerConsented)",
        ])
        return .sent(uuid: uuid, status: 202)
    }
}
