import FleetDevStack
import FleetKafka
import FleetTestPKI
import FleetTestSupport
import Foundation
import HTTPTypes
import Logging
import NIOCore
import NIOEmbedded
import NIOHTTPTypes
import NIOPosix
import Testing

@testable import FleetIngest

/// `TransactionFastPath` alone on a testing channel: what it takes, what it hands on to Hummingbird (the channel's
/// inbound side), and the order of answers when requests are pipelined. The whole server's behaviour with it is in
/// `IngestEndpointTests` and `IngestFaultTests`.
@Suite("the /v1/transactions fast path", .serialized)
struct TransactionFastPathTests {
    static let path = "/v1/transactions"

    /// An `IngestHandler` publishing to an embedded cluster, and a testing channel with the fast path in it.
    final class Rig: Sendable {
        let cluster: EmbeddedKafkaCluster
        let producer: KafkaProducer
        let verifiers: NIOThreadPool
        let ingest: IngestHandler
        let channel: NIOAsyncTestingChannel

        init(configure: (inout IngestConfiguration) -> Void = { _ in }) async throws {
            cluster = try EmbeddedKafkaCluster(brokers: 1)
            try cluster.createTopic("raw", partitions: 1)
            var c = IngestConfiguration(kafka: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers, clientId: "fast-path-tests"),
                                        topic: "raw", publishTimeout: .seconds(10))
            configure(&c)
            producer = try KafkaProducer(configuration: c.producerConfiguration)
            verifiers = NIOThreadPool(numberOfThreads: 1)
            verifiers.start()
            var logger = Logger(label: "fast-path-tests")
            logger.logLevel = .warning
            ingest = IngestHandler(configuration: c, processor: IngestHarness.processor(), verifiers: verifiers, producer: producer,
                                   gate: InFlightGate(limit: c.maxInFlight), logger: logger, onFatal: { _ in })
            let channel = NIOAsyncTestingChannel()
            let ingest = self.ingest
            try await channel.testingEventLoop.executeInContext {
                try channel.pipeline.syncOperations.addHandler(TransactionFastPath(ingest: ingest, serverName: "fleet-ingest"))
            }
            self.channel = channel
        }

        /// Delivers `parts` in one turn of the loop, as one read of a pipelining client would.
        func deliver(_ parts: [HTTPRequestPart]) async throws {
            let channel = self.channel
            try await channel.testingEventLoop.executeInContext {
                for part in parts { channel.pipeline.fireChannelRead(part) }
                channel.pipeline.fireChannelReadComplete()
            }
        }

        /// What was handed on to Hummingbird so far.
        func handedOn() async throws -> [HTTPRequestPart] {
            var out: [HTTPRequestPart] = []
            while let part = try await channel.readInbound(as: HTTPRequestPart.self) { out.append(part) }
            return out
        }

        /// The next whole answer written by the fast path (or passed through it).
        func answer() async throws -> (head: HTTPResponse, body: [UInt8]) {
            await channel.testingEventLoop.run()  // tasks the handler enqueued from the loop itself
            guard case .head(let head) = try await channel.waitForOutboundWrite(as: HTTPResponsePart.self) else {
                throw TestFailure("an answer must start with its head")
            }
            var body: [UInt8] = []
            while true {
                switch try await channel.waitForOutboundWrite(as: HTTPResponsePart.self) {
                case .body(let b): body += b.readableBytesView
                case .end: return (head, body)
                case .head: throw TestFailure("a second head before the end")
                }
            }
        }

        func stop() async throws {
            _ = try? await channel.finish()
            try await verifiers.shutdownGracefully()
            await producer.close(deadline: .seconds(2))
            cluster.shutdown()
        }
    }

    struct TestFailure: Error, CustomStringConvertible {
        let description: String
        init(_ d: String) { description = d }
    }

    static func post(_ body: [UInt8], path: String = path, fields: HTTPFields = [:]) -> [HTTPRequestPart] {
        var headers: HTTPFields = [.contentType: "application/json", .contentLength: String(body.count)]
        for field in fields { headers[field.name] = field.value }
        return [.head(HTTPRequest(method: .post, scheme: nil, authority: "x", path: path, headerFields: headers)),
                .body(ByteBuffer(bytes: body)), .end(nil)]
    }

    static let healthz: [HTTPRequestPart] = [.head(HTTPRequest(method: .get, scheme: nil, authority: "x", path: "/healthz")), .end(nil)]

    static func transaction(_ id: String = "2000000000000001") -> [UInt8] {
        Array("{\"signedTransaction\":\"\(IngestHarness.pki.sign(TestPayloads.transaction(transactionId: id)))\"}".utf8)
    }

    @Test("a well-formed transaction is answered here with the route's answer and fields; nothing is handed on")
    func takesAWellFormedTransaction() async throws {
        let rig = try await Rig()
        try await rig.deliver(Self.post(Self.transaction("2000000000000042")))
        let (head, body) = try await rig.answer()
        #expect(head.status == .ok)
        let object = (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any] ?? [:]
        #expect(object["verdict"] as? String == "verified", "\(String(decoding: body, as: UTF8.self))")
        #expect(object["transactionIds"] as? [String] == ["2000000000000042"])
        #expect(head.headerFields[.contentType] == "application/json")
        #expect(head.headerFields[.contentLength] == String(body.count))
        #expect(head.headerFields[.server] == "fleet-ingest")
        #expect(head.headerFields[.date].map { $0.hasSuffix(" GMT") && $0.count == 29 } == true, "\(head.headerFields)")
        #expect(head.headerFields[.connection] == nil)
        #expect(try await rig.handedOn().isEmpty)
        #expect(rig.ingest.gate.current == 0)
        let published = try await readTopic(rig.cluster.bootstrapServers, "raw", atLeast: 1, timeout: .seconds(20))
        #expect(published.count == 1)
        try await rig.stop()
    }

    @Test("everything else is Hummingbird's: other paths and methods, queries, Connection, Expect, chunked, other types, codings, sizes, tokens")
    func handsOnWhatItDoesNotTake() async throws {
        let rig = try await Rig { $0.apiToken = Array("sesame".utf8); $0.maxBodyBytes = 2048 }
        let body = Array("{\"signedTransaction\":1}".utf8)
        let authorized: HTTPFields = [.authorization: "Bearer sesame"]
        var cases: [(String, [HTTPRequestPart])] = [
            ("another path", Self.post(body, path: "/apple/notifications", fields: authorized)),
            ("a query", Self.post(body, path: Self.path + "?x=1", fields: authorized)),
            ("GET", Self.healthz),
            ("Connection: close", Self.post(body, fields: authorized + [.connection: "close"])),
            ("Expect", Self.post(body, fields: authorized + [.expect: "100-continue"])),
            ("text/plain", Self.post(body, fields: authorized + [.contentType: "text/plain"])),
            ("gzip", Self.post(body, fields: authorized + [.contentEncoding: "gzip"])),
            ("no token", Self.post(body)),
            ("a wrong token", Self.post(body, fields: [.authorization: "Bearer sesamf"])),
            ("above the bound", Self.post(body, fields: authorized + [.contentLength: "2049"])),
        ]
        var chunked = Self.post(body, fields: authorized)
        chunked[0] = .head(HTTPRequest(method: .post, scheme: nil, authority: "x", path: Self.path,
                                       headerFields: [.contentType: "application/json", .transferEncoding: "chunked", .authorization: "Bearer sesame"]))
        cases.append(("chunked", chunked))
        for (name, parts) in cases {
            try await rig.deliver(parts)
            let handed = try await rig.handedOn()
            #expect(handed.count == parts.count, "\(name): \(handed.count) of \(parts.count) parts handed on")
            // Hummingbird answers it (its answer passes through the fast path) before the next one arrives.
            try await rig.channel.writeOutbound(HTTPResponsePart.head(HTTPResponse(status: .ok)))
            try await rig.channel.writeOutbound(HTTPResponsePart.end(nil))
            _ = try await rig.answer()
        }
        #expect(rig.ingest.gate.current == 0)
        // With the token and within the bound it is taken.
        try await rig.deliver(Self.post(body, fields: authorized))
        #expect(try await rig.answer().head.status == .badRequest, "a signedTransaction that is not a string")
        #expect(try await rig.handedOn().isEmpty)
        try await rig.stop()
    }

    @Test("while Hummingbird owes an answer on the connection, a transaction goes to Hummingbird too (answers stay in order)")
    func behindAnUnansweredRequestItHandsOn() async throws {
        let rig = try await Rig()
        let tx = Self.post(Self.transaction())
        try await rig.deliver(Self.healthz + tx)
        #expect(try await rig.handedOn().count == Self.healthz.count + tx.count)
        // Hummingbird answers both; then the next transaction is the fast path's again.
        for _ in 0..<2 {
            try await rig.channel.writeOutbound(HTTPResponsePart.head(HTTPResponse(status: .ok)))
            try await rig.channel.writeOutbound(HTTPResponsePart.end(nil))
            _ = try await rig.answer()
        }
        try await rig.deliver(tx)
        #expect(try await rig.answer().head.status == .ok)
        #expect(try await rig.handedOn().isEmpty)
        try await rig.stop()
    }

    @Test("what is pipelined behind its own request is held until its answer is written, then taken or handed on in order")
    func holdsWhatFollowsItsOwnRequest() async throws {
        let rig = try await Rig()
        let first = Self.post(Self.transaction("2000000000000001"))
        let second = Self.post(Self.transaction("2000000000000002"))
        try await rig.deliver(first + Self.healthz + second)
        // Nothing of the GET may reach Hummingbird before the first answer is written.
        let before = try await rig.handedOn()
        let (head, body) = try await rig.answer()
        #expect(before.isEmpty, "handed on before the first answer: \(before)")
        #expect(head.status == .ok)
        #expect(String(decoding: body, as: UTF8.self).contains("2000000000000001"))
        // Then the GET, and the second transaction behind it, go to Hummingbird, which answers them in order.
        #expect(try await rig.handedOn().count == Self.healthz.count + second.count)
        await rig.channel.testingEventLoop.run()
        #expect(try await rig.channel.readOutbound(as: HTTPResponsePart.self) == nil, "the fast path answered out of turn")
        #expect(rig.ingest.gate.current == 0)
        try await rig.stop()
    }

    @Test("a body cut off by the request deadline: 408 with Connection: close, the connection closed, nothing published")
    func deadlineWhileCollecting() async throws {
        let rig = try await Rig()
        let parts = Self.post(Self.transaction())
        try await rig.deliver(Array(parts.prefix(1)))
        rig.channel.pipeline.fireErrorCaught(RequestDeadlineExceeded())
        let (head, body) = try await rig.answer()
        #expect(head.status == .requestTimeout)
        #expect(head.headerFields[.connection] == "close")
        #expect(String(decoding: body, as: UTF8.self).contains("request_timeout"))
        try await rig.channel.closeFuture.get()
        #expect(rig.ingest.gate.current == 0)
        #expect(try await rig.handedOn().isEmpty)
        try await rig.stop()
    }

    @Test("the Date field is IMF-fixdate in GMT, as Hummingbird's routes write it")
    func dateField() {
        #expect(HTTPDate.format(0) == "Thu, 01 Jan 1970 00:00:00 GMT")
        #expect(HTTPDate.format(951_782_400) == "Tue, 29 Feb 2000 00:00:00 GMT")
        #expect(HTTPDate.format(1_796_574_315) == "Sun, 06 Dec 2026 16:25:15 GMT")
        #expect(HTTPDate.now.count == 29)
    }
}

private func + (lhs: HTTPFields, rhs: HTTPFields) -> HTTPFields {
    var out = lhs
    for field in rhs { out[field.name] = field.value }
    return out
}
