import AppStoreVerification
import EntitlementDomain
import FleetDevStack
import FleetIngest
import FleetIngestClient
import FleetKafka
import FleetOperations
import FleetTestPKI
import FleetTestSupport
import FleetWorker
import Foundation
import Logging
import ServiceLifecycle
import Synchronization

enum Paths {
    static let repoRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    /// Shared fixtures live beside the package (`../shared/fixtures/...`); tests skip when they are absent.
    static let appleReal = repoRoot.deletingLastPathComponent().appendingPathComponent("shared/fixtures/apple-real")
}

/// Runs blocking client code on its own thread (never on the cooperative pool, which serves the in-process server).
func onThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    let result: Result<T, any Error> = await withCheckedContinuation { c in
        let t = Thread {
            do { c.resume(returning: .success(try body())) } catch { c.resume(returning: .failure(error)) }
        }
        t.stackSize = 1 << 20
        t.start()
    }
    return try result.get()
}

/// Runs `count` blocking jobs over `threads` threads (one keep-alive connection each) and returns their results.
func concurrently<T: Sendable>(_ count: Int, threads: Int, _ body: @escaping @Sendable (Int, inout HTTPConnection?) throws -> T) async throws -> [T] {
    let next = Box()
    let perThread = try await withThrowingTaskGroup(of: [(Int, T)].self) { group in
        for _ in 0..<threads {
            group.addTask {
                try await onThread {
                    var conn: HTTPConnection?
                    var out: [(Int, T)] = []
                    while true {
                        let i = next.value.add(1, ordering: .relaxed).oldValue
                        if i >= count { break }
                        out.append((i, try body(i, &conn)))
                    }
                    return out
                }
            }
        }
        var all: [(Int, T)] = []
        for try await part in group { all += part }
        return all
    }
    return perThread.sorted { $0.0 < $1.0 }.map(\.1)
}

/// An embedded Kafka cluster, a raw topic and an in-process `IngestService` on a free port.
final class IngestHarness: Sendable {
    let cluster: EmbeddedKafkaCluster
    let topic: String
    let port: Int
    let configuration: IngestConfiguration
    let readiness: Readiness
    private let group: ServiceGroup
    private let task: Task<Result<Void, any Error>, Never>

    static let pki = try! TestPKI()

    static func processor(policy: VerificationPolicy? = nil) -> InputProcessor {
        InputProcessor(verifier: SignedDataVerifier(policy: policy ?? (try! pki.policy())), mapper: EntitlementMapper())
    }

    init(brokers: Int = 1, partitions: Int = 3, policy: VerificationPolicy? = nil,
         configure: (inout IngestConfiguration) -> Void = { _ in }) async throws {
        cluster = try EmbeddedKafkaCluster(brokers: brokers)
        topic = "raw-\(UUID().uuidString.prefix(8).lowercased())"
        try cluster.createTopic(topic, partitions: partitions)
        _ = try await KafkaAdmin(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers)).waitForTopics([topic])
        var c = IngestConfiguration(
            kafka: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers, clientId: "ingest-tests"),
            topic: topic, host: "127.0.0.1", port: 0, publishTimeout: .seconds(10), requestTimeout: .seconds(5),
            idleTimeout: .seconds(30), retryAfterSeconds: 2, shutdownDeadline: .seconds(10))
        configure(&c)
        configuration = c
        readiness = Readiness()
        var logger = Logger(label: "ingest-tests")
        logger.logLevel = .warning
        let (ports, continuation) = AsyncStream.makeStream(of: Int.self)
        let service = try IngestService(configuration: c, processor: Self.processor(policy: policy), readiness: readiness, logger: logger,
                                        onListening: { port in continuation.yield(port) })
        let group = ServiceGroup(configuration: .init(services: [service], gracefulShutdownSignals: [], logger: logger))
        self.group = group
        task = Task {
            do { try await group.run(); return .success(()) } catch { return .failure(error) }
        }
        var found: Int?
        for await p in ports { found = p; break }
        guard let found else { throw HTTPClientError.connect("ingest did not start") }
        port = found
    }

    /// Graceful shutdown (what SIGTERM does through the process's ServiceGroup); returns how the service ended.
    @discardableResult
    func stop() async -> Result<Void, any Error> {
        await group.triggerGracefulShutdown()
        return await task.value
    }

    func connect() throws -> HTTPConnection { try HTTPConnection(port: port, timeoutSeconds: 60) }

    func read(atLeast count: Int, timeout: Duration = .seconds(60)) async throws -> [KafkaMessage] {
        try await readTopic(cluster.bootstrapServers, topic, atLeast: count, timeout: timeout)
    }
}

/// A notification body as Apple sends it, plus keys Apple might add later.
func notificationBody(_ jws: String, extra: String = "") -> [UInt8] {
    Array("{\"signedPayload\":\"\(jws)\"\(extra)}".utf8)
}

func json(_ r: HTTPResult) -> [String: Any] {
    (try? JSONSerialization.jsonObject(with: Data(r.body))) as? [String: Any] ?? [:]
}

/// Shared atomics for test threads (atomics cannot be captured directly: they are not copyable).
final class Box: Sendable {
    let value = Atomic<Int>(0)
}

final class Flag: Sendable {
    private let v = Atomic<Bool>(false)
    func set() { v.store(true, ordering: .relaxed) }
    var isSet: Bool { v.load(ordering: .relaxed) }
}
