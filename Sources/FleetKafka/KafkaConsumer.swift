import Foundation
import Logging

/// A consumer-group member with at-least-once offset storing.
///
/// - Messages are fetched by a dedicated poll thread (never the cooperative pool) into a bounded buffer
///   (`maxBufferedMessages`); `nextBatch(maxMessages:timeout:)` / `batches(maxMessages:)` hand them out.
/// - Call `markProcessed` when a message's work is durably done (e.g. its result's delivery report succeeded). The
///   consumer stores offset+1 only for the contiguous prefix of finished offsets per partition, whatever order
///   completions arrive in; librdkafka commits stored offsets every `autoCommitIntervalMilliseconds`, on revoke and
///   on close.
/// - Rebalance: on revoke/loss, buffered messages and bookkeeping for those partitions are dropped and later
///   `markProcessed` calls for them are ignored (`__STATE` from offsets_store is handled the same way). Observe
///   `assignment`, `assignmentChanges` or `onAssignmentChange` to drop in-flight work for lost partitions.
/// - `close(deadline:)` never waits longer than the deadline (librdkafka 2.0.2 can hang in close, #4187).
public final class KafkaConsumer: Sendable {
    let core: ConsumerCore

    public init(configuration: KafkaConfiguration, groupId: String, topics: [String]) throws(KafkaError) {
        core = try ConsumerCore(configuration: configuration, groupId: groupId, topics: topics)
    }

    deinit { core.requestStop() }

    public var groupId: String { core.groupId }

    /// Returns up to `maxMessages` messages (in partition order) as soon as any are available, or an empty array
    /// after `timeout`, on cancellation, or once the consumer is closing. Throws a fatal `KafkaError`.
    public func nextBatch(maxMessages: Int = 500, timeout: Duration = .milliseconds(500)) async throws(KafkaError) -> [KafkaMessage] {
        try await core.nextBatch(maxMessages: maxMessages, timeout: timeout)
    }

    /// Non-empty batches until the consumer is closed (the sequence then ends) or a fatal error is thrown.
    public func batches(maxMessages: Int = 500) -> KafkaBatches {
        KafkaBatches(core: core, maxMessages: maxMessages)
    }

    public func markProcessed(_ message: KafkaMessage) {
        core.markProcessed([(message.topicPartition, message.offset)])
    }

    public func markProcessed(topic: String, partition: Int32, offset: Int64) {
        core.markProcessed([(TopicPartition(topic: topic, partition: partition), offset)])
    }

    /// Batch form: one offsets_store call for all partitions that advanced.
    public func markProcessed(_ messages: [KafkaMessage]) {
        core.markProcessed(messages: messages)
    }

    /// Batch form for any sequence of messages.
    public func markProcessed(_ messages: some Sequence<KafkaMessage>) {
        core.markProcessed(messages: Array(messages))
    }

    /// Partitions currently assigned to this member.
    public var assignment: Set<TopicPartition> { core.assignment }

    /// Assignment changes (single consumer of the stream); ends when the consumer is closed.
    public var assignmentChanges: AsyncStream<AssignmentChange> { core.assignmentStream }

    /// Called on the poll thread during a rebalance, before librdkafka applies it. Keep it short.
    public func onAssignmentChange(_ handler: (@Sendable (AssignmentChange) -> Void)?) { core.setHandler(handler) }

    /// Joined the group (received an assignment, possibly empty), not closing or failed, and no partition blocked by
    /// an offset reset under `OffsetResetPolicy.fail`.
    public var isReady: Bool { core.isReady }

    /// The application holds its work on purpose (a worker waiting for revocation status in `--revocation-check hard`
    /// mode, reported on its own readiness line): while on, the stall watch does not take the untaken buffer for a
    /// stall, so the process is not restarted for waiting.
    public func setHolding(_ on: Bool) { core.setHolding(on) }

    /// Partitions paused because their position went out of range under `OffsetResetPolicy.fail`.
    public var blockedPartitions: Set<TopicPartition> { core.blockedPartitions }

    /// Handed-out messages per partition not yet part of a stored prefix.
    public var outstanding: [TopicPartition: Int] { core.outstanding }

    /// Commits the offsets stored so far now, still as a group member, waiting at most `deadline`. Several members
    /// of one group in a process (the sink's writers) commit this way before any of them closes: a member that leaves
    /// starts a rebalance during which the others' closing commits would be refused.
    @discardableResult
    public func commit(deadline: Duration = .seconds(5)) async -> Bool {
        let shot = OneShot<Bool>()
        let core = self.core
        startThread(name: "fleet-kafka-consumer-commit") { shot.fulfil(core.commitStoredBlocking()) }
        return await shot.wait(timeout: deadline, onTimeout: false)
    }

    /// Commits stored offsets, leaves the group and releases the client, waiting at most `deadline`.
    /// Returns true when the close completed in time; false means the close was abandoned (the handle is leaked).
    @discardableResult
    public func close(deadline: Duration = .seconds(10)) async -> Bool {
        await core.close(timeout: deadline)
    }

    /// Blocking form of `close(deadline:)` for non-async callers.
    @discardableResult
    public func closeBlocking(deadline: Duration = .seconds(10)) -> Bool {
        let c = deadline.components
        return core.closeBlocking(timeoutSeconds: Double(c.seconds) + Double(c.attoseconds) / 1e18)
    }
}

public struct KafkaBatches: AsyncSequence, Sendable {
    public typealias Element = [KafkaMessage]
    let core: ConsumerCore
    let maxMessages: Int

    public struct AsyncIterator: AsyncIteratorProtocol {
        let core: ConsumerCore
        let maxMessages: Int
        public mutating func next() async throws -> [KafkaMessage]? {
            while true {
                let batch = try await core.nextBatch(maxMessages: maxMessages, timeout: .seconds(1))
                if !batch.isEmpty { return batch }
                if Task.isCancelled || !core.isRunning { return nil }
            }
        }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(core: core, maxMessages: maxMessages) }
}

extension ConsumerCore {
    var isRunning: Bool { !stopRequestedOrGone }
}
