import EntitlementDomain
import FleetTestSupport
import Foundation
import Synchronization
import Testing

@testable import FleetSink

/// A result topic whose records arrive one per `interval` from its creation: `nextBatch` waits for the first that
/// has arrived, `moreRecords` takes those that have arrived since, like a consumer whose buffer fills while the sink
/// writes.
final class TrickleSource: EventBatchSource {
    private let state: Mutex<[SinkRecord]>
    private let start = ContinuousClock.now
    private let interval: Duration
    private let total: Int
    init(_ records: [SinkRecord], interval: Duration = .milliseconds(1)) {
        state = Mutex(records)
        total = records.count
        self.interval = interval
    }
    var isReady: Bool { true }
    var remaining: Int { state.withLock { $0.count } }
    func nextBatch(maxRecords: Int) async throws -> [SinkRecord] {
        while true {
            let b = take(maxRecords)
            if !b.isEmpty || remaining == 0 { return b }
            try await Task.sleep(for: .milliseconds(1))
        }
    }
    func moreRecords(maxRecords: Int) async throws -> [SinkRecord]? { take(maxRecords) }
    func markProcessed(_ records: [SinkRecord]) async throws {}
    private func take(_ limit: Int) -> [SinkRecord] {
        let arrived = Int((ContinuousClock.now - start) / interval) + 1
        return state.withLock { queue in
            let n = min(limit, queue.count, max(0, arrived - (total - queue.count)))
            let b = Array(queue.prefix(n))
            queue.removeFirst(n)
            return b
        }
    }
}

/// Hands out its records at once, then counts the calls for more.
final class MemoryThenTrickle: EventBatchSource {
    private let state: Mutex<(first: [SinkRecord]?, more: Int)>
    init(first: [SinkRecord]) { state = Mutex((first, 0)) }
    var isReady: Bool { true }
    var moreCalls: Int { state.withLock { $0.more } }
    func nextBatch(maxRecords: Int) async throws -> [SinkRecord] { state.withLock { s in defer { s.first = nil }; return s.first ?? [] } }
    func moreRecords(maxRecords: Int) async throws -> [SinkRecord]? { state.withLock { $0.more += 1 }; return [] }
    func markProcessed(_ records: [SinkRecord]) async throws {}
}

@Suite("The next batch gathers what arrives while the current one is written")
struct GatherTests {
    func input(_ n: Int, badAt: Set<Int> = []) -> [SinkRecord] {
        (0..<n).map { i in
            let e = makeEvent("g\(i)", kind: "SUBSCRIPTION_RENEWED", effect: .grant, signed: baseTime + Int64(i), validUntil: baseTime + day)
            return SinkRecord(topic: "entitlements.verified", partition: 0, offset: Int64(i), key: nil,
                              value: badAt.contains(i) ? Array("{not json".utf8) : encode(e))
        }
    }

    @Test("records arriving during the write join the next batch, in order, up to a quarter of the batch size")
    func gathersUpToLimit() async throws {
        let source = TrickleSource(input(30, badAt: [7]), interval: .microseconds(100))
        let writing = SinkService.WriteInProgress()  // never finishes: only the limit ends the gathering
        let (records, decoded) = try await SinkService.gather(from: source, limit: 80, applier: EventApplier(), while: writing)
        #expect(records.map(\.offset) == Array(0..<20))
        #expect(decoded.accepted.map(\.0.offset) == (0..<20).filter { $0 != 7 })
        #expect(decoded.refused.map(\.0.offset) == [7])
        #expect(decoded.prepared.count == 19)
        #expect(source.remaining == 10)
    }

    @Test("a first take of a quarter of the batch size or more is not added to")
    func largeFirstTake() async throws {
        let source = MemoryThenTrickle(first: input(30))
        let writing = SinkService.WriteInProgress()
        let (records, _) = try await SinkService.gather(from: source, limit: 100, applier: EventApplier(), while: writing)
        #expect(records.count == 30)
        #expect(source.moreCalls == 0)
    }

    @Test("once the write is done the batch is handed over with what it has; the rest waits for the next one")
    func stopsWhenWriteDone() async throws {
        let source = TrickleSource(input(10_000))
        let writing = SinkService.WriteInProgress()
        let gathering = Task { try await SinkService.gather(from: source, limit: 80_000, applier: EventApplier(), while: writing) }
        try await Task.sleep(for: .milliseconds(50))
        writing.finish()
        let (records, decoded) = try await gathering.value
        #expect(records.count >= 2 && records.count < 10_000)
        #expect(records.map(\.offset) == (0..<Int64(records.count)).map { $0 })
        #expect(decoded.accepted.count == records.count)
        #expect(source.remaining == 10_000 - records.count)
    }

    @Test("a source without moreRecords (the default) gives the first batch alone")
    func defaultSource() async throws {
        let source = MemorySource(input(5))
        let writing = SinkService.WriteInProgress()
        let (records, _) = try await SinkService.gather(from: source, limit: 100, applier: EventApplier(), while: writing)
        #expect(records.map(\.offset) == [0, 1, 2, 3, 4])
    }
}
