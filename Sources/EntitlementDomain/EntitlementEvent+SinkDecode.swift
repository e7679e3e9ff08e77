import AppStoreVerification

/// Why the sink refuses a result-topic record before any database work: `reason` is one of `reasons` (the
/// `reason` header on `entitlements.sink-rejected`), `detail` says what exactly was wrong.
public struct EventDecodeFailure: Error, Sendable, Equatable {
    public var reason: String
    public var detail: String

    /// `undecodable` (not an event JSON document), `unsupported_schema` (not `entitlement-event/v1`), `invalid_event`
    /// (a required field is empty).
    public static let reasons = ["undecodable", "unsupported_schema", "invalid_event"]
}

extension EntitlementEvent {
    /// The sink's decoder: the event of a result-topic record, or why it is refused (pure; fuzzed by `fleet-fuzz`).
    public static func decodeForSink(_ bytes: [UInt8]) -> Result<EntitlementEvent, EventDecodeFailure> {
        decodeForSink(bytes, keepingDocumentTexts: false).map(\.event)
    }

    /// The same, with the JSON text of the embedded documents as the record carries them (`EventDocumentTexts`);
    /// with `parsingDocuments` false, only that text (see `decode(jsonBytes:keepingDocumentTexts:parsingDocuments:)`).
    public static func decodeForSink(
        _ bytes: [UInt8], keepingDocumentTexts: Bool, parsingDocuments: Bool = true
    ) -> Result<(event: EntitlementEvent, documents: EventDocumentTexts), EventDecodeFailure> {
        let decoded: (event: EntitlementEvent, documents: EventDocumentTexts)
        do {
            decoded = try EntitlementEvent.decode(
                jsonBytes: bytes, keepingDocumentTexts: keepingDocumentTexts, parsingDocuments: parsingDocuments)
        } catch {
            let reason = error.reason.hasPrefix("unsupported schema") ? "unsupported_schema" : "undecodable"
            return .failure(EventDecodeFailure(reason: reason, detail: error.reason))
        }
        let event = decoded.event
        for (name, value) in [("eventId", event.eventId), ("kind", event.kind), ("environment", event.environment)]
        where value.isEmpty {
            return .failure(EventDecodeFailure(reason: "invalid_event", detail: "\(name) is empty"))
        }
        return .success(decoded)
    }
}
