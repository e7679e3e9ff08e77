import AppStoreVerification
import EntitlementDomain
import FleetKafka
import FleetOperations
import FleetWorker
import Foundation
import Hummingbird
import Logging
import Metrics
import NIOCore
import NIOPosix
import Synchronization

/// The two endpoints. Every answer that says "accepted" (200, and 422 for a rejected transaction) is sent only
/// after the raw topic's delivery report; when the broker cannot take the input in time the answer is 503.
struct IngestHandler: Sendable {
    static let raw = "raw"

    let configuration: IngestConfiguration
    let processor: InputProcessor
    /// Where verification runs (a pool sized to the cores), so it never holds an event loop or a cooperative thread.
    let verifiers: NIOThreadPool
    let producer: KafkaProducer
    let gate: InFlightGate
    let metrics = IngestMetrics()
    let logger: Logger
    let onFatal: @Sendable (KafkaError) -> Void

    enum Endpoint: String { case notifications, transactions }

    func register(on router: Router<IngestRequestContext>) {
        // Liveness on the public port too (load balancers; the bench's same-server reference rate).
        router.get("/healthz") { _, _ -> Response in
            Response(status: .ok, body: .init(byteBuffer: ByteBuffer(string: "ok\n")))
        }
        router.post(RouterPath(configuration.notificationsPath)) { request, context in
            await self.handle(.notifications, request, context)
        }
        router.post(RouterPath(configuration.transactionsPath)) { request, context in
            await self.handle(.transactions, request, context)
        }
        for path in [configuration.notificationsPath, configuration.transactionsPath] {
            for method in [HTTPRequest.Method.get, .put, .delete, .patch, .head] {
                router.on(RouterPath(path), method: method) { request, context in
                    let endpoint: Endpoint = path == configuration.notificationsPath ? .notifications : .transactions
                    var r = IngestHTTP.error(.methodNotAllowed, reason: "method_not_allowed",
                                             detail: "\(request.method) is not allowed here; use POST",
                                             close: IngestHTTP.closeUnread(request), channel: context.channel)
                    r.headers[.allow] = "POST"
                    count(endpoint, r)
                    return r
                }
            }
        }
    }

    private func count(_ endpoint: Endpoint, _ response: Response) {
        metrics.requests(endpoint, status: response.status.code).increment()
    }

    private func bad(_ endpoint: Endpoint, _ reason: String) {
        metrics.counter("fleet_ingest_bad_requests_total", ("endpoint", endpoint.rawValue), ("reason", reason)).increment()
    }

    func handle(_ endpoint: Endpoint, _ request: Request, _ context: IngestRequestContext) async -> Response {
        let began = ContinuousClock.now
        let response = await respond(endpoint, request, context)
        answered(endpoint, status: response.status.code, since: began)
        return response
    }

    /// Counts an answer (`fleet_ingest_requests_total`) and its time since the request arrived.
    func answered(_ endpoint: Endpoint, status: Int, since began: ContinuousClock.Instant) {
        metrics.requests(endpoint, status: status).increment()
        metrics.duration(endpoint).recordNanoseconds((ContinuousClock.now - began).nanoseconds)
    }

    private func respond(_ endpoint: Endpoint, _ request: Request, _ context: IngestRequestContext) async -> Response {
        let channel = context.channel
        guard gate.enter() else {
            bad(endpoint, "too_many_requests")
            return IngestHTTP.error(.serviceUnavailable, reason: "overloaded",
                                    detail: "more than \(gate.limit) requests in flight; retry later",
                                    close: IngestHTTP.closeUnread(request), retryAfter: configuration.retryAfterSeconds, channel: channel)
        }
        defer { gate.leave() }
        if let refusal = refusalBeforeBody(endpoint, request.headers) {
            bad(endpoint, refusal.reason)
            var r = IngestHTTP.error(refusal.status, reason: refusal.reason, detail: refusal.detail,
                                     close: IngestHTTP.closeUnread(request), channel: channel)
            if refusal.status == .unauthorized { r.headers[.wwwAuthenticate] = "Bearer" }
            return r
        }
        let body: [UInt8]
        switch await IngestHTTP.readBody(request, limit: configuration.maxBodyBytes, channel: channel) {
        case .body(let b): body = b
        case .tooLarge:
            bad(endpoint, "too_large")
            // Refused from its declared length: the rest is discarded unread (or the connection closed, when huge
            // or of unknown length); refused mid-stream: the connection is closed.
            return IngestHTTP.error(.contentTooLarge, reason: "too_large",
                                    detail: "the body is larger than \(configuration.maxBodyBytes) bytes",
                                    close: request.headers[.contentLength] == nil || IngestHTTP.closeUnread(request), channel: channel)
        case .timedOut:
            return bodyUnread(endpoint, timedOut: true).response(close: true, channel: channel)
        case .failed:
            return bodyUnread(endpoint, timedOut: false).response(close: true, channel: channel)
        }
        switch endpoint {
        case .notifications: return await notification(body)
        case .transactions: return await transaction(body).response()
        }
    }

    /// What a request is refused for by its fields alone, before its body is read: 401 (no valid bearer token, when
    /// one is configured for `/v1/transactions`), 415 (not a JSON content type, or a content coding). The routes
    /// answer it (`respond`); `TransactionFastPath` takes only requests without one.
    func refusalBeforeBody(_ endpoint: Endpoint, _ fields: HTTPFields) -> (status: HTTPResponse.Status, reason: String, detail: String)? {
        if endpoint == .transactions, let token = configuration.apiToken, !IngestHTTP.authorized(fields[.authorization], token: token) {
            return (.unauthorized, "unauthorized", "a valid bearer token is required")
        }
        guard IngestHTTP.isJSON(fields[.contentType]) else {
            return (.unsupportedMediaType, "unsupported_media_type", "Content-Type must be application/json, got \(fields[.contentType] ?? "")")
        }
        if let coding = fields[.contentEncoding], !IngestHTTP.isIdentity(coding) {
            // A compressed body would be published as it came and fail as "not JSON" everywhere after: say why here.
            return (.unsupportedMediaType, "unsupported_content_encoding",
                    "Content-Encoding \(coding) is not accepted; send the JSON body uncompressed")
        }
        return nil
    }

    /// The declared body length when `TransactionFastPath` may answer this request itself: a `POST` to the
    /// transactions path (no query) with no refusal before its body (`refusalBeforeBody`), a declared length within
    /// the bound, and no `Connection`, `Expect` or `Transfer-Encoding` field. Every other request, and every refusal,
    /// is the routes' (`respond`), so each is answered by one code.
    func fastPathLength(_ head: HTTPRequest) -> Int? {
        guard head.method == .post, head.path == configuration.transactionsPath else { return nil }
        let fields = head.headerFields
        guard fields[.connection] == nil, fields[.expect] == nil, fields[.transferEncoding] == nil,
              let declared = fields[.contentLength].flatMap({ Int($0) }), declared > 0, declared <= configuration.maxBodyBytes,
              refusalBeforeBody(.transactions, fields) == nil
        else { return nil }
        return declared
    }

    /// The answer to a request whose body did not arrive in time (408) or could not be read (400); the connection is
    /// closed after it.
    func bodyUnread(_ endpoint: Endpoint, timedOut: Bool) -> IngestAnswer {
        if timedOut {
            bad(endpoint, "request_timeout")
            return .error(.requestTimeout, reason: "request_timeout", detail: "the body was not received in time")
        }
        bad(endpoint, "body_read_failed")
        return .error(.badRequest, reason: "body_read_failed", detail: "the body could not be read")
    }

    private func notification(_ body: [UInt8]) async -> Response {
        let parsed: NotificationRequest
        do { parsed = try IngestRequests.notification(body) } catch {
            bad(.notifications, error.reason)
            return IngestHTTP.error(.badRequest, reason: error.reason, detail: error.detail)
        }
        let message = OutgoingMessage(topic: configuration.topic, key: parsed.key, value: body,
                                      headers: [KafkaHeader(key: FleetHeaders.ingestEndpoint, string: Endpoint.notifications.rawValue)])
        switch await publish(message, .notifications, meanwhile: {}).0 {
        case .success(let report):
            return IngestAnswer(status: .ok, body: Array("{\"offset\":\(report.offset),\"partition\":\(report.partition),\"status\":\"accepted\"}\n".utf8)).response()
        case .failure:
            return IngestAnswer.unavailable(retryAfter: configuration.retryAfterSeconds).response()
        }
    }

    /// A whole `/v1/transactions` body, published and verified at once: the answer for Hummingbird's route and for
    /// `TransactionFastPath` alike.
    func transaction(_ body: [UInt8]) async -> IngestAnswer {
        let parsed: TransactionRequest
        do { parsed = try IngestRequests.transaction(body) } catch {
            bad(.transactions, error.reason)
            return .error(.badRequest, reason: error.reason, detail: error.detail)
        }
        var headers = [KafkaHeader(key: FleetHeaders.ingestEndpoint, string: Endpoint.transactions.rawValue)]
        if let device = parsed.deviceVerificationId {
            headers.append(KafkaHeader(key: FleetHeaders.deviceVerificationId, string: device))
        }
        if let token = parsed.appAccountToken { headers.append(KafkaHeader(key: FleetHeaders.appAccountToken, string: token)) }
        let message = OutgoingMessage(topic: configuration.topic, key: parsed.key, value: parsed.value, headers: headers)
        // Publish and verify at the same time; answer once both are done.
        let processor = self.processor, topic = configuration.topic
        let (report, verdict) = await publish(message, .transactions) {
            try? await verifiers.runIfActive {
                processor.process(value: parsed.value, deviceVerificationId: parsed.deviceVerificationId,
                                  at: InputCoordinates(topic: topic, partition: -1, offset: -1))
            }
        }
        if case .failure = report { return .unavailable(retryAfter: configuration.retryAfterSeconds) }
        guard let outcome = verdict else {
            // The pool has stopped (shutdown): the input is on the topic, the workers will judge it.
            return .error(.serviceUnavailable, reason: "unavailable", detail: "shutting down; retry later",
                          retryAfter: configuration.retryAfterSeconds)
        }
        switch outcome {
        case .events(let events, let kind):
            metrics.verified.increment()
            return IngestAnswer(status: .ok, body: Self.verifiedBody(events, kind: kind))
        case .rejected(let reason, let detail):
            metrics.counter("fleet_ingest_verdicts_total", ("verdict", "rejected"), ("reason", reason.rawValue)).increment()
            return IngestAnswer(status: .unprocessableContent, object: [
                "verdict": .string("rejected"), "reason": .string(reason.rawValue), "detail": .string(detail)])
        case .retryable(let reason, let detail):
            // Published (the workers verify it once the status is known); no verdict now: the client retries.
            metrics.counter("fleet_ingest_verdicts_total", ("verdict", "retryable"), ("reason", reason.rawValue)).increment()
            return IngestAnswer(
                status: .serviceUnavailable,
                object: ["verdict": .string("retryable"), "reason": .string(reason.rawValue), "detail": .string(detail)],
                retryAfter: configuration.retryAfterSeconds)
        }
    }

    /// The 200 answer's bytes, written directly: the object `{"events":[{"effect","entitlement","kind","productId",
    /// "validUntil"}...],"kind","transactionIds","verdict":"verified"}` with sorted keys and a newline, as `JSONValue`'s
    /// writer would give it (`IngestResponseBodyTests`), without building and sorting the value tree on every request.
    static func verifiedBody(_ events: [EntitlementEvent], kind: VerifiedItem.Kind) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(96 + events.count * 160)
        func key(_ k: StaticString) {
            out.append(UInt8(ascii: "\""))
            out.append(contentsOf: UnsafeBufferPointer(start: k.utf8Start, count: k.utf8CodeUnitCount))
            out.append(contentsOf: "\":".utf8)
        }
        func string(_ v: String?) {
            if let v { JSONValue.writeString(v, into: &out) } else { out.append(contentsOf: "null".utf8) }
        }
        out.append(contentsOf: "{".utf8)
        key("events")
        out.append(UInt8(ascii: "["))
        for (i, e) in events.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out.append(UInt8(ascii: "{"))
            key("effect"); string(e.effect.rawValue); out.append(UInt8(ascii: ","))
            key("entitlement"); string(e.entitlement); out.append(UInt8(ascii: ","))
            key("kind"); string(e.kind); out.append(UInt8(ascii: ","))
            key("productId"); string(e.productId); out.append(UInt8(ascii: ","))
            key("validUntil")
            if let v = e.validUntil { out.append(contentsOf: String(v).utf8) } else { out.append(contentsOf: "null".utf8) }
            out.append(UInt8(ascii: "}"))
        }
        out.append(contentsOf: "],".utf8)
        key("kind"); string(kind.rawValue); out.append(UInt8(ascii: ","))
        key("transactionIds")
        out.append(UInt8(ascii: "["))
        var ids: [String] = []
        for e in events {
            guard let t = e.transactionId, !ids.contains(t) else { continue }
            if !ids.isEmpty { out.append(UInt8(ascii: ",")) }
            ids.append(t)
            JSONValue.writeString(t, into: &out)
        }
        out.append(contentsOf: "],".utf8)
        key("verdict"); string("verified")
        out.append(contentsOf: "}\n".utf8)
        return out
    }

    /// Enqueues `message`, runs `meanwhile` (the transaction's verification) while it is delivered, and returns the
    /// delivery report with `meanwhile`'s result.
    private func publish<T>(
        _ message: OutgoingMessage, _ endpoint: Endpoint, meanwhile: () async -> T
    ) async -> (Result<DeliveryReport, KafkaError>, T) {
        let pending: PendingDelivery
        do { pending = try await producer.start(message) } catch { return (failed(error, endpoint), await meanwhile()) }
        let other = await meanwhile()
        do {
            let report = try await pending.report()
            metrics.published(endpoint).increment()
            return (.success(report), other)
        } catch {
            return (failed(error, endpoint), other)
        }
    }

    /// Counts and logs a publish that failed (a fatal producer error stops the service).
    private func failed(_ error: KafkaError, _ endpoint: Endpoint) -> Result<DeliveryReport, KafkaError> {
        metrics.counter("fleet_ingest_publish_failures_total", ("endpoint", endpoint.rawValue), ("error", error.name)).increment()
        logger.warning("publish failed", metadata: ["endpoint": "\(endpoint.rawValue)", "error": "\(error)"])
        if error.isFatal { onFatal(error) }
        return .failure(error)
    }
}

/// The ingest's metric handles, each made once per label set: making a swift-metrics handle is a registry lookup
/// under a lock that allocates its label array, so the request path reuses handles instead.
/// Label values come from finite sets (endpoints, status codes, reason codes, Kafka error names).
final class IngestMetrics: Sendable {
    private struct Key: Hashable {
        var label: String
        var first: String
        var second: String
    }

    private let counters = Mutex<[Key: Counter]>([:])
    /// `fleet_ingest_verdicts_total{verdict="verified",reason="VERIFIED"}`, the one on every good request.
    let verified = Counter(label: "fleet_ingest_verdicts_total", dimensions: [("verdict", "verified"), ("reason", "VERIFIED")])
    private let byStatus = Mutex<[Int: Counter]>([:])
    private let publishedByEndpoint: [IngestHandler.Endpoint: Counter]
    private let durationByEndpoint: [IngestHandler.Endpoint: Metrics.Timer]

    init() {
        var published: [IngestHandler.Endpoint: Counter] = [:]
        var duration: [IngestHandler.Endpoint: Metrics.Timer] = [:]
        for endpoint in [IngestHandler.Endpoint.notifications, .transactions] {
            published[endpoint] = Counter(label: "fleet_ingest_published_total", dimensions: [("endpoint", endpoint.rawValue)])
            duration[endpoint] = Metrics.Timer(label: "fleet_ingest_request_duration_seconds", dimensions: [("endpoint", endpoint.rawValue)])
        }
        publishedByEndpoint = published
        durationByEndpoint = duration
    }

    /// `fleet_ingest_requests_total{endpoint,status}`.
    func requests(_ endpoint: IngestHandler.Endpoint, status: Int) -> Counter {
        let key = status * 2 + (endpoint == .notifications ? 0 : 1)
        if let c = byStatus.withLock({ $0[key] }) { return c }
        let c = Counter(label: "fleet_ingest_requests_total", dimensions: [("endpoint", endpoint.rawValue), ("status", String(status))])
        byStatus.withLock { $0[key] = c }
        return c
    }

    func published(_ endpoint: IngestHandler.Endpoint) -> Counter { publishedByEndpoint[endpoint]! }

    func duration(_ endpoint: IngestHandler.Endpoint) -> Metrics.Timer { durationByEndpoint[endpoint]! }

    /// A counter with two labels.
    func counter(_ label: String, _ first: (String, String), _ second: (String, String)) -> Counter {
        let key = Key(label: label, first: first.1, second: second.1)
        if let c = counters.withLock({ $0[key] }) { return c }
        let c = Counter(label: label, dimensions: [first, second])
        counters.withLock { $0[key] = c }
        return c
    }
}
