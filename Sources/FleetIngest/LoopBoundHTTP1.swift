import FleetOperations
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import NIOHTTP1

/// Hummingbird's HTTP/1.1 child channel, with each connection's task run on the connection's own event loop.
///
/// Hummingbird runs a connection's request loop (reading requests, routing, the handlers, writing the answers) as a
/// task on the cooperative pool, so every request crossed threads several times: the loop hands the request to the
/// pool, the pool hands the answer back to the loop. Here that task prefers the connection's loop as its executor: it
/// moves there once, when the connection opens. Blocking work still never runs on a loop: verification has its own
/// thread pool (`IngestHandler.verifiers`), and the delivery report resumes the request on its loop. Its pipeline
/// also has `HTTP10ExpectationFilter`, right after NIO's HTTP/1 decoder.
struct LoopBoundHTTP1Channel: ServerChildChannel {
    typealias Value = HTTP1Channel.Value

    let base: HTTP1Channel
    /// Handlers placed last, after Hummingbird's connection state handler, in front of its request loop.
    let lastHandlers: @Sendable () -> [any ChannelHandler]

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        base.setup(channel: channel, logger: logger).flatMapThrowing { value in
            let handlers = lastHandlers()
            if !handlers.isEmpty {
                // Hummingbird's pipeline ends with its connection state handler; its request loop reads from the
                // handler NIOAsyncChannel put after it. Without that state handler the connection cannot be set up.
                let state = try channel.pipeline.syncOperations.handler(type: HTTPConnectionStateHandler.self)
                try channel.pipeline.syncOperations.addHandlers(handlers, position: .after(state))
            }
            // Right after the HTTP/1 decoder: before the conversion to HTTP types, which drops the request's version.
            // (Should a later Hummingbird build its pipeline without that decoder, connections still open; the
            // `expectContinue` test would say so.)
            if let decoder = try? channel.pipeline.syncOperations.handler(type: ByteToMessageHandler<HTTPRequestDecoder>.self) {
                try channel.pipeline.syncOperations.addHandler(HTTP10ExpectationFilter(), position: .after(decoder))
            }
            return value
        }
    }

    func handle(value: Value, logger: Logger) async {
        await withTaskExecutorPreference(EventLoopTaskExecutor(value.channel.eventLoop)) {
            await base.handle(value: value, logger: logger)
        }
    }
}

extension HTTPServerBuilder {
    /// `.http1(configuration:)` with each connection's task on its own event loop (`LoopBoundHTTP1Channel`), and
    /// `lastHandlers` (made for each connection) in front of Hummingbird's request loop.
    static func loopBoundHTTP1(configuration: HTTP1Channel.Configuration,
                               lastHandlers: @escaping @Sendable () -> [any ChannelHandler] = { [] }) -> HTTPServerBuilder {
        .init { responder in
            LoopBoundHTTP1Channel(base: HTTP1Channel(responder: responder, configuration: configuration), lastHandlers: lastHandlers)
        }
    }
}

/// Drops the `Expect` field of HTTP/1.0 requests: a server must ignore a 100-continue expectation in an HTTP/1.0
/// request (RFC 9110, 10.1.1), and an HTTP/1.0 client may not understand a `100 Continue`. HTTP types carry no version,
/// so this is decided here, before Hummingbird's conversion; `IngestHTTP.continueIfExpected` answers the rest.
final class HTTP10ExpectationFilter: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .head(var head) = unwrapInboundIn(data), head.version.major == 1, head.version.minor == 0, head.headers.contains(name: "expect") {
            head.headers.remove(name: "expect")
            context.fireChannelRead(wrapInboundOut(.head(head)))
            return
        }
        context.fireChannelRead(data)
    }
}
