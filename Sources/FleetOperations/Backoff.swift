/// The doubling delay the services wait between attempts at something unavailable (a database, a revocation
/// responder, a broker's delivery): `initial` after the first failed attempt, twice that after the second, and so on,
/// never more than `maximum`.
public struct Backoff: Sendable, Equatable {
    public var initial: Duration
    public var maximum: Duration

    public init(initial: Duration, maximum: Duration) {
        self.initial = initial
        self.maximum = maximum
    }

    /// The delay after `attempt` failed attempts (1 for the first). Attempts below 1 count as the first; the doubling
    /// stops at 2^16 so a long outage cannot overflow it.
    public func delay(afterAttempt attempt: Int) -> Duration {
        min(initial * (1 << min(max(attempt, 1) - 1, 16)), maximum)
    }
}

extension Duration {
    /// Whole nanoseconds (for NIO's `TimeAmount`, Dispatch and metrics' timers).
    public var nanoseconds: Int64 {
        let c = components
        return c.seconds * 1_000_000_000 + c.attoseconds / 1_000_000_000
    }
}
