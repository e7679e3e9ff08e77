@testable import FleetIngest
import FleetIngestClient
import Foundation
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle
import Testing

/// `LoopBoundHTTP1Channel`: a connection's requests are handled on that connection's event loop. The same route
/// through Hummingbird's stock HTTP/1.1 channel runs on the cooperative pool, which is what the comparison shows.
@Suite("ingest connections handled on their own event loop")
struct LoopBoundTests {
    /// Where the route's handler ran: "loop" on its connection's event loop, "elsewhere" otherwise; also after an
    /// await that resumes from another thread (as a delivery report does).
    static func whereHandled(_ server: HTTPServerBuilder) async throws -> [String] {
        let router = Router(context: IngestRequestContext.self)
        router.get("/where") { _, context -> String in
            let before = context.channel.eventLoop.inEventLoop
            // Resumed from a thread that is neither the loop nor the cooperative pool.
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in Thread { c.resume() }.start() }
            let after = context.channel.eventLoop.inEventLoop
            return (before ? "loop" : "elsewhere") + "," + (after ? "loop" : "elsewhere")
        }
        let loops = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        let (ports, portStream) = AsyncStream.makeStream(of: Int.self)
        var logger = Logger(label: "loop-bound-test")
        logger.logLevel = .critical
        let app = Application(
            router: router, server: server, configuration: .init(address: .hostname("127.0.0.1", port: 0)),
            onServerRunning: { portStream.yield($0.localAddress?.port ?? 0) },
            eventLoopGroupProvider: .shared(loops), logger: logger)
        let group = ServiceGroup(configuration: .init(services: [app], gracefulShutdownSignals: [], logger: logger))
        let running = Task { try await group.run() }
        var bound = 0
        for await p in ports { bound = p; break }
        let port = bound
        let answers = try await onThread {
            let connection = try HTTPConnection(port: port)
            return try (0..<3).map { _ in String(decoding: try connection.request("GET", "/where").body, as: UTF8.self) }
        }
        await group.triggerGracefulShutdown()
        try await running.value
        try await loops.shutdownGracefully()
        return answers
    }

    @Test("a request is handled on its connection's loop, before and after an await; the stock channel's is not")
    func handledOnTheLoop() async throws {
        let bound = try await Self.whereHandled(.loopBoundHTTP1(configuration: .init()))
        #expect(bound == ["loop,loop", "loop,loop", "loop,loop"])
        let stock = try await Self.whereHandled(.http1(configuration: .init()))
        #expect(stock.allSatisfy { $0 == "elsewhere,elsewhere" }, "\(stock)")
    }
}
