import AppStoreVerification
import Dispatch
import EntitlementDomain
import FleetConfig
import FleetIngestRequests
import Foundation

/// `base64`: the fast codecs equal a bit-by-bit reference on every input, accept only canonical text, and invert
/// their encoders.
enum Base64Target {
    static func run(_ data: UnsafeBufferPointer<UInt8>) throws(InvariantViolation) {
        let bytes = Array(data)
        let url = Base64.decodeURL(data)
        if url != Reference.decodeBase64(bytes, url: true) {
            throw InvariantViolation(.base64, "decodeURL disagrees with the reference decoder")
        }
        if let url, Array(Base64.encodeURL(url).utf8) != bytes {
            throw InvariantViolation(.base64, "decodeURL accepted a non-canonical encoding")
        }
        let std = Base64.decodeStandard(data)
        if std != Reference.decodeBase64(bytes, url: false) {
            throw InvariantViolation(.base64, "decodeStandard disagrees with the reference decoder")
        }
        if let std, Array(Base64.encodeStandard(std).utf8) != bytes {
            throw InvariantViolation(.base64, "decodeStandard accepted a non-canonical encoding")
        }
        if Base64.decodeURL(Base64.encodeURL(bytes)) != bytes || Base64.decodeStandard(Base64.encodeStandard(bytes)) != bytes {
            throw InvariantViolation(.base64, "decode(encode(bytes)) != bytes")
        }
    }
}

/// `event`: the sink's decoder refuses with its three codes, what it accepts survives encode/decode unchanged, and
/// the document texts it keeps parse to exactly the documents it decoded; keeping only the texts (the documents
/// checked, not built) refuses the same records with the same details and gives an equal event and the same texts.
enum EventTarget {
    static func run(_ data: UnsafeBufferPointer<UInt8>) throws(InvariantViolation) {
        let bytes = Array(data)
        let plain = EntitlementEvent.decodeForSink(bytes)
        let kept = EntitlementEvent.decodeForSink(bytes, keepingDocumentTexts: true)
        switch (kept, EntitlementEvent.decodeForSink(bytes, keepingDocumentTexts: true, parsingDocuments: false)) {
        case (.failure(let f), .failure(let g)):
            if f != g { throw InvariantViolation(.event, "texts only: refused as \(g.reason) (\(g.detail)), not \(f.reason) (\(f.detail))") }
        case (.success(let (event, documents)), .success(let (textsOnly, texts))):
            // Equal events: the texts-only one parses its documents when compared.
            if textsOnly != event { throw InvariantViolation(.event, "texts only: another event") }
            if texts != documents { throw InvariantViolation(.event, "texts only: other document texts") }
        case (.success, .failure(let g)):
            throw InvariantViolation(.event, "texts only: refused (\(g.detail)) what parsing the documents accepts")
        case (.failure, .success):
            throw InvariantViolation(.event, "texts only: accepted what parsing the documents refuses")
        }
        switch kept {
        case .failure(let f):
            if case .success = plain { throw InvariantViolation(.event, "refused only when keeping the document texts") }
            try refusal(f)
        case .success(let (event, documents)):
            if (try? plain.get()) != event { throw InvariantViolation(.event, "keeping the document texts changed the event") }
            for (text, document) in [
                (documents.transaction, event.transaction), (documents.renewalInfo, event.renewalInfo),
                (documents.appTransaction, event.appTransaction), (documents.details, event.details),
            ] where (text.flatMap { try? JSONValue.parse($0, maxDepth: 64) }) != document {
                throw InvariantViolation(.event, "a kept document text does not parse to the decoded document")
            }
        }
        switch plain {
        case .failure(let f):
            try refusal(f)
        case .success(let event):
            if event.eventId.isEmpty || event.kind.isEmpty || event.environment.isEmpty {
                throw InvariantViolation(.event, "accepted an event with an empty required field")
            }
            try roundTrip(event, target: .event)
        }
    }

    static func refusal(_ f: EventDecodeFailure) throws(InvariantViolation) {
        if !EventDecodeFailure.reasons.contains(f.reason) {
            throw InvariantViolation(.event, "undocumented sink rejection '\(f.reason)'")
        }
        if f.detail.isEmpty { throw InvariantViolation(.event, "rejection \(f.reason) without a detail") }
    }

    /// decode(encode(event)) == event, and encoding is stable.
    static func roundTrip(_ event: EntitlementEvent, target: FuzzTarget) throws(InvariantViolation) {
        let bytes = event.jsonBytes()
        let again: EntitlementEvent
        do { again = try EntitlementEvent(jsonBytes: bytes) } catch {
            throw InvariantViolation(target, "an encoded event does not decode: \(error)")
        }
        if again != event { throw InvariantViolation(target, "decode(encode(event)) != event") }
        if again.jsonBytes() != bytes { throw InvariantViolation(target, "encode(decode(encode(event))) != encode(event)") }
    }
}

/// `ingest`: the front door's body classification answers with a documented reason, and what it accepts is what
/// the endpoint promises to publish.
enum IngestTarget {
    static func run(_ data: UnsafeBufferPointer<UInt8>) throws(InvariantViolation) {
        let body = Array(data)
        let object = (try? JSONValue.parse(bytes: body))?.objectValue
        // The usual body's shortcut (no JSON parse) answers exactly as the full parse.
        func outcome<T>(_ f: ([UInt8]) throws(BadBody) -> T) -> Result<T, BadBody> {
            do { return .success(try f(body)) } catch { return .failure(error) }
        }
        if outcome(IngestRequests.notification) != outcome(IngestRequests.parsedNotification) {
            throw InvariantViolation(.ingest, "the notification shortcut and the full parse disagree")
        }
        if outcome(IngestRequests.transaction) != outcome(IngestRequests.parsedTransaction) {
            throw InvariantViolation(.ingest, "the transaction shortcut and the full parse disagree")
        }
        do {
            let n = try IngestRequests.notification(body)
            guard let sp = object?["signedPayload"]?.stringValue, !sp.isEmpty else {
                throw InvariantViolation(.ingest, "accepted a notification body without a non-empty string signedPayload")
            }
            if let key = n.key, key.isEmpty || key.count > 256 { throw InvariantViolation(.ingest, "notification key of \(key.count) bytes") }
        } catch let e as BadBody {
            try documented(e)
        } catch let e as InvariantViolation { throw e } catch { throw InvariantViolation(.ingest, "unexpected error \(error)") }
        do {
            let t = try IngestRequests.transaction(body)
            guard let object else { throw InvariantViolation(.ingest, "accepted a transaction body that is not an object") }
            switch t.kind {
            case .signedTransaction:
                guard let jws = object["signedTransaction"]?.stringValue, Array(jws.utf8) == t.value, !t.value.isEmpty else {
                    throw InvariantViolation(.ingest, "the published value is not the signedTransaction string")
                }
            case .receipt:
                if t.value != body { throw InvariantViolation(.ingest, "a receipt body is not published unchanged") }
            }
            if let key = t.key, key.isEmpty || key.count > 256 { throw InvariantViolation(.ingest, "transaction key of \(key.count) bytes") }
            if t.deviceVerificationId?.isEmpty == true || t.appAccountToken?.isEmpty == true {
                throw InvariantViolation(.ingest, "an empty optional header value is published")
            }
        } catch let e as BadBody {
            try documented(e)
        } catch let e as InvariantViolation { throw e } catch { throw InvariantViolation(.ingest, "unexpected error \(error)") }
    }

    static func documented(_ e: BadBody) throws(InvariantViolation) {
        if !BadBody.reasons.contains(e.reason) { throw InvariantViolation(.ingest, "undocumented 400 reason '\(e.reason)'") }
        if e.detail.isEmpty { throw InvariantViolation(.ingest, "400 \(e.reason) without a detail") }
    }
}

/// `catalogue` and `config`: the loaders refuse bad files with their own errors, refuse files over their bound
/// unread, and answer the same twice.
enum LoaderTargets {
    static func catalogue(_ data: UnsafeBufferPointer<UInt8>) throws(InvariantViolation) {
        let text = String(decoding: data, as: UTF8.self)
        let first: Result<ProductCatalogue, ProductCatalogue.LoadError>
        do { first = .success(try ProductCatalogue.parse(text)) } catch let e as ProductCatalogue.LoadError {
            first = .failure(e)
        } catch { throw InvariantViolation(.catalogue, "error of an undocumented type: \(error)") }
        if text.utf8.count > ProductCatalogue.maxBytes, case .success = first {
            throw InvariantViolation(.catalogue, "a catalogue over \(ProductCatalogue.maxBytes) bytes was parsed")
        }
        guard case .success(let catalogue) = first else { return }
        for p in catalogue.products.values {
            if p.units < 0 { throw InvariantViolation(.catalogue, "negative units for \(p.productId)") }
            if p.kind == .nonRenewing && p.duration == nil {
                throw InvariantViolation(.catalogue, "non-renewing \(p.productId) without a duration")
            }
        }
        if (try? ProductCatalogue.parse(text)) != catalogue { throw InvariantViolation(.catalogue, "parse is not deterministic") }
    }

    /// A file of its own per input: tests run the target from several tasks of one process at once (one shared path
    /// let one input's file be read for another's).
    static func configPath() -> String {
        NSTemporaryDirectory() + "fleet-fuzz-config-\(ProcessInfo.processInfo.processIdentifier)-\(UUID().uuidString).yaml"
    }

    /// Every setting `fleet worker`, `fleet sink` and `fleet ingest` read, through the same typed accessors.
    static func config(_ data: UnsafeBufferPointer<UInt8>) throws(InvariantViolation) {
        let configPath = configPath()
        defer { try? FileManager.default.removeItem(atPath: configPath) }
        guard FileManager.default.createFile(atPath: configPath, contents: Data(buffer: data)) else {
            throw InvariantViolation(.config, "cannot write \(configPath)")
        }
        let count = data.count
        // A violation is reported out of band, never as a prefix of the text read: the values read are the fuzzer's
        // own text, and libFuzzer learns the strings the target compares with (a "VIOLATION" prefix marker once failed
        // `make test` on the input `bootstrap-servers: VIOLATION092,kafka-1:9092`).
        let violation = blocking { () async -> String? in
            let settings: FleetSettings
            do { settings = try await FleetSettings(section: "worker", configFile: configPath, environment: [:]) } catch {
                if let e = error as? FleetSettings.Error, case .unreadableConfigFile = e { return nil }
                return "init threw \(error)"
            }
            if count > FleetSettings.maxConfigFileBytes { return "a file over the bound was read" }
            var seen: [String] = []
            var violation: String?
            func read(_ body: () throws -> String) {
                do { seen.append(try body()) } catch let e as FleetSettings.Error {
                    seen.append("error: \(e)")
                } catch { violation = violation ?? "\(error)" }
            }
            for key in ["bootstrap-servers", "group", "result-topic", "rejected-topic", "bundle-id", "validation-time", "log-level"] {
                read { settings.string(key, flag: nil) ?? "nil" }
            }
            for key in ["input-topic", "root-certificate", "environment"] { read { settings.strings(key, flag: []).joined(separator: "|") } }
            for key in ["metrics-port", "threads", "max-batch-size", "batch-target-ms", "shutdown-deadline-seconds", "writers"] {
                read { String(try settings.int(key, flag: nil, default: 0)) }
            }
            read { String(describing: try settings.optionalInt64("app-apple-id", flag: nil)) }
            for key in ["require-known-products", "allow-unsigned-environments"] { read { String(try settings.bool(key, flag: false)) } }
            read { String(describing: try settings.kafkaProperties(flag: []).sorted { $0.key < $1.key }) }
            withExtendedLifetime(seen) {}
            return violation
        }
        if let violation { throw InvariantViolation(.config, violation) }
    }

    /// Runs async loader code from the fuzzer's synchronous callback.
    static func blocking<T: Sendable>(_ body: @escaping @Sendable () async -> T) -> T {
        let box = BlockingResult<T>()
        let done = DispatchSemaphore(value: 0)
        Task {
            box.value = await body()
            done.signal()
        }
        done.wait()
        return box.value!
    }
}

/// The result of `LoaderTargets.blocking`, written by its task before the semaphore is signalled.
private final class BlockingResult<T>: @unchecked Sendable {
    var value: T?
}
