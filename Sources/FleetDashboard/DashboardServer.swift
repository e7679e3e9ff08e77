import FleetOperations
import Foundation
import Hummingbird
import Logging
import NIOCore
import ServiceLifecycle

/// The dashboard's HTTP side: `GET /` (the page), `/api/summary` (JSON), `/healthz`, `/readyz`, `/metrics`.
public struct DashboardServer: Service {
    public let host: String
    public let port: Int
    public let state: DashboardState
    private let logger: Logger

    public init(host: String = "127.0.0.1", port: Int, state: DashboardState, logger: Logger) {
        self.host = host
        self.port = port
        self.state = state
        self.logger = logger
    }

    public func run() async throws {
        let state = self.state
        let router = Router()
        // The page loads nothing from anywhere: a strict policy makes the browser refuse any other origin.
        let pageHeaders: HTTPFields = [
            .contentType: "text/html; charset=utf-8",
            .contentSecurityPolicy: "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'",
            .cacheControl: "no-store",
        ]
        router.get("/") { _, _ -> Response in
            Response(status: .ok, headers: pageHeaders, body: .init(byteBuffer: ByteBuffer(string: DashboardPage.render(state.summary()))))
        }
        router.get("/api/summary") { _, _ -> Response in
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            let data = (try? encoder.encode(state.summary())) ?? Data("{}".utf8)
            return Response(status: .ok, headers: [.contentType: "application/json", .cacheControl: "no-store"],
                            body: .init(byteBuffer: ByteBuffer(bytes: data)))
        }
        router.get("/metrics") { _, _ -> Response in
            var buffer = [UInt8]()
            buffer.reserveCapacity(16 * 1024)
            FleetMetrics.registry.emit(into: &buffer)
            return Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                            body: .init(byteBuffer: ByteBuffer(bytes: buffer)))
        }
        router.get("/healthz") { _, _ -> Response in
            Response(status: .ok, body: .init(byteBuffer: ByteBuffer(string: "ok\n")))
        }
        router.get("/readyz") { _, _ -> Response in
            if state.readiness.isReady { return Response(status: .ok, body: .init(byteBuffer: ByteBuffer(string: "ready\n"))) }
            let failing = state.readiness.failing
            let text = "not ready: " + (failing.isEmpty ? "starting" : failing.joined(separator: ", ")) + "\n"
            return Response(status: .serviceUnavailable, body: .init(byteBuffer: ByteBuffer(string: text)))
        }
        var quiet = logger
        quiet.logLevel = max(logger.logLevel, .notice)
        let app = Application(
            router: router,
            configuration: .init(address: .hostname(host, port: port), serverName: "fleet-dashboard"),
            onServerRunning: { channel in state.setBoundPort(channel.localAddress?.port) },
            logger: quiet)
        try await app.runService(gracefulShutdownSignals: [])
    }
}
