import AppStoreServerAPI
import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import Logging
import Synchronization

/// The stand-in's own server logs (startup, cancellation at stop) are noise in test output.
private let quietLogger: Logger = {
    var l = Logger(label: "appstore-api-stand-in")
    l.logLevel = .critical
    return l
}()

/// A strict local stand-in for Apple's App Store Server API (tests and local runs only).
///
/// Every request must carry a valid ES256 bearer token (header `alg`/`kid`/`typ`, claims `iss`/`aud`/`bid`/`iat`/`exp`
/// with at most 60 minutes of life, signature checked with the public half of the key); anything else gets 401 with
/// no body, as Apple does. It serves notification history in pages, transaction history v2 in pages, subscription
/// statuses, transaction info, order lookup, refund history, consumption information and test notifications, with
/// faults on demand: one 429 with `Retry-After` on a chosen page, 5xx for the next N requests, 404 with Apple's
/// error codes for unknown ids. The signed documents come from the caller (signed by the test PKI).
public final class AppleAPIStandIn: Sendable {
    public struct Expectation: Sendable {
        public var keyId: String
        public var issuerId: String
        public var bundleId: String
        public var publicKey: P256.Signing.PublicKey
        public init(keyId: String, issuerId: String, bundleId: String, publicKey: P256.Signing.PublicKey) {
            self.keyId = keyId
            self.issuerId = issuerId
            self.bundleId = bundleId
            self.publicKey = publicKey
        }
    }

    public struct RecordedRequest: Sendable, Equatable {
        public var method: String
        public var path: String
        public var query: String
        public var status: Int
        /// Nil when the token was valid; else why it was refused.
        public var tokenProblem: String?
        public var body: String
    }

    public struct ConsumptionCall: Sendable, Equatable {
        public var transactionId: String
        public var body: ConsumptionRequest
        public init(transactionId: String, body: ConsumptionRequest) {
            self.transactionId = transactionId
            self.body = body
        }
    }

    struct State {
        var notificationPages: [[String]] = []
        /// Page index (0-based) answered once with 429 before being served.
        var throttlePage: Int?
        var throttleRetryAfter = "1"
        /// Transaction id -> original transaction id; original -> its signed transactions in order.
        var transactionOwner: [String: String] = [:]
        var histories: [String: [String]] = [:]
        var statuses: [String: [LastTransactionsItem]] = [:]
        var refunds: [String: [String]] = [:]
        var historyPageSize = 20
        var failNext: [(status: Int, pathPrefix: String)] = []
        /// Every request is answered with this status until then (an outage).
        var downUntil: ContinuousClock.Instant?
        var downStatus = 503
        var requests: [RecordedRequest] = []
        var consumption: [ConsumptionCall] = []
        var testNotifications: [String: String] = [:]
        var testNotificationPayload: String?
        /// The next this-many requests are answered only after `stallFor` (to exercise client timeouts).
        var stallNext = 0
        /// Requests received (counted on arrival, before any stall).
        var arrivals = 0
        var stallFor: Duration = .zero
    }

    public let expectation: Expectation
    let state = Mutex(State())
    private let task: Mutex<Task<Void, any Error>?> = Mutex(nil)
    public let port: Int
    public var baseURL: String { "http://127.0.0.1:\(port)" }

    private init(expectation: Expectation, port: Int) {
        self.expectation = expectation
        self.port = port
    }

    /// Starts on 127.0.0.1 on a free port.
    public static func start(expecting expectation: Expectation) async throws -> AppleAPIStandIn {
        let holder = Holder()
        let router = Router()
        for method in [HTTPRequest.Method.get, .post, .put] {
            router.on("**", method: method) { request, _ -> Response in
                var request = request
                let body = (try? await request.collectBody(upTo: 1 << 20)).map { String(buffer: $0) } ?? ""
                guard let server = holder.value.withLock({ $0 }) else { return Response(status: .serviceUnavailable) }
                let stall = server.state.withLock { s -> Duration? in
                    s.arrivals += 1
                    guard s.stallNext > 0 else { return nil }
                    s.stallNext -= 1
                    return s.stallFor
                }
                if let stall { try? await Task.sleep(for: stall) }
                return server.handle(method: request.method.rawValue, path: request.uri.path, query: request.uri.query ?? "",
                                     authorization: request.headers[.authorization], body: body)
            }
        }
        let (ports, portSink) = AsyncStream.makeStream(of: Int.self)
        let app = Application(
            router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0), serverName: "appstore-api-stand-in"),
            onServerRunning: { channel in
                portSink.yield(channel.localAddress?.port ?? 0)
                portSink.finish()
            }, logger: quietLogger)
        let task = Task { defer { portSink.finish() }; try await app.runService() }
        var port = 0
        for await p in ports { port = p }
        guard port > 0 else {
            task.cancel()
            throw CocoaError(.fileWriteUnknown, userInfo: [NSLocalizedDescriptionKey: "stand-in did not bind a port"])
        }
        let server = AppleAPIStandIn(expectation: expectation, port: port)
        server.task.withLock { $0 = task }
        holder.value.withLock { $0 = server }
        return server
    }

    final class Holder: Sendable { let value = Mutex<AppleAPIStandIn?>(nil) }

    public func stop() async {
        let t = task.withLock { t in defer { t = nil }; return t }
        t?.cancel()
        _ = await t?.result
    }

    // MARK: scripting

    /// Notification history pages (each a list of `signedPayload`s); `throttlePage` gets one 429 first.
    public func setNotificationHistory(pages: [[String]], throttlePage: Int? = nil, retryAfter: String = "1") {
        state.withLock { s in
            s.notificationPages = pages
            s.throttlePage = throttlePage
            s.throttleRetryAfter = retryAfter
        }
    }

    /// A transaction history (signed transactions, oldest first) and, optionally, its status entry.
    public func addHistory(originalTransactionId: String, transactionIds: [String], signedTransactions: [String],
                           status: LastTransactionsItem? = nil, pageSize: Int = 20) {
        state.withLock { s in
            s.histories[originalTransactionId] = signedTransactions
            for id in transactionIds + [originalTransactionId] { s.transactionOwner[id] = originalTransactionId }
            if let status { s.statuses[originalTransactionId] = [status] }
            s.historyPageSize = pageSize
        }
    }

    /// The next `count` requests whose path starts with `pathPrefix` get `status` (e.g. 503).
    public func failNext(_ count: Int, status: Int, pathPrefix: String = "/") {
        state.withLock { s in s.failNext += Array(repeating: (status, pathPrefix), count: count) }
    }

    /// Every request is answered with `status` (503: Apple's "try again later") for the next `duration`.
    public func down(for duration: Duration, status: Int = 503) {
        state.withLock { s in
            s.downUntil = ContinuousClock.now + duration
            s.downStatus = status
        }
    }

    /// The next `count` requests are answered only after `duration`.
    public func stallNext(_ count: Int, for duration: Duration) {
        state.withLock { s in
            s.stallNext = count
            s.stallFor = duration
        }
    }

    /// Refunded transactions (signed, as Get Refund History returns them) of a history added with `addHistory`.
    public func setRefunds(originalTransactionId: String, signedTransactions: [String]) {
        state.withLock { $0.refunds[originalTransactionId] = signedTransactions }
    }

    /// What Get Test Notification Status returns for a requested test notification.
    public func setTestNotificationPayload(_ signedPayload: String) { state.withLock { $0.testNotificationPayload = signedPayload } }

    public var requests: [RecordedRequest] { state.withLock { $0.requests } }
    public var arrivals: Int { state.withLock { $0.arrivals } }
    public var consumptionCalls: [ConsumptionCall] { state.withLock { $0.consumption } }

    /// Send Consumption Information's path, before the transaction id.
    public static let consumptionPathPrefix = "/inApps/v2/transactions/consumption/"

    /// Send Consumption Information requests refused with 5xx or 429 (injected faults).
    public var consumptionRefusals: Int {
        requests.filter { $0.path.hasPrefix(Self.consumptionPathPrefix) && ($0.status >= 500 || $0.status == 429) }.count
    }
}
