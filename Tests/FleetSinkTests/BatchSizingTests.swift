import Testing

@testable import FleetSink

/// `BatchSizing`: how many events the sink takes into its next transaction (`SinkConfiguration.batchTarget`).
@Suite struct BatchSizingTests {
    /// Feeds `batches` full batches, each taking `perRecord` per record, as the sink does (a batch is taken with the
    /// limit before the last change); returns the limits seen after each.
    static func run(_ sizing: inout BatchSizing, batches: Int, perRecord: Duration) -> [Int] {
        var taken = sizing.current
        var limits: [Int] = []
        for _ in 0..<batches {
            let next = sizing.current
            sizing.record(records: taken, duration: perRecord * taken)
            limits.append(sizing.current)
            taken = next
        }
        return limits
    }

    @Test func withoutATargetEveryBatchTakesTheMaximum() {
        var sizing = BatchSizing(maximum: 4000, target: nil)
        #expect(sizing.current == 4000)
        sizing.record(records: 4000, duration: .seconds(5))
        #expect(sizing.current == 4000)
        #expect(BatchSizing(maximum: 4000, target: .zero).current == 4000)
    }

    @Test func startsAtTheInitialSizeUnderTheMaximum() {
        #expect(BatchSizing(maximum: 4000, target: .milliseconds(150)).current == SinkConfiguration.initialBatchSize)
        #expect(BatchSizing(maximum: 10, target: .milliseconds(150)).current == 10)
        #expect(BatchSizing(maximum: 0, target: .milliseconds(150)).current == 1)
    }

    /// Fast batches (20 us per record): the size grows by at most a quarter per batch, up to the maximum.
    @Test func growsTowardTheMaximumWhileBatchesAreFast() {
        var sizing = BatchSizing(maximum: 4000, target: .milliseconds(150))
        let limits = Self.run(&sizing, batches: 12, perRecord: .microseconds(20))
        #expect(limits.first == 1875)
        for (a, b) in zip([1500] + limits, limits) { #expect(b <= a + a / 4) }
        #expect(limits.last == 4000)
    }

    /// 50 us per record: ~80 % of 150 ms is ~2,400 records, where the size settles; batches then stay under target.
    @Test func settlesWhereBatchesTakeMostOfTheTarget() {
        var sizing = BatchSizing(maximum: 4000, target: .milliseconds(150))
        let limits = Self.run(&sizing, batches: 20, perRecord: .microseconds(50))
        #expect((2350...2450).contains(limits.last!))
        #expect(limits.suffix(5).allSatisfy { $0 * 50 < 150_000 })
    }

    /// 100 us per record would settle at ~1,200: the size stays at its floor, the initial 1,500.
    @Test func neverShrinksUnderTheInitialSize() {
        var sizing = BatchSizing(maximum: 4000, target: .milliseconds(150))
        let limits = Self.run(&sizing, batches: 20, perRecord: .microseconds(100))
        #expect(limits.allSatisfy { $0 == 1500 })
        sizing.record(records: 1500, duration: .seconds(30))
        #expect(sizing.current == 1500)
    }

    /// One batch over the target: the next limit is what that batch would have fitted into the target.
    @Test func aSlowBatchCutsTheSizeAtOnce() {
        var sizing = BatchSizing(maximum: 4000, target: .milliseconds(150))
        _ = Self.run(&sizing, batches: 12, perRecord: .microseconds(20))
        #expect(sizing.current == 4000)
        sizing.record(records: 4000, duration: .milliseconds(300))
        #expect(sizing.current == 2000)
        // A database outage (retries inside the batch): down to the floor, the initial size.
        sizing.record(records: 2000, duration: .seconds(30))
        #expect(sizing.current == 1500)
    }

    /// Small batches (little traffic) are mostly fixed cost: they neither grow the size nor teach the time per record.
    @Test func batchesUnderTheLimitDoNotGrowIt() {
        var sizing = BatchSizing(maximum: 4000, target: .milliseconds(150))
        for _ in 0..<10 { sizing.record(records: 20, duration: .milliseconds(10)) }
        #expect(sizing.current == 1500)
        // ... and one over the target cuts it no lower than the initial size.
        sizing.record(records: 20, duration: .milliseconds(300))
        #expect(sizing.current == 1500)
    }
}
