import Testing

@testable import FleetOperations

struct BackoffTests {
    @Test func doublesFromTheInitialDelayUpToTheMaximum() {
        let b = Backoff(initial: .milliseconds(100), maximum: .seconds(5))
        #expect((1...8).map { b.delay(afterAttempt: $0) } == [
            .milliseconds(100), .milliseconds(200), .milliseconds(400), .milliseconds(800), .milliseconds(1600),
            .milliseconds(3200), .seconds(5), .seconds(5),
        ])
    }

    @Test func aLongOutageNeitherOverflowsNorPassesTheMaximum() {
        let b = Backoff(initial: .milliseconds(250), maximum: .seconds(30))
        #expect(b.delay(afterAttempt: 1_000_000) == .seconds(30))
        #expect(b.delay(afterAttempt: Int.max) == .seconds(30))
    }

    @Test func anAttemptBelowOneCountsAsTheFirst() {
        let b = Backoff(initial: .milliseconds(100), maximum: .seconds(5))
        #expect(b.delay(afterAttempt: 0) == .milliseconds(100))
        #expect(b.delay(afterAttempt: -3) == .milliseconds(100))
    }
}
