import Foundation

/// Time as Apple sends it and as every fleet module passes it around: whole milliseconds since the Unix epoch
/// (`Int64`). The one place where a `Date` (or the clock) becomes milliseconds, and back.
///
/// One rounding rule: to the nearest millisecond. A `Date` holds seconds as a `Double`, so `ms / 1000` is seldom
/// exact (1_760_000_000_123 ms is 1_760_000_000.1229999… s); rounding to the nearest millisecond gives the same
/// milliseconds back (`millis(date(ms)) == ms`), where truncation would lose one. For the clock, the two differ by
/// less than a millisecond.
public enum EpochMillis {
    /// Now, in milliseconds since the epoch.
    public static func now() -> Int64 { millis(Date()) }

    /// `date` in milliseconds since the epoch, rounded to the nearest millisecond.
    public static func millis(_ date: Date) -> Int64 { Int64((date.timeIntervalSince1970 * 1000).rounded()) }

    /// The `Date` of `ms` milliseconds since the epoch.
    public static func date(_ ms: Int64) -> Date { Date(timeIntervalSince1970: Double(ms) / 1000) }
}
