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

    /// In-order completion takes a shortcut; mixed with out-of-order completions, rewinds and runs it must store
    /// exactly what a plain model of the rule stores: one past the end of the finished prefix of handed-out offsets.
    @Test func matchesAModelUnderRandomCompletionOrders() {
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<200 {
            var t = OffsetTracker()
            var handed: [Int64] = []
            var finished = Set<Int64>()
            var expectedStored: Int64?
            var next: Int64 = Int64.random(in: 0..<5, using: &rng)
            for _ in 0..<60 {
                switch Int.random(in: 0..<10, using: &rng) {
                case 0..<4:  // hand out the next offset, sometimes after a gap
                    next += Int64.random(in: 1...2, using: &rng)
                    t.handOut(next)
                    handed.append(next)
                case 4:  // a rewind: offsets delivered again from an earlier one
                    guard let first = handed.first else { continue }
                    let from = Int64.random(in: first...next, using: &rng)
                    handed = [from]
                    finished = []
                    next = from
                    t.handOut(from)
                default:  // complete one or a run of handed-out offsets, often the oldest ones first
                    guard !handed.isEmpty else { continue }
                    let open = handed.filter { !finished.contains($0) }
                    guard !open.isEmpty else { continue }
                    let run = Bool.random(using: &rng) ? Array(open.prefix(Int.random(in: 1...3, using: &rng)))
                        : [open.randomElement(using: &rng)!]
                    var modelAdvance: Int64?
                    for o in run {
                        finished.insert(o)
                        let prefix = handed.prefix { finished.contains($0) }
                        if let last = prefix.last {
                            modelAdvance = last + 1
                            expectedStored = last + 1
                            handed.removeFirst(prefix.count)
                            prefix.forEach { finished.remove($0) }
                        }
                    }
                    let got = run.count == 1 ? t.complete(run[0]) : t.complete(run)
                    #expect(got == modelAdvance, "run \(run) handed \(handed)")
                }
            }
            #expect(t.stored == expectedStored)
        }
    }
}
