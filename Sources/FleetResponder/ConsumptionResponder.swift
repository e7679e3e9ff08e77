import AppStoreServerAPI
import EntitlementDomain
import FleetKafka
import FleetSink
import Foundation
import Logging
import PostgresNIO
import ServiceLifecycle

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

    public init(kafka: KafkaConfiguration, group: String = "fleet-responder", resultTopic: String = FleetTopics.result,
                databaseURL: DatabaseURL, policy: ConsumptionPolicy = .init(), retryInterval: Duration = .seconds(60),
                sweepInterval: Duration = .seconds(5)) {
        self.kafka = kafka
        self.group = group
        self.resultTopic = resultTopic
        self.databaseURL = databaseURL
        self.policy = policy
        self.retryInterval = retryInterval
        self.sweepInterval = sweepInterval
    }
}

/// Answers Apple's CONSUMPTION_REQUESTs: reads them from the result topic (as verified events), records each once in
/// `consumption_answers` (the Kafka offset is committed only after that), then sends Consumption Information v2 for
/// every due row and records Apple's response. A request is sent at most once; retryable failures (429, 5xx, network)
/// go back to `pending` until the 12-hour window closes.
public final class ConsumptionResponder: Service {
    let configuration: ResponderConfiguration
    let client: AppStoreServerAPIClient
    let logger: Logger

    public init(configuration: ResponderConfiguration, client: AppStoreServerAPIClient, logger: Logger) {
        self.configuration = configuration
        self.client = client
        self.logger = logger
    }

    public func run() async throws {
        let connection = try await PostgresConnection.connect(
            configuration: try configuration.databaseURL.connectionConfiguration(), id: 1, logger: logger)
        let store = ConsumptionStore(connection: connection, logger: logger)
        let consumer = try KafkaConsumer(configuration: configuration.kafka, groupId: configuration.group, topics: [configuration.resultTopic])
        var lastSweep = ContinuousClock.now - configuration.sweepInterval
        do {
            while !Task.isCancelled && !Task.isShuttingDownGracefully {
                let batch = try await consumer.nextBatch(maxMessages: 200, timeout: .milliseconds(500))
                var claimed = 0
                for message in batch {
                    if let event = try? EntitlementEvent(jsonBytes: message.value), let claim = ConsumptionClaim(event: event) {
                        if try await store.claim(claim, window: configuration.policy.answerWindow) { claimed += 1 }
                    }
                    consumer.markProcessed(message)
                }
                if claimed > 0 || ContinuousClock.now - lastSweep >= configuration.sweepInterval {
                    lastSweep = ContinuousClock.now
                    try await sweep(store)
                }
            }
        } catch {
            _ = await consumer.close(deadline: .seconds(10))
            try? await connection.close()
            throw error
        }
        _ = await consumer.close(deadline: .seconds(10))
        try? await connection.close()
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
            do {
                try await client.sendConsumptionInformation(transactionId: claim.transactionId, answer)
                try await store.markSent(claim.notificationUUID, status: 202)
                sent += 1
                logger.info("consumption information sent", metadata: [
                    "notificationUUID": "\(claim.notificationUUID)", "transactionId": "\(claim.transactionId)",
                    "deliveryStatus": "\(answer.deliveryStatus.rawValue)", "customerConsented": "\(answer.customerConsented)",
                ])
            } catch let e as AppStoreServerAPIError {
                var status: Int? = nil
                if case .api(let s, _, _, _) = e { status = s }
                if case .unauthorized = e { status = 401 }
                if e.isRetryable {
                    try await store.markRetry(claim.notificationUUID, status: status, error: e.description, retryIn: configuration.retryInterval)
                    logger.warning("consumption information failed; will retry", metadata: ["notificationUUID": "\(claim.notificationUUID)", "error": "\(e)"])
                } else {
                    try await store.markFailed(claim.notificationUUID, status: status, error: e.description)
                    logger.error("consumption information refused", metadata: ["notificationUUID": "\(claim.notificationUUID)", "error": "\(e)"])
                }
            }
        }
        return sent
    }
}
