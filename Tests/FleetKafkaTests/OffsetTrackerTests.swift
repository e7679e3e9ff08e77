import FleetTestSupport
import Testing

@testable import FleetKafka

@Suite struct OffsetTrackerTests {
    @Test func storesOnlyTheContiguousFinishedPrefix() {
        var t = OffsetTracker()
        for o in Int64(0)..<10 { t.handOut(o) }
        #expect(t.complete(3) == nil)
        #expect(t.complete(1) == nil)
        #expect(t.complete(0) == 2)  // 0,1 done; 2 still pending
        #expect(t.complete(2) == 4)  // 2,3 done
        #expect(t.complete(2) == nil)  // already finished
        for o in Int64(5)..<10 { #expect(t.complete(o) == nil) }
        #expect(t.complete(4) == 10)
        #expect(t.outstanding == 0)
    }

    @Test func handlesOffsetGapsAndUnknownOffsets() {
        var t = OffsetTracker()
        for o: Int64 in [10, 12, 15] { t.handOut(o) }
        #expect(t.complete(11) == nil)  // never handed out
        #expect(t.complete(99) == nil)
        #expect(t.complete(12) == nil)
        #expect(t.complete(10) == 13)
        #expect(t.complete(15) == 16)
    }

    @Test func rewindRestartsBookkeeping() {
        var t = OffsetTracker()
        for o in Int64(0)..<5 { t.handOut(o) }
        #expect(t.complete(0) == 1)
        // The same offsets are delivered again (e.g. after an offset reset): only the new deliveries count.
        for o in Int64(1)..<5 { t.handOut(o) }
        #expect(t.outstanding == 4)
        #expect(t.complete(2) == nil)
        #expect(t.complete(1) == 3)
    }

    @Test func reverseCompletionOfManyOffsets() {
        var t = OffsetTracker()
        let n: Int64 = 10_000
        for o in 0..<n { t.handOut(o) }
        for o in stride(from: n - 1, to: 0, by: -1) { #expect(t.complete(o) == nil) }
        #expect(t.complete(0) == n)
    }
}
