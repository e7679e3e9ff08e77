import AppStoreVerification
import FleetOperations
import Foundation
import Hummingbird
import NIOCore
import NIOHTTPTypes
import Synchronization

/// The HTTP mechanics of `fleet ingest`: admission (in-flight bound), content type, the size bound, the body
/// deadline, the bearer token and JSON answers. Nothing here knows about Kafka or verification.
enum IngestHTTP {
    /// Result of reading a body under a size bound and a deadline.
    enum BodyRead {
        case body([UInt8])
        case tooLarge
        case timedOut
        case failed
    }

    /// Reads the whole body, refusing (without reading further) at `limit` bytes. The deadline is kept by the
    /// connection's `RequestDeadlineHandler`: when the client has not sent the whole body in time, the read ends with
    /// `RequestDeadlineExceeded` (`.timedOut`: the caller answers 408 and closes the connection).
    /// A client waiting for `100 Continue` gets it from here, once the declared length is known to fit.
    static func readBody(_ request: Request, limit: Int, channel: any Channel) async -> BodyRead {
        if let declared = request.headers[.contentLength].flatMap({ Int($0) }), declared > limit { return .tooLarge }
        continueIfExpected(request, channel: channel)
        var out = [UInt8]()
        do {
            for try await chunk in request.body {
                if out.count + chunk.readableBytes > limit { return .tooLarge }
                if out.isEmpty { out.reserveCapacity(chunk.readableBytes) }
                out.append(contentsOf: chunk.readableBytesView)
            }
        } catch is RequestDeadlineExceeded {
            return .timedOut
        } catch {
            return .failed
        }
        return .body(out)
    }

    /// Above this declared length a refused request's body is not even discarded: the connection is closed.
    static let drainCap = 16 * 1024 * 1024

    /// Whether a request answered before its body was read should close the connection. Small enough declared
    /// bodies are discarded by the server after the answer (never buffered), so that clients that send the whole body
    /// before reading (most HTTP libraries) get the answer instead of a connection reset; larger or unbounded
    /// (chunked) bodies are not read at all.
    static func closeUnread(_ request: Request) -> Bool {
        // A client waiting for `100 Continue` has not sent the body: there is nothing to discard, and whether it sends
        // the body or the next request now is its choice (RFC 9110, 10.1.1). Closing keeps the two apart.
        if expectsContinue(request) { return true }
        if let declared = request.headers[.contentLength] {
            guard let n = Int(declared) else { return true }
            return n > drainCap
        }
        return request.headers[.transferEncoding] != nil
    }

    /// Whether the client waits for `100 Continue` before it sends the body (`Expect: 100-continue`, RFC 9110,
    /// 10.1.1). curl, .NET, Java's and many other HTTP stacks send it on larger bodies; unanswered, each such request
    /// waits out the client's own timeout (curl: 1 s) before its body is sent. HTTP/1.0 requests never get here with
    /// it (`HTTP10ExpectationFilter`).
    static func expectsContinue(_ request: Request) -> Bool {
        guard let expect = request.headers[.expect] else { return false }
        return expect.split(separator: ",").contains { $0.trimmingCharacters(in: .whitespaces).lowercased() == "100-continue" }
    }

    /// Asks the client for the body (`100 Continue`) when it waits for that, right before the body is read: a request
    /// refused before (401, 413 by its declared length, 415, 503) gets only its final answer (with `Connection:
    /// close`, `closeUnread`), and its body is never sent.
    static func continueIfExpected(_ request: Request, channel: any Channel) {
        guard expectsContinue(request) else { return }
        channel.writeAndFlush(HTTPResponsePart.head(HTTPResponse(status: .continue)), promise: nil)
    }

    /// JSON content types: `application/json` (any parameters) and `application/*+json`. A missing header is
    /// accepted (some HTTP stacks omit it for JSON); anything else is 415.
    static func isJSON(_ contentType: String?) -> Bool {
        guard let contentType else { return true }
        if contentType == "application/json" { return true }  // what nearly every client sends
        let media = contentType.split(separator: ";", maxSplits: 1).first.map {
            $0.trimmingCharacters(in: .whitespaces).lowercased()
        } ?? ""
        return media == "application/json" || (media.hasPrefix("application/") && media.hasSuffix("+json"))
    }

    /// `Content-Encoding: identity` (or empty) is the body as is; anything else (gzip, br, ...) is not accepted (415).
    static func isIdentity(_ contentEncoding: String) -> Bool {
        contentEncoding.split(separator: ",").allSatisfy {
            let c = $0.trimmingCharacters(in: .whitespaces).lowercased()
            return c.isEmpty || c == "identity"
        }
    }

    /// Constant-time comparison of `Authorization: Bearer <token>` with the configured token.
    static func authorized(_ header: String?, token: [UInt8]) -> Bool {
        guard let header, header.count > 7, header.prefix(7).lowercased() == "bearer " else { return false }
        let given = Array(header.utf8.dropFirst(7))
        var diff = UInt8(given.count == token.count ? 0 : 1)
        // Always walk the configured token's length, so the time does not depend on where a mismatch is.
        for i in 0..<token.count {
            diff |= token[i] ^ (i < given.count ? given[i] : 0)
        }
        return diff == 0
    }

    /// A JSON answer (compact, keys sorted). `close` asks for the connection to be closed after it (the rest of an
    /// unread body is then never read).
    static func json(_ status: HTTPResponse.Status, _ object: [String: JSONValue], close: Bool = false, retryAfter: Int? = nil, channel: (any Channel)? = nil) -> Response {
        IngestAnswer(status: status, object: object, retryAfter: retryAfter).response(close: close, channel: channel)
    }

    static func error(_ status: HTTPResponse.Status, reason: String, detail: String, close: Bool = false, retryAfter: Int? = nil, channel: (any Channel)? = nil) -> Response {
        IngestAnswer.error(status, reason: reason, detail: detail, retryAfter: retryAfter).response(close: close, channel: channel)
    }
}

/// An endpoint's JSON answer before it is written: a Hummingbird `Response` for the routes (`response`), the HTTP
/// parts of `TransactionFastPath` otherwise, with the same status, headers and bytes.
struct IngestAnswer: Sendable {
    var status: HTTPResponse.Status
    /// The JSON body, newline-terminated.
    var body: [UInt8]
    var retryAfter: Int?

    init(status: HTTPResponse.Status, body: [UInt8], retryAfter: Int? = nil) {
        self.status = status
        self.body = body
        self.retryAfter = retryAfter
    }

    /// A compact JSON object with sorted keys.
    init(status: HTTPResponse.Status, object: [String: JSONValue], retryAfter: Int? = nil) {
        var bytes = JSONValue.object(object).serializedBytes(sortedKeys: true)
        bytes.append(UInt8(ascii: "\n"))
        self.init(status: status, body: bytes, retryAfter: retryAfter)
    }

    static func error(_ status: HTTPResponse.Status, reason: String, detail: String, retryAfter: Int? = nil) -> IngestAnswer {
        IngestAnswer(status: status, object: ["error": .string(reason), "detail": .string(detail)], retryAfter: retryAfter)
    }

    /// 503: the broker did not take the input in time.
    static func unavailable(retryAfter: Int) -> IngestAnswer {
        .error(.serviceUnavailable, reason: "unavailable",
               detail: "the input could not be stored in time; nothing was accepted, retry later", retryAfter: retryAfter)
    }

    /// The answer's header fields (besides those every answer of the server gets: `Date`, `Server`).
    func headerFields(close: Bool) -> HTTPFields {
        var headers: HTTPFields = [.contentType: "application/json"]
        if let retryAfter { headers[.retryAfter] = String(retryAfter) }
        if close { headers[.connection] = "close" }
        return headers
    }

    /// As Hummingbird's `Response`. `close` (with the connection's `channel`) closes the connection after it.
    func response(close: Bool = false, channel: (any Channel)? = nil) -> Response {
        let buffer = ByteBuffer(bytes: body)
        guard close, let channel else {
            return Response(status: status, headers: headerFields(close: false), body: .init(byteBuffer: buffer))
        }
        return Response(status: status, headers: headerFields(close: true), body: ResponseBody(contentLength: buffer.readableBytes) { writer in
            try await writer.write(buffer)
            try await writer.finish(nil)
            // Queued after the response's own writes on the channel's event loop.
            channel.close(promise: nil)
        })
    }
}

/// Counts requests in flight and refuses beyond the bound.
final class InFlightGate: Sendable {
    let limit: Int
    private let count = Atomic<Int>(0)

    init(limit: Int) { self.limit = limit }

    func enter() -> Bool {
        let now = count.add(1, ordering: .relaxed).newValue
        if now > limit {
            count.subtract(1, ordering: .relaxed)
            return false
        }
        return true
    }

    func leave() { count.subtract(1, ordering: .relaxed) }

    var current: Int { count.load(ordering: .relaxed) }
}

/// The request context of the ingest endpoints: Hummingbird's basic one plus the connection, so that a request
/// refused before its body is read can close it (the rest of the body is then never read).
struct IngestRequestContext: RequestContext {
    var coreContext: CoreRequestContextStorage
    let channel: any Channel

    init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        channel = source.channel
    }
}
