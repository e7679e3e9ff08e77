/// librdkafka's prefetch limits for a consumer's one queue (all its partitions together). librdkafka 2.0.2 stops
/// fetching a partition once that queue holds `queued.min.messages` messages or `queued.max.messages.kbytes` of
/// payload, and looks again only a second later (2.4 made that pause configurable as `fetch.queue.backoff.ms`).
///
/// The consumer's own backpressure is one way to get there (the poll thread stops polling, see
/// `ConsumerState.stalledFetchPositions`). The other is a fetch faster than the poll thread: a local cluster, or
/// brokers whose fetch responses together exceed the queue (three brokers answering `fetch.max.bytes` of 8 MB each
/// against a 20 MB queue). `fleet bench kafka` with the bounded queue the services use paused ~0.94 s twice in every
/// 100,000 messages that way, with no backpressure at all. A poll round that finds the queue near a limit arms the
/// same wake the backpressure arms.
struct PrefetchLimit: Equatable, Sendable {
    /// `queued.max.messages.kbytes` in bytes (librdkafka's default: 65,536 KB).
    var bytes: Int
    /// `queued.min.messages` (librdkafka's default: 100,000).
    var messages: Int

    init(bytes: Int, messages: Int) {
        self.bytes = bytes
        self.messages = messages
    }

    /// The limits a consumer with these librdkafka properties runs with (the last setting of a key wins, as in
    /// librdkafka).
    init(properties: [(String, String)]) {
        var kbytes = 65_536, messages = 100_000
        for (key, value) in properties {
            if key == "queued.max.messages.kbytes", let v = Int(value), v > 0 { kbytes = v }
            if key == "queued.min.messages", let v = Int(value), v > 0 { messages = v }
        }
        self.init(bytes: kbytes * 1024, messages: messages)
    }

    /// Whether a poll round found the queue at three quarters of a limit or more: it drained `drainedMessages`
    /// (`drainedBytes` of payload) and left `queuedAfter` entries behind, counted at the round's average size. The
    /// margin covers what the round's own draining hid: the fetcher checks the limit while the queue fills, before
    /// the poll thread gets to it.
    func nearlyReached(drainedMessages: Int, drainedBytes: Int, queuedAfter: Int) -> Bool {
        let count = drainedMessages + max(0, queuedAfter)
        if count * 4 >= messages * 3 { return true }
        guard drainedMessages > 0 else { return false }
        let estimatedBytes = drainedBytes + max(0, queuedAfter) * (drainedBytes / drainedMessages)
        return estimatedBytes * 4 >= bytes * 3
    }
}
