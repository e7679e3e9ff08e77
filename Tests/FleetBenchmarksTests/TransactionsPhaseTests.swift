@testable import FleetBenchmarks
import Testing

/// `bench ingest`'s `/v1/transactions` ratio: each segment against the references measured right before and after it.
@Suite struct TransactionsPhaseRatio {
    func segment(_ perSecond: Double, seconds: Double = 1, p99: Double = 5, failures: Int = 0) -> LoadResult {
        LoadResult(perSecond: perSecond, p50: 1, p99: p99, failures: failures, seconds: seconds)
    }

    @Test func eachSegmentIsHeldAgainstTheReferencesAroundIt() {
        // The machine slows down in the second segment, and the segment with it: the ratio stays what it is.
        let phase = TransactionsPhase(segments: [segment(8_000), segment(4_000)], references: [10_000, 10_000, 5_000])
        #expect(phase.acknowledged == 12_000)
        #expect(phase.expected == 10_000 + 7_500)
        #expect(abs(phase.ratio - 12_000.0 / 17_500) < 1e-12)
        #expect(phase.perSecond == 6_000)
        #expect(phase.reference == 8_750)
        // Averaging only the first and the last reference would have held the slow segment against a faster machine
        // than the one it ran on, as would the mean of all references (8,333 /s); here each segment has its own.
        #expect(phase.ratio != phase.acknowledged / (2 * (10_000 + 5_000) / 2))
    }

    @Test func segmentsOfDifferentLengthsWeighByTheirLength() {
        let phase = TransactionsPhase(segments: [segment(9_000, seconds: 2), segment(3_000, seconds: 0.5)],
                                      references: [10_000, 10_000, 10_000])
        #expect(phase.duration == 2.5)
        #expect(phase.acknowledged == 19_500)
        #expect(phase.expected == 25_000)
        #expect(phase.ratio == 0.78)
        #expect(phase.perSecond == 7_800)
    }

    @Test func failuresAddUpAndTheSlowestSegmentGivesTheP99() {
        let phase = TransactionsPhase(segments: [segment(1, p99: 4, failures: 2), segment(1, p99: 9, failures: 1), segment(1, p99: 6)],
                                      references: [1, 1, 1, 1])
        #expect(phase.failures == 3)
        #expect(phase.p99 == 9)
    }

    @Test func noSegmentGivesNoRateInsteadOfDividingByZero() {
        let phase = TransactionsPhase(segments: [], references: [10_000])
        #expect(phase.perSecond == 0)
        #expect(phase.ratio == 0)
        #expect(phase.p99 == 0)
    }
}
