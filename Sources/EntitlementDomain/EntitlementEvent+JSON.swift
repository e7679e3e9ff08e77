import AppStoreVerification

/// Fast JSON for the hot paths (worker encode, sink decode). Same wire format as the Codable conformance:
/// field names as in `EntitlementEvent`, absent optionals omitted.
extension EntitlementEvent {
    public struct DecodingError: Error, Sendable, CustomStringConvertible {
        public var reason: String
        public var description: String { reason }
    }

    /// Compact UTF-8 JSON of this event.
    public func jsonBytes() -> [UInt8] {
        var w = Writer()
        w.out.reserveCapacity(1024)
        w.out.append(UInt8(ascii: "{"))
        w.string("schema", schema)
        w.string("eventId", eventId)
        w.string("kind", kind)
        w.string("effect", effect.rawValue)
        w.string("reason", reason)
        w.string("environment", environment)
        w.string("bundleId", bundleId)
        w.int("appAppleId", appAppleId)
        w.string("subject", subject)
        w.string("productId", productId)
        w.string("productType", productType)
        w.string("transactionId", transactionId)
        w.string("originalTransactionId", originalTransactionId)
        w.string("webOrderLineItemId", webOrderLineItemId)
        w.string("appAccountToken", appAccountToken)
        w.string("ownershipType", ownershipType)
        w.int("quantity", quantity.map(Int64.init))
        w.int("validFrom", validFrom)
        w.int("validUntil", validUntil)
        w.int("revocationDate", revocationDate)
        w.int("revocationReason", revocationReason.map(Int64.init))
        w.string("revocationType", revocationType)
        w.int("revocationPercentage", revocationPercentage.map(Int64.init))
        if let n = notification {
            w.key("notification")
            w.out.append(UInt8(ascii: "{"))
            w.first = true
            w.string("uuid", n.uuid)
            w.string("type", n.type)
            w.string("subtype", n.subtype)
            w.int("signedDate", n.signedDate)
            w.string("version", n.version)
            w.out.append(UInt8(ascii: "}"))
            w.first = false
        }
        w.int("signedDate", signedDate)
        w.int("verifiedAt", verifiedAt)
        w.key("source")
        w.out.append(UInt8(ascii: "{"))
        w.first = true
        w.string("topic", source.topic)
        w.int("partition", Int64(source.partition))
        w.int("offset", source.offset)
        w.string("inputKind", source.inputKind)
        w.out.append(UInt8(ascii: "}"))
        w.first = false
        w.int("units", units.map(Int64.init))
        w.string("entitlement", entitlement)
        w.json("transaction", transaction)
        w.json("renewalInfo", renewalInfo)
        w.json("appTransaction", appTransaction)
        w.json("details", details)
        w.out.append(UInt8(ascii: "}"))
        return w.out
    }

    /// Decodes an event from the result topic. Refuses other schema versions with a precise reason.
    public init(jsonBytes bytes: [UInt8]) throws(DecodingError) {
        self = try Self.decode(jsonBytes: bytes, keepingDocumentTexts: false).event
    }

    /// Decodes an event and, with `keepingDocumentTexts`, the JSON text of the documents it embeds exactly as
    /// `bytes` carries them (see `EventDocumentTexts`).
    ///
    /// With `parsingDocuments` false (and `keepingDocumentTexts`), the documents are checked as strictly as when
    /// parsed, and the same records are refused with the same reasons, but they are not built: the event holds their
    /// texts (`EmbeddedDocument`) and parses one only if it is read. The event is equal to the one parsing gives. For
    /// a reader that stores the documents as text and reads few of them (the sink).
    public static func decode(
        jsonBytes bytes: [UInt8], keepingDocumentTexts: Bool, parsingDocuments: Bool = true
    ) throws(DecodingError) -> (event: EntitlementEvent, documents: EventDocumentTexts) {
        let textsOnly = keepingDocumentTexts && !parsingDocuments
        let parsed: JSONObjectMembers?
        do {
            parsed = try JSONValue.parseObjectMembers(
                bytes: bytes, maxDepth: 64, names: textsOnly ? Member.namesSkippingDocuments : Member.names)
        } catch {
            throw DecodingError(reason: "not JSON: \(error)")
        }
        guard let o = parsed else { throw DecodingError(reason: "an event must be a JSON object") }
        guard let schema = o[.schema]?.stringValue else { throw DecodingError(reason: "missing 'schema'") }
        guard schema == Self.schemaVersion else {
            throw DecodingError(reason: "unsupported schema '\(schema)' (this sink reads \(Self.schemaVersion))")
        }
        func str(_ k: Member) throws(DecodingError) -> String {
            guard let v = o[k]?.stringValue else { throw DecodingError(reason: "missing or non-string '\(k.name)'") }
            return v
        }
        func int(_ k: Member) throws(DecodingError) -> Int64 {
            guard let v = o[k]?.int64Value else { throw DecodingError(reason: "missing or non-integer '\(k.name)'") }
            return v
        }
        func optStr(_ k: Member) -> String? { o[k]?.stringValue }
        func optInt(_ k: Member) -> Int64? { o[k]?.int64Value }
        func optObj(_ k: Member) -> JSONValue? {
            if case .object? = o[k] { return o[k] }
            return nil
        }
        guard let effect = EntitlementEffect(rawValue: try str(.effect)) else {
            throw DecodingError(reason: "unknown effect '\(o[.effect]?.stringValue ?? "")'")
        }
        guard case .object(let s)? = o[.source], let topic = s["topic"]?.stringValue,
              let partition = s["partition"]?.int64Value, let offset = s["offset"]?.int64Value,
              let inputKind = s["inputKind"]?.stringValue
        else { throw DecodingError(reason: "missing or incomplete 'source'") }
        var notification: EventNotification?
        if case .object(let n)? = o[.notification] {
            guard let uuid = n["uuid"]?.stringValue, let type = n["type"]?.stringValue,
                  let signed = n["signedDate"]?.int64Value
            else { throw DecodingError(reason: "incomplete 'notification'") }
            notification = EventNotification(uuid: uuid, type: type, subtype: n["subtype"]?.stringValue,
                                             signedDate: signed, version: n["version"]?.stringValue)
        }
        let event = EntitlementEvent(
            eventId: try str(.eventId), kind: try str(.kind), effect: effect, reason: optStr(.reason),
            environment: try str(.environment), bundleId: optStr(.bundleId), appAppleId: optInt(.appAppleId),
            subject: optStr(.subject), productId: optStr(.productId), productType: optStr(.productType),
            transactionId: optStr(.transactionId), originalTransactionId: optStr(.originalTransactionId),
            webOrderLineItemId: optStr(.webOrderLineItemId), appAccountToken: optStr(.appAccountToken),
            ownershipType: optStr(.ownershipType), quantity: optInt(.quantity).map { Int($0) },
            validFrom: optInt(.validFrom), validUntil: optInt(.validUntil), revocationDate: optInt(.revocationDate),
            revocationReason: optInt(.revocationReason).map { Int($0) }, revocationType: optStr(.revocationType),
            revocationPercentage: optInt(.revocationPercentage).map { Int($0) }, notification: notification,
            signedDate: try int(.signedDate), verifiedAt: try int(.verifiedAt),
            source: EventSource(topic: topic, partition: Int32(truncatingIfNeeded: partition), offset: offset, inputKind: inputKind),
            units: optInt(.units).map { Int($0) }, entitlement: optStr(.entitlement),
            transaction: optObj(.transaction), renewalInfo: optObj(.renewalInfo),
            appTransaction: optObj(.appTransaction), details: optObj(.details))
        // The text of a document the event holds (an object: decoded above, or only checked), cut from the record.
        // Only an object is a document: a member of another type is not one, as in `optObj`.
        func text(_ k: Member, _ document: JSONValue?) -> String? {
            guard keepingDocumentTexts, document != nil || textsOnly, let range = o.ranges[k.rawValue],
                  bytes[range.lowerBound] == UInt8(ascii: "{")
            else { return nil }
            return String(decoding: bytes[range], as: UTF8.self)
        }
        if textsOnly {
            // The documents were checked, not built: the event holds their texts (shared with `EventDocumentTexts`).
            let texts = EventDocumentTexts(
                transaction: text(.transaction, nil), renewalInfo: text(.renewalInfo, nil),
                appTransaction: text(.appTransaction, nil), details: text(.details, nil))
            var event = event
            let fields = event.unique()
            fields.fields.transaction = texts.transaction.map(EmbeddedDocument.init(checkedText:))
            fields.fields.renewalInfo = texts.renewalInfo.map(EmbeddedDocument.init(checkedText:))
            fields.fields.appTransaction = texts.appTransaction.map(EmbeddedDocument.init(checkedText:))
            fields.fields.details = texts.details.map(EmbeddedDocument.init(checkedText:))
            return (event, texts)
        }
        return (event, EventDocumentTexts(
            transaction: text(.transaction, event.transaction), renewalInfo: text(.renewalInfo, event.renewalInfo),
            appTransaction: text(.appTransaction, event.appTransaction), details: text(.details, event.details)))
    }

    /// The members of an event's JSON object the decoder reads (the names `jsonBytes()` writes).
    enum Member: Int, CaseIterable {
        case schema, eventId, kind, effect, reason, environment, bundleId, appAppleId, subject, productId, productType
        case transactionId, originalTransactionId, webOrderLineItemId, appAccountToken, ownershipType, quantity
        case validFrom, validUntil, revocationDate, revocationReason, revocationType, revocationPercentage
        case notification, signedDate, verifiedAt, source, units, entitlement
        case transaction, renewalInfo, appTransaction, details

        /// The member's name: the case's own.
        var name: String { Self.names.names[rawValue] }

        static let names = JSONMemberNames(allCases.map { String(describing: $0) })
        /// The same, the embedded documents (`EventDocumentTexts`) checked but not built.
        static let namesSkippingDocuments = JSONMemberNames(
            names.names, skippingObjectsOf: Set([transaction, renewalInfo, appTransaction, details].map(\.name)))
    }
}

extension JSONObjectMembers {
    subscript(member: EntitlementEvent.Member) -> JSONValue? { self[member.rawValue] }
}

/// The JSON text of the documents an event embeds (`transaction`, `renewalInfo`, `appTransaction`, `details`),
/// exactly as the result-topic record carries them: the sink stores this text as it came rather than writing the
/// parsed documents out again (jsonb keeps the same values whatever the key order or spacing). Nil for a document
/// the event does not hold.
public struct EventDocumentTexts: Sendable, Equatable {
    public var transaction: String?
    public var renewalInfo: String?
    public var appTransaction: String?
    public var details: String?

    public init(transaction: String? = nil, renewalInfo: String? = nil, appTransaction: String? = nil, details: String? = nil) {
        self.transaction = transaction
        self.renewalInfo = renewalInfo
        self.appTransaction = appTransaction
        self.details = details
    }
}

private struct Writer {
    var out: [UInt8] = []
    var first = true

    mutating func key(_ k: String) {
        if !first { out.append(UInt8(ascii: ",")) }
        first = false
        JSONValue.writeString(k, into: &out)
        out.append(UInt8(ascii: ":"))
    }

    mutating func string(_ k: String, _ v: String?) {
        guard let v else { return }
        key(k)
        JSONValue.writeString(v, into: &out)
    }

    mutating func int(_ k: String, _ v: Int64?) {
        guard let v else { return }
        key(k)
        out.append(contentsOf: String(v).utf8)
    }

    mutating func json(_ k: String, _ v: JSONValue?) {
        guard let v else { return }
        key(k)
        // Members in jsonb's order: the sink stores this very text (`EventDocumentTexts`), and PostgreSQL then finds
        // every object already sorted.
        v.write(into: &out, keyOrder: .jsonb)
    }
}
