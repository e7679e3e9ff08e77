/// The fixed policy of the `jws` and `receipt` targets. `rootsBase64` (FuzzRoots+Generated.swift) is written together
/// with the seed corpora in Fuzz/corpus by `make fuzz-seeds`, so that the valid seeds chain to a trusted root.
public enum FuzzRoots {
    public static let bundleId = "com.example.fleet"
    public static let appAppleId: Int64 = 1_234_567_890
    /// The verifier's clock (payloads without a signing date): fixed, so a verdict never depends on the day it runs.
    public static let now: Int64 = 1_750_000_000_000
    /// The seeds' signing date, 2025-06-01T00:00:00Z.
    public static let signedDate: Int64 = 1_748_736_000_000
}
