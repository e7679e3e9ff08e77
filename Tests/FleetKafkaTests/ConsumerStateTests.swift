import Testing

@testable import FleetKafka

/// The consumer's and producer's state rules, without librdkafka or a cluster.
@Suite struct ConsumerStateRules {
    let a0 = TopicPartition(topic: "a", partition: 0)
    let a1 = TopicPartition(topic: "a", partition: 1)

    func messages(_ tp: TopicPartition, _ offsets: ClosedRange<Int64>) -> [KafkaMessage] {
        offsets.map { KafkaMessage(topic: tp.topic, partition: tp.partition, offset: $0, key: nil, value: [], headers: [], timestampMilliseconds: nil) }
    }

    @Test func assignTracksAndAsksLibrdkafkaToAssign() {
        var s = ConsumerState()
        let (action, change) = s.rebalance(RebalanceEvent(kind: .assign, partitions: [a0, a1]))
        #expect(action == .assign)
        #expect(change == .assigned([a0, a1]))
        #expect(s.joined)
        #expect(s.assignment == [a0, a1])
        #expect(s.trackers.keys.sorted() == [a0, a1])
    }

    @Test func revokeDropsBufferedMessagesAndLaterCompletions() {
        var s = ConsumerState()
        _ = s.assign([a0, a1])
        s.accept(messages(a0, 0...4) + messages(a1, 0...2))
        let handed = s.take(2)  // a0 0 and 1 handed out
        #expect(handed.map(\.offset) == [0, 1])
        let (action, change) = s.rebalance(RebalanceEvent(kind: .revoke(lost: false), partitions: [a0]))
        #expect(action == .unassign)
        #expect(change == .revoked([a0], lost: false))
        #expect(s.buffered == 3, "a0's buffered messages are the new owner's")
        #expect(s.take(10).allSatisfy { $0.topicPartition == a1 })
        // Completing a0's handed-out messages stores nothing: the new owner redelivers them.
        #expect(s.complete([(a0, 0), (a0, 1)]).isEmpty)
        #expect(s.complete([(a1, 0)]) == [a1: 1])
    }

    @Test func completingWholeMessagesStoresPerPartitionRun() {
        var s = ConsumerState()
        _ = s.assign([a0, a1])
        s.accept(messages(a0, 0...5) + messages(a1, 0...3))
        let handed = s.take(10)
        // Runs of one partition interleaved with another's: a0 finishes 0-3 and 5 (4 is still open), a1 0-2.
        let finished = [handed[0], handed[1], handed[6], handed[2], handed[7], handed[8], handed[3], handed[5]]
        #expect(s.complete(offsetsOf: finished) == [a0: 4, a1: 3])
        #expect(s.complete(offsetsOf: [handed[4]]) == [a0: 6])
        #expect(s.complete(offsetsOf: [handed[9]]) == [a1: 4])
        #expect(s.complete(offsetsOf: []) == [:])
    }

    @Test func aQueueNearItsLimitArmsTheWakeLikeBackpressure() {
        var s = ConsumerState()
        _ = s.assign([a0])
        s.accept(messages(a0, 0...9))
        s.prefetchQueueNearLimit()
        #expect(s.stalledFetchPositions { _ in 40 } == [a0: 10])
        s.stopRequested = true
        s.prefetchQueueNearLimit()
        #expect(!s.fetchMayStall, "a consumer that is stopping never seeks")
    }

    @Test func prefetchLimitsFollowTheProperties() {
        #expect(PrefetchLimit(properties: []) == PrefetchLimit(bytes: 65_536 * 1024, messages: 100_000))
        let bounded = PrefetchLimit(properties: [
            ("queued.max.messages.kbytes", "65536"), ("queued.max.messages.kbytes", "20480"), ("queued.min.messages", "5000"),
            ("queued.min.messages", "not a number"),
        ])
        #expect(bounded == PrefetchLimit(bytes: 20_480 * 1024, messages: 5_000), "the last valid setting wins")
        let limit = PrefetchLimit(bytes: 20 * 1024 * 1024, messages: 100_000)
        // 1,000 messages of 1 KiB drained and 15,000 left behind: ~16 MB, over three quarters of 20 MB.
        #expect(limit.nearlyReached(drainedMessages: 1_000, drainedBytes: 1_024_000, queuedAfter: 15_000))
        // The same round with 10,000 behind: ~11 MB, a fetch in flight on a healthy queue.
        #expect(!limit.nearlyReached(drainedMessages: 1_000, drainedBytes: 1_024_000, queuedAfter: 10_000))
        // Tiny messages reach the count limit first.
        #expect(limit.nearlyReached(drainedMessages: 1_000, drainedBytes: 10_000, queuedAfter: 74_000))
        #expect(!limit.nearlyReached(drainedMessages: 0, drainedBytes: 0, queuedAfter: 3))
    }

    @Test func aStalledFetchIsWokenOnlyAfterBackpressureAndOnlyWhereMoreWaits() {
        let a2 = TopicPartition(topic: "a", partition: 2)
        let a3 = TopicPartition(topic: "a", partition: 3)
        var s = ConsumerState()
        _ = s.assign([a0, a1, a2, a3])
        s.accept(messages(a0, 0...9) + messages(a1, 0...4) + messages(a2, 0...4))
        let highs = [a0: Int64(50), a1: 5, a2: 30, a3: 8]
        // Not armed: no backpressure since the last wake.
        #expect(s.stalledFetchPositions { highs[$0] }.isEmpty)
        #expect(s.fetchWakes == 0)
        // Armed: a0 and a2 have more behind the last message polled; a1 is caught up; a3 has delivered nothing yet
        // (its position is librdkafka's own); a blocked partition is never sought.
        s.blocked = [a2]
        s.fetchMayStall = true
        #expect(s.stalledFetchPositions { highs[$0] } == [a0: 10])
        #expect(!s.fetchMayStall && s.fetchWakes == 1)
        // Disarmed until the next backpressure.
        #expect(s.stalledFetchPositions { highs[$0] }.isEmpty)
        // Nothing behind anywhere: disarmed, no wake counted.
        s.fetchMayStall = true
        #expect(s.stalledFetchPositions { _ in 0 }.isEmpty)
        #expect(!s.fetchMayStall && s.fetchWakes == 1)
        // Revoked partitions are not sought; after a stop nothing is.
        s.blocked = []
        _ = s.revoke([a0], lost: false)
        s.fetchMayStall = true
        #expect(s.stalledFetchPositions { highs[$0] } == [a2: 5])
        s.fetchMayStall = true
        s.stopRequested = true
        #expect(s.stalledFetchPositions { highs[$0] }.isEmpty)
    }

    @Test func messagesOfPartitionsRevokedMeanwhileAreNotBuffered() {
        var s = ConsumerState()
        _ = s.assign([a1])
        s.accept(messages(a0, 0...2) + messages(a1, 5...6))
        #expect(s.buffered == 2)
        #expect(s.take(5).map(\.offset) == [5, 6])
    }

    @Test func offsetsAdvanceOnlyOverTheContiguousFinishedPrefix() {
        var s = ConsumerState()
        _ = s.assign([a0])
        s.accept(messages(a0, 10...13))
        _ = s.take(4)
        #expect(s.complete([(a0, 11)]).isEmpty, "10 is still in flight")
        #expect(s.complete([(a0, 10)]) == [a0: 12])
        #expect(s.complete([(a0, 13), (a0, 12)]) == [a0: 14])
    }

    @Test func rebalanceErrorGivesUpTheWholeAssignmentAsLost() {
        var s = ConsumerState()
        _ = s.assign([a0, a1])
        s.accept(messages(a1, 0...1))
        let (action, change) = s.rebalance(RebalanceEvent(kind: .failed("_SOMETHING"), partitions: []))
        #expect(action == .unassignAll)
        #expect(change == .revoked([a0, a1], lost: true))
        #expect(s.assignment.isEmpty && s.trackers.isEmpty && s.buffered == 0)
    }

    @Test func storeRefusedWithStateKeepsThePartitionAndItsTracking() {
        // Our assignment follows the rebalance callback only (dropping it here wedged the chaos soak's sink).
        var s = ConsumerState()
        _ = s.assign([a0, a1])
        s.accept(messages(a0, 0...1))
        _ = s.take(2)
        #expect(s.storeFailed(a0, KafkaError(code: KafkaErrorCode.state)) == false, "a notice, not a warning")
        #expect(s.assignment == [a0, a1])
        #expect(s.complete([(a0, 0)]) == [a0: 1], "a later completion still stores past it")
        #expect(s.storeFailed(a1, KafkaError(code: KafkaErrorCode.requestTimedOut)) == true, "other failures are warnings")
    }

    @Test func offsetResetUnderFailBlocksAndPausesAnAssignedPartitionOnly() {
        var s = ConsumerState()
        _ = s.assign([a0])
        #expect(s.offsetReset(a1, policy: .fail) == false, "not ours: nothing to pause")
        #expect(s.offsetReset(a0, policy: .earliest) == false, "earliest accepts the reset")
        #expect(s.blocked.isEmpty)
        #expect(s.offsetReset(a0, policy: .fail) == true)
        #expect(s.blocked == [a0])
        s.accept(messages(a0, 100...101))
        #expect(s.buffered == 0, "nothing past the gap is handed out")
        _ = s.revoke([a0], lost: false)
        #expect(s.blocked.isEmpty, "a revoked partition is no longer blocked here")
    }
}

@Suite struct ProducerStateRules {
    @Test func slotsBoundTheMessagesInFlight() {
        var s = ProducerState(maxInFlight: 2)
        #expect(s.acquire() == .acquired)
        #expect(s.acquire() == .acquired)
        #expect(s.acquire() == .wait)
        #expect(!s.mayProceed)
        #expect(s.release() == nil)
        #expect(s.mayProceed)
        #expect(s.acquire() == .acquired)
    }

    @Test func fatalErrorAndCloseRefuseEveryLaterMessage() {
        var s = ProducerState(maxInFlight: 1)
        let fatal = KafkaError(code: KafkaError.fatalCode, message: "fenced", isFatal: true)
        #expect(s.fail(fatal).isEmpty)
        #expect(s.acquire() == .fail(fatal))
        var t = ProducerState(maxInFlight: 1)
        #expect(t.close().first)
        #expect(t.close().first == false, "close is idempotent")
        guard case .fail(let e) = t.acquire() else { Issue.record("a closed producer accepted a message"); return }
        #expect(e.code == KafkaErrorCode.destroyed)
    }
}
