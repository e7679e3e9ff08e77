import FleetKafka
import FleetOperations
import FleetWorker
import Hummingbird
import Logging
import Metrics
import NIOCore
import NIOPosix
import ServiceLifecycle
import Synchronization

/// `fleet ingest` as a swift-service-lifecycle `Service`: the HTTP front door publishing to the raw topic.
///
/// On graceful shutdown (SIGTERM through the ServiceGroup) it turns not-ready, stops accepting connections, lets
/// in-flight requests finish (each still answers only after its delivery report), then flushes and closes the
/// producer within `shutdownDeadline`. A fatal producer error ends the service with that error, so the process
/// exits and is restarted, rather than answering 503 forever.
public final class IngestService: Service, Sendable {
    public static let readinessCondition = "ingest-http"
    public static let producerCondition = "kafka-producer"
    /// The `Server` field of every answer.
    static let serverName = "fleet-ingest"

    public let configuration: IngestConfiguration
    let processor: InputProcessor
    let readiness: Readiness
    let logger: Logger
    let onListening: @Sendable (Int) async -> Void

    /// - Parameters:
    ///   - processor: the workers' own verification entry point (core + policy + mapper), used for `/v1/transactions`.
    ///   - onListening: called with the bound port once the server accepts connections.
    public init(configuration: IngestConfiguration, processor: InputProcessor, readiness: Readiness, logger: Logger,
                onListening: @escaping @Sendable (Int) async -> Void = { _ in }) throws(IngestConfigurationError) {
        try configuration.validate()
        self.configuration = configuration
        self.processor = processor
        self.readiness = readiness
        self.logger = logger
        self.onListening = onListening
    }

    public func run() async throws {
        readiness.set(Self.readinessCondition, false)
        let producer = try KafkaProducer(configuration: configuration.producerConfiguration)
        readiness.set(Self.producerCondition, true)
        let fatal = FatalSignal()
        let readiness = self.readiness
        // `/v1/transactions` verifies here, one thread per core: never on the event loops or the cooperative pool.
        let verifiers = NIOThreadPool(numberOfThreads: configuration.verifierThreads)
        verifiers.start()
        let handler = IngestHandler(
            configuration: configuration, processor: processor, verifiers: verifiers, producer: producer,
            gate: InFlightGate(limit: configuration.maxInFlight), logger: logger,
            onFatal: { error in
                readiness.set(IngestService.producerCondition, false)
                fatal.fire(error)
            })
        let router = Router(context: IngestRequestContext.self)
        handler.register(on: router)
        var quiet = logger
        quiet.logLevel = max(logger.logLevel, .notice)
        let idle = configuration.idleTimeout
        let requestTimeout = TimeAmount.nanoseconds(configuration.requestTimeout.nanoseconds)
        let onListening = self.onListening
        let port = configuration.port
        // The server's own loops (`eventLoopThreads`), shut down when it has stopped.
        let loops = MultiThreadedEventLoopGroup(numberOfThreads: configuration.eventLoopThreads)
        let app = Application(
            router: router,
            // Each connection's requests are handled on its own event loop, not on the cooperative pool.
            // Each request's body has its deadline (`RequestDeadlineHandler`); idle connections close after `idle`.
            // Well-formed `/v1/transactions` requests are answered in front of Hummingbird (`TransactionFastPath`).
            server: .loopBoundHTTP1(
                configuration: .init(additionalChannelHandlers: [RequestDeadlineHandler(timeout: requestTimeout)],
                                     idleTimeout: .nanoseconds(idle.nanoseconds)),
                lastHandlers: { [TransactionFastPath(ingest: handler, serverName: Self.serverName)] }),
            // A deep accept backlog: bursts of new connections (Apple, many apps at once) wait instead of being refused.
            configuration: .init(address: .hostname(configuration.host, port: configuration.port), serverName: Self.serverName,
                                 backlog: max(256, configuration.maxInFlight)),
            onServerRunning: { channel in
                readiness.set(IngestService.readinessCondition, true)
                await onListening(channel.localAddress?.port ?? port)
            },
            eventLoopGroupProvider: .shared(loops),
            logger: quiet)
        logger.info("ingest listening", metadata: [
            "port": "\(configuration.port)", "event-loops": "\(configuration.eventLoopThreads)",
            "verifier-threads": "\(configuration.verifierThreads)", "topic": "\(configuration.topic)",
            "notifications": "\(configuration.notificationsPath)", "transactions": "\(configuration.transactionsPath)",
            "auth": "\(configuration.apiToken == nil ? "none" : "bearer")",
        ])
        var failure: (any Error)?
        do {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    try await withGracefulShutdownHandler {
                        try await app.run()
                    } onGracefulShutdown: {
                        readiness.set(IngestService.readinessCondition, false)
                    }
                }
                group.addTask {
                    if let error = await fatal.wait() { throw error }
                }
                // Whichever ends first (the server after a graceful shutdown, or a fatal producer error) ends both.
                do { try await group.next() } catch {
                    fatal.fire(nil)
                    group.cancelAll()
                    throw error
                }
                fatal.fire(nil)
                group.cancelAll()
            }
        } catch {
            failure = error
        }
        readiness.set(Self.readinessCondition, false)
        try? await verifiers.shutdownGracefully()
        try? await loops.shutdownGracefully()
        let pending = producer.inFlight
        let flushed = await producer.flush(deadline: configuration.shutdownDeadline)
        await producer.close(deadline: .seconds(1))
        logger.info("ingest stopped", metadata: ["pending-at-stop": "\(pending)", "flushed": "\(flushed)"])
        if let failure { throw failure }
    }
}

/// Fires once (a fatal producer error, or nil to release the waiter).
final class FatalSignal: Sendable {
    private let state = Mutex<(fired: Bool, error: KafkaError?, waiter: CheckedContinuation<KafkaError?, Never>?)>((false, nil, nil))

    func fire(_ error: KafkaError?) {
        let waiter = state.withLock { s -> CheckedContinuation<KafkaError?, Never>? in
            guard !s.fired else { return nil }
            s.fired = true
            s.error = error
            defer { s.waiter = nil }
            return s.waiter
        }
        waiter?.resume(returning: error)
    }

    func wait() async -> KafkaError? {
        await withCheckedContinuation { (c: CheckedContinuation<KafkaError?, Never>) in
            let ready = state.withLock { s -> (Bool, KafkaError?) in
                if s.fired { return (true, s.error) }
                s.waiter = c
                return (false, nil)
            }
            if ready.0 { c.resume(returning: ready.1) }
        }
    }
}
