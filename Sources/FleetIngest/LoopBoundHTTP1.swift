import FleetOperations
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore

/// Hummingbird's HTTP/1.1 child channel, with each connection's task run on the connection's own event loop.
///
/// Hummingbird runs a connection's request loop (reading requests, routing, the handlers, writing the answers) as a
/// task on the cooperative pool, so every request crossed threads several times: the loop hands the request to the
/// pool, the pool hands the answer back to the loop. Here that task prefers the connection's loop as its executor: it
/// moves there once, when the connection opens. Blocking work still never runs on a loop: verification has its own
/// thread pool (`IngestHandler.verifiers`), and the delivery report resumes the request on its loop.
struct LoopBoundHTTP1Channel: ServerChildChannel {
    typealias Value = HTTP1Channel.Value

    let base: HTTP1Channel

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        base.setup(channel: channel, logger: logger)
    }

    func handle(value: Value, logger: Logger) async {
        await withTaskExecutorPreference(EventLoopTaskExecutor(value.channel.eventLoop)) {
            await base.handle(value: value, logger: logger)
        }
    }
}

extension HTTPServerBuilder {
    /// `.http1(configuration:)` with each connection's task on its own event loop (`LoopBoundHTTP1Channel`).
    static func loopBoundHTTP1(configuration: HTTP1Channel.Configuration) -> HTTPServerBuilder {
        .init { responder in LoopBoundHTTP1Channel(base: HTTP1Channel(responder: responder, configuration: configuration)) }
    }
}
