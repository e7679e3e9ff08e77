import AppStoreVerification
import EntitlementDomain

/// The result of processing one raw input: events for the result topic, one rejection for the rejected topic, or
/// neither for now (`--revocation-check hard` and the chain's revocation status unavailable: try again later).
public enum ProcessOutcome: Sendable {
    case events([EntitlementEvent], inputKind: VerifiedItem.Kind)
    case rejected(reason: RejectionReason, detail: String)
    case retryable(reason: RejectionReason, detail: String)
}

/// Where a raw input came from.
public struct InputCoordinates: Sendable, Hashable {
    public var topic: String
    public var partition: Int32
    public var offset: Int64

    public init(topic: String, partition: Int32, offset: Int64) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
    }
}

/// Verifies one raw input with the core and maps it to entitlement events. Pure: no I/O, safe from any thread.
public struct InputProcessor: Sendable {
    public let verifier: SignedDataVerifier
    public let mapper: EntitlementMapper
    private let now: @Sendable () -> Int64

    public init(verifier: SignedDataVerifier, mapper: EntitlementMapper, now: @escaping @Sendable () -> Int64 = EpochMillis.now) {
        self.verifier = verifier
        self.mapper = mapper
        self.now = now
    }

    public func process(value: [UInt8], deviceVerificationId: String?, at source: InputCoordinates) -> ProcessOutcome {
        let item: VerifiedItem
        do {
            item = try value.withUnsafeBufferPointer { buffer throws(VerificationError) in try verifier.verify(buffer: buffer) }
        } catch {
            let detail = error.field.map { "\($0): \(error.detail)" } ?? error.detail
            if error.isRetryable { return .retryable(reason: error.reason, detail: detail) }
            return .rejected(reason: error.reason, detail: detail)
        }
        if let device = deviceVerificationId, !device.isEmpty {
            guard let transaction = item.transactionPayload else {
                return .rejected(reason: .deviceVerificationMismatch, detail: "a device-verification-id header was given but the input carries no transaction")
            }
            do { try EntitlementMapper.checkDeviceVerification(transaction: transaction, deviceVerificationId: device) } catch {
                return .rejected(reason: error.reason, detail: error.detail)
            }
        }
        let eventSource = EventSource(topic: source.topic, partition: source.partition, offset: source.offset, kind: item.itemKind)
        do {
            return .events(try mapper.events(for: item, source: eventSource, verifiedAt: now()), inputKind: item.itemKind)
        } catch {
            return .rejected(reason: error.reason, detail: error.detail)
        }
    }
}
