import AppStoreVerification

/// One libFuzzer target: a parser of the fleet's trust boundary and the invariants it must keep on any input.
///
/// The same code runs in three places: the libFuzzer binary (`make fuzz`, `Fuzz/`), the seed and regression replay
/// in the normal test suite (`Tests/FleetFuzzingTests`), and by hand (`FuzzTarget.jws.run(bytes)`). A violated
/// invariant is thrown, never logged: the fuzzer turns it into a crash with the input saved.
public enum FuzzTarget: String, CaseIterable, Sendable {
    /// `SignedDataVerifier.verify`: compact JWS, Apple's POST body, receipts (base64 or body), fixed policy.
    case jws
    /// The strict base64 / base64url codecs against a bit-by-bit reference.
    case base64
    /// Raw DER receipts (PKCS#7 SignedData + receipt attribute SET) through the receipt verifier.
    case receipt
    /// The sink's entitlement-event decoder (`EntitlementEvent.decodeForSink`) and the encoder it inverts.
    case event
    /// The product catalogue loader (`ProductCatalogue.parse`).
    case catalogue
    /// The YAML configuration loader (`FleetSettings`) and every typed read the services make.
    case config
    /// The front door's body classification (`IngestRequests.notification` / `.transaction`).
    case ingest

    /// Runs one input; throws when an invariant does not hold. Rejections of bad input are not errors.
    public func run(_ data: UnsafeBufferPointer<UInt8>) throws(InvariantViolation) {
        switch self {
        case .jws: try VerifyTarget.shared.runJWS(data)
        case .receipt: try VerifyTarget.shared.runReceiptDER(data)
        case .base64: try Base64Target.run(data)
        case .event: try EventTarget.run(data)
        case .catalogue: try LoaderTargets.catalogue(data)
        case .config: try LoaderTargets.config(data)
        case .ingest: try IngestTarget.run(data)
        }
    }

    public func run(_ bytes: [UInt8]) throws(InvariantViolation) {
        try withContiguousBytes(bytes) { (b) throws(InvariantViolation) in try run(b) }
    }

    /// libFuzzer's bound on generated inputs for this target (`-max_len`): above the parsers' own size bounds where
    /// they are small enough to reach, so both sides of each bound are explored.
    public var maxLength: Int {
        switch self {
        case .jws: return VerifyTarget.maxInputBytes + 8 * 1024
        case .receipt: return VerifyTarget.maxReceiptBytes + 2 * 1024
        case .base64, .ingest, .event: return 16 * 1024
        case .catalogue, .config: return 8 * 1024
        }
    }
}

/// An invariant of a fuzz target that an input broke.
public struct InvariantViolation: Error, Sendable, CustomStringConvertible {
    public var target: String
    public var message: String
    public init(_ target: FuzzTarget, _ message: String) {
        self.target = target.rawValue
        self.message = message
    }
    public var description: String { "fuzz target \(target): invariant violated: \(message)" }
}

@inline(__always)
func withContiguousBytes<R, E: Error>(
    _ bytes: [UInt8], _ body: (UnsafeBufferPointer<UInt8>) throws(E) -> R
) throws(E) -> R {
    let result: Result<R, E> = bytes.withUnsafeBufferPointer { b in
        do throws(E) { return .success(try body(b)) } catch { return .failure(error) }
    }
    return try result.get()
}
