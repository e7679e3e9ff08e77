#if canImport(Glibc)
import Glibc
#endif
import EntitlementDomain
import FleetTestSupport
import Foundation
import Synchronization
import Testing

@testable import FleetSink

/// A result topic whose next record has always just arrived: `nextBatch` and each `moreRecords` hand out one. When
/// `finishAfter` records have been handed out through `moreRecords`, it marks the current write done (as if the write
/// ended right then), so the tests need no clock.
final class TrickleSource: EventBatchSource {
    private let state: Mutex<(queue: [SinkRecord], more: Int)>
    private let finishAfter: Int?
    private let writing: SinkService.WriteInProgress?
    init(_ records: [SinkRecord], finishAfter: Int? = nil, writing: SinkService.WriteInProgress? = nil) {
        state = Mutex((records, 0))
        self.finishAfter = finishAfter
        self.writing = writing
    }
    var isReady: Bool { true }
    var remaining: Int { state.withLock { $0.queue.count } }
    func nextBatch(maxRecords: Int) async throws -> [SinkRecord] { take(maxRecords, counted: false) }
    func moreRecords(maxRecords: Int) async throws -> [SinkRecord]? { take(maxRecords, counted: true) }
    func markProcessed(_ records: [SinkRecord]) async throws {}
    private func take(_ limit: Int, counted: Bool) -> [SinkRecord] {
        let (batch, more) = state.withLock { s -> ([SinkRecord], Int) in
            let b = Array(s.queue.prefix(min(1, limit)))
            s.queue.removeFirst(b.count)
            if counted { s.more += b.count }
            return (b, s.more)
        }
        if counted, let finishAfter, more >= finishAfter { writing?.finish() }
        return batch
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

    /// `SinkService.gather` with its background thread, stopped afterwards.
    private func gather(
        _ source: any EventBatchSource, limit: Int, _ writing: SinkService.WriteInProgress
    ) async throws -> ([SinkRecord], SinkService.DecodedBatch) {
        let background = BackgroundWork()
        do {
            let gathered = try await SinkService.gather(from: source, limit: limit, applier: EventApplier(), on: background, while: writing)
            await background.shutdown()
            return gathered
        } catch {
            await background.shutdown()
            throw error
        }
    }

    #if os(Linux)
    @Test("the next batch is prepared on a thread of lower priority (nice +5 from the sink's)")
    func backgroundThreadIsNicer() async throws {
        let background = BackgroundWork()
        let which = __priority_which_t(PRIO_PROCESS.rawValue)
        let mine = getpriority(which, 0)
        let theirs = try await background.run { getpriority(which, 0) }
        await background.shutdown()
        #expect(theirs == min(19, mine + BackgroundWork.niceness))
    }
    #endif

    @Test("records arriving during the write join the next batch, in order, up to a quarter of the batch size")
    func gathersUpToLimit() async throws {
        let source = TrickleSource(input(30, badAt: [7]))
        let writing = SinkService.WriteInProgress()  // never finishes: only the limit ends the gathering
        let (records, decoded) = try await gather(source, limit: 80, writing)
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
        let (records, _) = try await gather(source, limit: 100, writing)
        #expect(records.count == 30)
        #expect(source.moreCalls == 0)
    }

    @Test("once the write is done the batch is handed over with what it has; the rest waits for the next one")
    func stopsWhenWriteDone() async throws {
        let writing = SinkService.WriteInProgress()
        let source = TrickleSource(input(100), finishAfter: 5, writing: writing)
        let (records, decoded) = try await gather(source, limit: 2_000, writing)
        #expect(records.map(\.offset) == Array(0..<6))  // the first take and the five taken during the write
        #expect(decoded.accepted.count == 6)
        #expect(source.remaining == 94)
    }

    @Test("a source without moreRecords (the default) gives the first batch alone")
    func defaultSource() async throws {
        let source = MemorySource(input(5))
        let writing = SinkService.WriteInProgress()
        let (records, _) = try await gather(source, limit: 100, writing)
        #expect(records.map(\.offset) == [0, 1, 2, 3, 4])
    }
}
