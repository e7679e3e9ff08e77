import HummingbirdCore
import NIOCore
import NIOHTTPTypes

/// The request deadline of `fleet ingest`: once a request's head has arrived, its body must arrive within `timeout`,
/// else the handler reading the body gets `RequestDeadlineExceeded` (and answers 408, closing the connection), and
/// the connection is closed: a slow client cannot hold a request slot forever.
///
/// One timer per connection, not one per request: the timer is armed at a request's deadline only when none is
/// pending, and when it fires early (it was armed for an earlier request) it re-arms at the current request's
/// deadline. Under load a connection serves thousands of requests per timer; a timer per request (NIO's scheduled-task
/// heap, a promise and a closure, then a linear cancel) cost ~1.5 % of the front door's CPU.
final class RequestDeadlineHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart

    private let timeout: TimeAmount
    /// When the current request's head arrived; nil between requests (its end has arrived).
    private var started: NIODeadline?
    private var timer: Scheduled<Void>?

    init(timeout: TimeAmount) {
        self.timeout = timeout
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head:
            let now = NIODeadline.now()
            started = now
            if timer == nil { arm(context, at: now + timeout) }
        case .end:
            started = nil
        case .body:
            break
        }
        context.fireChannelRead(data)
    }

    func channelInactive(context: ChannelHandlerContext) {
        disarm()
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        disarm()
    }

    private func arm(_ context: ChannelHandlerContext, at deadline: NIODeadline) {
        timer = context.eventLoop.assumeIsolated().scheduleTask(deadline: deadline) { [self] in
            fired(context)
        }
    }

    private func disarm() {
        timer?.cancel()
        timer = nil
    }

    private func fired(_ context: ChannelHandlerContext) {
        timer = nil
        guard let started else { return }  // no request in progress: the next head arms again
        let deadline = started + timeout
        if NIODeadline.now() < deadline {
            arm(context, at: deadline)
            return
        }
        self.started = nil
        // The body's reader ends with this error (not a plain end of stream): the request is answered 408 with
        // `Connection: close`. Should that answer not go out (a client that reads nothing), the connection is closed
        // a grace period later all the same.
        context.fireErrorCaught(RequestDeadlineExceeded())
        let channel = context.channel
        timer = context.eventLoop.assumeIsolated().scheduleTask(in: Self.closeGrace) {
            channel.close(promise: nil)
        }
    }

    /// How long the 408 answer has to go out before the connection is closed regardless.
    static let closeGrace = TimeAmount.seconds(1)
}

/// A request's body did not arrive within the request deadline (`RequestDeadlineHandler`).
struct RequestDeadlineExceeded: Error {}
