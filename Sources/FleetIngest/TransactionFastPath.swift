import FleetOperations
import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import NIOHTTPTypes
import Synchronization

/// Answers a well-formed `POST /v1/transactions` on the connection's pipeline, in front of Hummingbird's request loop.
///
/// Through Hummingbird, each request crosses two async sequences (NIOAsyncChannel's inbound stream and the body's),
/// the router, a request context and a logger with the request's id, and an outbound writer; with verification that is
/// most of what stands between the endpoint and its target (issue 17). Here the request's parts are collected by the
/// handler itself and its answer (from `IngestHandler.transaction`, the same code and metrics as the route) is
/// written straight to the pipeline by one task on the connection's loop.
///
/// Only requests that pass every check before the body (`IngestHandler.fastPathLength`) and the in-flight bound are
/// taken, and only while no request handed to Hummingbird is unanswered on this connection; everything else goes on
/// to Hummingbird unchanged. The order of answers is the order of requests: parts that arrive while this handler's
/// request is being answered (a pipelining client) are held, and passed on (or taken) once its answer is written;
/// reading stops while more than `holdBound` are held. It sits after Hummingbird's `HTTPConnectionStateHandler` and
/// the request deadline, so both see its requests and answers: the idle timeout, graceful shutdown (the connection
/// closes once its last answer is written) and the body deadline (`RequestDeadlineExceeded`: 408, closed) work as they
/// do for the routes.
final class TransactionFastPath: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private enum State {
        /// Between requests, or a request handed on is complete (its answer may still be coming).
        case idle
        /// A request handed on to Hummingbird, until its end.
        case forwarding
        /// This handler's request, until its end (`body` fills).
        case collecting
        /// This handler's request is complete and its answer is being made.
        case answering
    }

    private enum Held {
        case part(HTTPRequestPart)
        case error(any Error)
    }

    /// Held items above which the connection stops reading until the answer is written.
    static let holdBound = 8

    private let ingest: IngestHandler
    private let serverName: String
    private var state = State.idle
    private var body: [UInt8] = []
    /// The declared length of the request being collected (at most the size bound).
    private var declared = 0
    private var began = ContinuousClock.now
    /// Requests handed on to Hummingbird whose answer's end has not been written.
    private var unansweredUpstream = 0
    private var held: [Held] = []
    private var readHeld = false
    private var active = true
    private var executor: EventLoopTaskExecutor?

    init(ingest: IngestHandler, serverName: String) {
        self.ingest = ingest
        self.serverName = serverName
    }

    func handlerAdded(context: ChannelHandlerContext) {
        executor = EventLoopTaskExecutor(context.eventLoop)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = unwrapInboundIn(data)
        if case .answering = state {
            held.append(.part(part))
            return
        }
        read(part, context: context)
    }

    /// One inbound part, in order; returns whether it was handed on.
    @discardableResult
    private func read(_ part: HTTPRequestPart, context: ChannelHandlerContext) -> Bool {
        switch (state, part) {
        case (.idle, .head(let head)):
            if unansweredUpstream == 0, let length = ingest.fastPathLength(head), ingest.gate.enter() {
                state = .collecting
                began = .now
                body = []
                declared = length
                return false
            }
            unansweredUpstream += 1
            state = .forwarding
        case (.collecting, .body(let chunk)):
            // Room for the declared length once the body starts to arrive (a client that declares and sends nothing
            // holds no buffer).
            if body.isEmpty { body.reserveCapacity(declared) }
            body.append(contentsOf: chunk.readableBytesView)
            return false
        case (.collecting, .end):
            state = .answering
            answer(context: context)
            return false
        case (.collecting, .head):
            // Not possible after NIO's decoder (a head only follows an end); never answer two requests as one.
            fail(context: context, timedOut: false)
            return false
        case (.forwarding, .end):
            state = .idle
        case (.forwarding, _), (.idle, _):
            break
        case (.answering, _):
            held.append(.part(part))
            return false
        }
        context.fireChannelRead(wrapInboundOut(part))
        return true
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        switch state {
        case .collecting:
            // The body did not arrive in time (`RequestDeadlineHandler`) or could not be decoded: answered and closed.
            fail(context: context, timedOut: error is RequestDeadlineExceeded)
        case .answering:
            held.append(.error(error))
        case .idle, .forwarding:
            context.fireErrorCaught(error)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        active = false
        held.removeAll()
        if case .collecting = state {
            // Abandoned before its end: nothing was published, nothing is answered.
            ingest.gate.leave()
            state = .idle
            body = []
        }
        context.fireChannelInactive()
    }

    func read(context: ChannelHandlerContext) {
        if held.count > Self.holdBound {
            readHeld = true
            return
        }
        context.read()
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .end = unwrapOutboundIn(data), unansweredUpstream > 0 { unansweredUpstream -= 1 }
        context.write(data, promise: promise)
    }

    /// Publishes and verifies the collected body on a task bound to this loop, then writes its answer.
    private func answer(context: ChannelHandlerContext) {
        let body = self.body
        self.body = []
        let ingest = self.ingest
        let loop = context.eventLoop
        let bound = NIOLoopBound((self, context), eventLoop: loop)
        Task(executorPreference: executor) {
            let answer = await ingest.transaction(body)
            if loop.inEventLoop {
                bound.value.0.answered(answer, close: false, context: bound.value.1)
            } else {
                loop.execute { bound.value.0.answered(answer, close: false, context: bound.value.1) }
            }
        }
    }

    private func fail(context: ChannelHandlerContext, timedOut: Bool) {
        state = .answering
        body = []
        answered(ingest.bodyUnread(.transactions, timedOut: timedOut), close: true, context: context)
    }

    /// Writes the answer of this handler's request (unless the connection has gone), then goes on with what was held.
    private func answered(_ answer: IngestAnswer, close: Bool, context: ChannelHandlerContext) {
        ingest.gate.leave()
        ingest.answered(.transactions, status: answer.status.code, since: began)
        state = .idle
        guard active else { return }
        var fields = answer.headerFields(close: close)
        fields[.contentLength] = String(answer.body.count)
        fields[.date] = HTTPDate.now
        fields[.server] = serverName
        context.write(wrapOutboundOut(.head(HTTPResponse(status: answer.status, headerFields: fields))), promise: nil)
        context.write(wrapOutboundOut(.body(context.channel.allocator.buffer(bytes: answer.body))), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        if close {
            held.removeAll()
            context.close(promise: nil)
            return
        }
        release(context: context)
    }

    /// Takes or hands on the held parts in order, until one of them is this handler's request again.
    private func release(context: ChannelHandlerContext) {
        var handedOn = false
        var index = 0
        while index < held.count, active {
            if case .answering = state { break }
            switch held[index] {
            case .part(let part):
                if read(part, context: context) { handedOn = true }
            case .error(let error):
                errorCaught(context: context, error: error)
            }
            index += 1
        }
        held.removeFirst(min(index, held.count))
        // Hummingbird's channel delivers what it was handed at the end of a read.
        if handedOn { context.fireChannelReadComplete() }
        if readHeld, held.count <= Self.holdBound {
            readHeld = false
            context.read()
        }
    }
}

/// `Date` field values (IMF-fixdate, RFC 9110 5.6.7), made once a second.
enum HTTPDate {
    private static let cache = Mutex<(second: Int, value: String)>((-1, ""))
    private static let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    static var now: String {
        let second = Int(time(nil))
        return cache.withLock { c in
            if c.second != second { c = (second, format(second)) }
            return c.value
        }
    }

    /// e.g. `Sun, 06 Dec 2026 18:05:15 GMT`.
    static func format(_ secondsSince1970: Int) -> String {
        var t = time_t(secondsSince1970)
        var parts = tm()
        gmtime_r(&t, &parts)
        func two(_ n: Int32) -> String { n < 10 ? "0\(n)" : "\(n)" }
        return "\(days[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(months[Int(parts.tm_mon)]) \(parts.tm_year + 1900) "
            + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
    }
}
