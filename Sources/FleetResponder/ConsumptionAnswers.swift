import AppStoreServerAPI
import EntitlementDomain
import FleetSink
import Foundation
import Logging
import PostgresNIO

/// How the responder fills Apple's Consumption Information v2.
public struct ConsumptionPolicy: Sendable {
    /// `refundPreference` to send; nil leaves it out (Apple decides).
    public var refundPreference: ConsumptionRequest.RefundPreference?
    /// `sampleContentProvided`: whether the app gives a free sample or trial before purchase.
    public var sampleContentProvided: Bool
    /// Apple's window to answer a CONSUMPTION_REQUEST.
    public var answerWindow: Duration

    public init(refundPreference: ConsumptionRequest.RefundPreference? = nil, sampleContentProvided: Bool = false,
                answerWindow: Duration = .seconds(12 * 3600)) {
        self.refundPreference = refundPreference
        self.sampleContentProvided = sampleContentProvided
        self.answerWindow = answerWindow
    }
}

/// One CONSUMPTION_REQUEST as recorded in `consumption_answers`.
public struct ConsumptionClaim: Sendable, Equatable {
    public var notificationUUID: String
    public var environment: String
    public var transactionId: String
    public var originalTransactionId: String?
    public var subject: String?
    public var requestedAtMs: Int64

    public init(notificationUUID: String, environment: String, transactionId: String, originalTransactionId: String?,
                subject: String?, requestedAtMs: Int64) {
        self.notificationUUID = notificationUUID
        self.environment = environment
        self.transactionId = transactionId
        self.originalTransactionId = originalTransactionId
        self.subject = subject
        self.requestedAtMs = requestedAtMs
    }

    /// The claim for an event on the result topic, or nil when it is not an answerable CONSUMPTION_REQUEST.
    public init?(event: EntitlementEvent) {
        guard let n = event.notification, n.type == "CONSUMPTION_REQUEST", !n.uuid.isEmpty,
              let transactionId = event.transactionId, !transactionId.isEmpty else { return nil }
        self.init(notificationUUID: n.uuid, environment: event.environment, transactionId: transactionId,
                  originalTransactionId: event.originalTransactionId, subject: event.subject, requestedAtMs: n.signedDate)
    }
}

/// The database side of the responder: claims, the facts an answer is built from, and the record of each answer.
///
/// States of a row: `pending` (to send; `next_attempt_at` says when), `sending` (the request left; a crash here leaves
/// the row as it is and it is NOT sent again: at most one answer per request), `sent` (Apple accepted: 2xx),
/// `failed` (Apple refused it: 4xx, or retries ran out of the window), `expired` (the 12-hour window passed first).
///
/// Every call is bounded (`GuardedConnection.bounded`): by `statementTimeout`, and by the connection's channel closing
/// (postgres-nio never answers a statement sent after that). A bound that fires closes the connection; the responder
/// then reconnects.
public struct ConsumptionStore: Sendable {
    let guarded: GuardedConnection
    let logger: Logger
    let statementTimeout: Duration

    public init(connection: PostgresConnection, logger: Logger, statementTimeout: Duration = .seconds(30)) {
        self.init(guarded: GuardedConnection(connection), logger: logger, statementTimeout: statementTimeout)
    }

    init(guarded: GuardedConnection, logger: Logger, statementTimeout: Duration) {
        self.guarded = guarded
        self.logger = logger
        self.statementTimeout = statementTimeout
    }

    public typealias StatementTimedOut = GuardedConnection.StatementTimedOut

    /// Runs `body` on the connection within the bounds above.
    private func bounded<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        try await guarded.statement(within: statementTimeout, logger: logger, body)
    }

    /// Closes the connection.
    public func close() async { await guarded.close() }

    /// Records a request once (by notificationUUID). Returns true when this call created it.
    @discardableResult
    public func claim(_ c: ConsumptionClaim, window: Duration) async throws -> Bool {
        let deadline = c.requestedAtMs + window.components.seconds * 1000
        let logger = self.logger
        return try await bounded { connection in
            let rows = try await connection.query(
                """
                INSERT INTO consumption_answers (notification_uuid, environment, transaction_id, original_transaction_id, subject,
                    requested_at, deadline_at, state, attempts, next_attempt_at, created_at, updated_at)
                VALUES (\(c.notificationUUID), \(c.environment), \(c.transactionId), \(c.originalTransactionId), \(c.subject),
                    fleet_ms(\(c.requestedAtMs)), fleet_ms(\(deadline)), 'pending', 0, now(), now(), now())
                ON CONFLICT (notification_uuid) DO NOTHING
                RETURNING notification_uuid
                """, logger: logger).collect()
            return !rows.isEmpty
        }
    }

    /// Rows due now, oldest request first.
    public func due(limit: Int = 50) async throws -> [ConsumptionClaim] {
        let logger = self.logger
        return try await bounded { connection in
            var out: [ConsumptionClaim] = []
            let rows = try await connection.query(
                """
                SELECT notification_uuid, environment, transaction_id, original_transaction_id, subject,
                       (extract(epoch FROM requested_at) * 1000)::bigint
                FROM consumption_answers WHERE state = 'pending' AND next_attempt_at <= now()
                ORDER BY requested_at LIMIT \(limit)
                """, logger: logger)
            for try await (uuid, env, tx, original, subject, requested) in rows.decode((String, String, String, String?, String?, Int64).self) {
                out.append(ConsumptionClaim(notificationUUID: uuid, environment: env, transactionId: tx, originalTransactionId: original,
                                            subject: subject, requestedAtMs: requested))
            }
            return out
        }
    }

    /// The answer from what the fleet knows: consent only when the app recorded it, delivered when the purchase was
    /// credited (consumable ledger) or granted (an entitlement event with effect GRANT).
    public func answer(for c: ConsumptionClaim, policy: ConsumptionPolicy) async throws -> ConsumptionRequest {
        let keys = [c.subject, c.originalTransactionId, c.transactionId].compactMap { $0 }
        let logger = self.logger
        return try await bounded { connection in
            var consented = false
            for try await value in try await connection.query(
                """
                SELECT consented FROM consumption_consent WHERE subject = ANY(\(keys))
                ORDER BY recorded_at DESC LIMIT 1
                """, logger: logger).decode(Bool.self) {
                consented = value
            }
            var delivered = false
            for try await value in try await connection.query(
                """
                SELECT EXISTS (SELECT 1 FROM consumable_ledger WHERE environment = \(c.environment) AND transaction_id = \(c.transactionId)
                               AND entry = 'credit')
                    OR EXISTS (SELECT 1 FROM entitlement_events WHERE environment = \(c.environment) AND transaction_id = \(c.transactionId)
                               AND effect = 'GRANT')
                """, logger: logger).decode(Bool.self) {
                delivered = value
            }
            var percentage: Int? = nil
            for try await value in try await connection.query(
                """
                SELECT consumption_percentage FROM consumption_usage WHERE environment = \(c.environment)
                    AND transaction_id = \(c.transactionId)
                """, logger: logger).decode(Int?.self) {
                percentage = value
            }
            return ConsumptionRequest(
                customerConsented: consented, sampleContentProvided: policy.sampleContentProvided,
                deliveryStatus: delivered ? .delivered : .undeliveredOther, consumptionPercentage: percentage,
                refundPreference: policy.refundPreference)
        }
    }

    /// Moves a pending row to `sending` with the body about to go out; false if someone else took it.
    public func markSending(_ uuid: String, request: ConsumptionRequest) async throws -> Bool {
        let body = String(decoding: try JSONEncoder().encode(request), as: UTF8.self)
        let logger = self.logger
        return try await bounded { connection in
            let rows = try await connection.query(
                """
                UPDATE consumption_answers SET state = 'sending', attempts = attempts + 1, request = \(body)::jsonb,
                    customer_consented = \(request.customerConsented), delivery_status = \(request.deliveryStatus.rawValue),
                    consumption_percentage = \(request.consumptionPercentage), refund_preference = \(request.refundPreference?.rawValue),
                    updated_at = now()
                WHERE notification_uuid = \(uuid) AND state = 'pending'
                RETURNING notification_uuid
                """, logger: logger).collect()
            return !rows.isEmpty
        }
    }

    public func markSent(_ uuid: String, status: Int) async throws {
        let logger = self.logger
        try await bounded { connection in
            _ = try await connection.query(
                """
                UPDATE consumption_answers SET state = 'sent', response_status = \(status), response_error = NULL,
                    sent_at = now(), updated_at = now()
                WHERE notification_uuid = \(uuid)
                """, logger: logger)
        }
    }

    /// A retryable failure: back to pending, due again after `retryIn` (if the window allows; else failed).
    public func markRetry(_ uuid: String, status: Int?, error: String, retryIn: Duration) async throws {
        let logger = self.logger
        try await bounded { connection in
            _ = try await connection.query(
                """
                UPDATE consumption_answers SET
                    state = CASE WHEN now() + make_interval(secs => \(Double(retryIn.components.seconds))) < deadline_at
                                 THEN 'pending' ELSE 'failed' END,
                    response_status = \(status), response_error = \(error),
                    next_attempt_at = now() + make_interval(secs => \(Double(retryIn.components.seconds))), updated_at = now()
                WHERE notification_uuid = \(uuid)
                """, logger: logger)
        }
    }

    public func markFailed(_ uuid: String, status: Int?, error: String) async throws {
        let logger = self.logger
        try await bounded { connection in
            _ = try await connection.query(
                """
                UPDATE consumption_answers SET state = 'failed', response_status = \(status), response_error = \(error), updated_at = now()
                WHERE notification_uuid = \(uuid)
                """, logger: logger)
        }
    }

    /// Pending rows whose window has passed become `expired`; returns how many.
    @discardableResult
    public func expireOverdue() async throws -> Int {
        let logger = self.logger
        return try await bounded { connection in
            try await connection.query(
                """
                UPDATE consumption_answers SET state = 'expired', updated_at = now()
                WHERE state = 'pending' AND deadline_at <= now()
                RETURNING notification_uuid
                """, logger: logger).collect().count
        }
    }
}
