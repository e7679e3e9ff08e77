import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1

/// A client of Apple's App Store Server API: ES256 bearer token on every request, typed endpoints, retries for 429
/// (honouring `Retry-After`), 5xx and network errors, a bound on concurrent requests and a per-request timeout.
/// It only fetches: the signed documents it returns are handed on unverified.
public final class AppStoreServerAPIClient: Sendable {
    public struct Configuration: Sendable {
        public var baseURL: String
        public var retry: RetryPolicy
        public var maxConcurrentRequests: Int
        public var requestTimeout: Duration
        /// Called before each retry with a short reason (for progress output).
        public var onRetry: (@Sendable (_ path: String, _ reason: String, _ delay: Duration) -> Void)?

        public init(baseURL: String, retry: RetryPolicy = RetryPolicy(), maxConcurrentRequests: Int = 4,
                    requestTimeout: Duration = .seconds(30),
                    onRetry: (@Sendable (_ path: String, _ reason: String, _ delay: Duration) -> Void)? = nil) {
            var url = baseURL
            while url.hasSuffix("/") { url.removeLast() }
            self.baseURL = url
            self.retry = retry
            self.maxConcurrentRequests = maxConcurrentRequests
            self.requestTimeout = requestTimeout
            self.onRetry = onRetry
        }

        public init(environment: APIEnvironment) { self.init(baseURL: environment.baseURL) }
    }

    public let configuration: Configuration
    public let signer: APITokenSigner
    private let http: HTTPClient
    private let limit: ConcurrencyLimit
    private let logger: Logger

    public init(credentials: APICredentials, configuration: Configuration, httpClient: HTTPClient = .shared,
                logger: Logger = Logger(label: "fleet.appstore-api")) {
        self.configuration = configuration
        self.signer = APITokenSigner(credentials: credentials)
        self.http = httpClient
        self.limit = ConcurrencyLimit(configuration.maxConcurrentRequests)
        self.logger = logger
    }

    // MARK: endpoints

    /// Get Notification History: one page (`paginationToken` from the previous page, nil for the first).
    public func notificationHistory(_ request: NotificationHistoryRequest, paginationToken: String? = nil) async throws(AppStoreServerAPIError)
        -> NotificationHistoryResponse
    {
        let body = try encode(request)
        return try await call(.POST, "/inApps/v1/notifications/history", query: paginationToken.map { [("paginationToken", $0)] } ?? [],
                              body: body)
    }

    /// Get Transaction History v2: one page (`revision` from the previous page, nil for the first).
    public func transactionHistory(transactionId: String, query: TransactionHistoryQuery = .init(), revision: String? = nil)
        async throws(AppStoreServerAPIError) -> HistoryResponse
    {
        try await call(.GET, try path("/inApps/v2/history/", transactionId), query: query.items(revision: revision))
    }

    /// Every page of Transaction History v2, in order.
    public func allTransactionHistory(transactionId: String, query: TransactionHistoryQuery = .init(),
                                      onPage: (HistoryResponse) async throws -> Void) async throws {
        var revision: String? = nil
        while true {
            let page = try await transactionHistory(transactionId: transactionId, query: query, revision: revision)
            try await onPage(page)
            guard page.hasMore else { return }
            guard let next = page.revision, next != revision else {
                throw AppStoreServerAPIError.malformedResponse(path: "/inApps/v2/history", reason: "hasMore without a new revision")
            }
            revision = next
        }
    }

    /// Get All Subscription Statuses.
    public func subscriptionStatuses(transactionId: String, status: [Int] = []) async throws(AppStoreServerAPIError) -> StatusResponse {
        try await call(.GET, try path("/inApps/v1/subscriptions/", transactionId), query: status.map { ("status", String($0)) })
    }

    /// Get Transaction Info.
    public func transactionInfo(transactionId: String) async throws(AppStoreServerAPIError) -> TransactionInfoResponse {
        try await call(.GET, try path("/inApps/v1/transactions/", transactionId))
    }

    /// Look Up Order ID.
    public func lookUpOrder(orderId: String) async throws(AppStoreServerAPIError) -> OrderLookupResponse {
        try await call(.GET, try path("/inApps/v1/lookup/", orderId))
    }

    /// Get Refund History (v2): one page.
    public func refundHistory(transactionId: String, revision: String? = nil) async throws(AppStoreServerAPIError) -> HistoryResponse {
        try await call(.GET, try path("/inApps/v2/refund/lookup/", transactionId), query: revision.map { [("revision", $0)] } ?? [])
    }

    /// Send Consumption Information (v2). Apple answers 202 with no body.
    public func sendConsumptionInformation(transactionId: String, _ request: ConsumptionRequest) async throws(AppStoreServerAPIError) {
        if let p = request.consumptionPercentage, !(0...100_000).contains(p) {
            throw .invalidRequest("consumptionPercentage \(p) outside 0...100000")
        }
        let _: Empty = try await call(.PUT, try path("/inApps/v2/transactions/consumption/", transactionId),
                                      body: try encode(request), expectBody: false)
    }

    /// Request a Test Notification.
    public func requestTestNotification() async throws(AppStoreServerAPIError) -> TestNotificationResponse {
        try await call(.POST, "/inApps/v1/notifications/test")
    }

    /// Get Test Notification Status.
    public func testNotificationStatus(token: String) async throws(AppStoreServerAPIError) -> TestNotificationStatusResponse {
        try await call(.GET, try path("/inApps/v1/notifications/test/", token))
    }

    // MARK: transport

    struct Empty: Decodable {}

    private func encode(_ value: some Encodable) throws(AppStoreServerAPIError) -> Data {
        do {
            let e = JSONEncoder()
            e.outputFormatting = [.sortedKeys]
            return try e.encode(value)
        } catch { throw .invalidRequest("cannot encode the body: \(error)") }
    }

    private func path(_ prefix: String, _ parameter: String) throws(AppStoreServerAPIError) -> String {
        let segment = try pathSegment(parameter)
        return prefix + segment
    }

    private func pathSegment(_ s: String) throws(AppStoreServerAPIError) -> String {
        guard !s.isEmpty, let e = s.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "-._~"))) else {
            throw .invalidRequest("empty or unencodable path parameter")
        }
        return e
    }

    private func url(_ path: String, _ query: [(String, String)]) -> String {
        guard !query.isEmpty else { return configuration.baseURL + path }
        let allowed = CharacterSet.alphanumerics.union(CharacterSet(charactersIn: "-._~"))
        let q = query.map { "\($0.0)=\($0.1.addingPercentEncoding(withAllowedCharacters: allowed) ?? "")" }.joined(separator: "&")
        return configuration.baseURL + path + "?" + q
    }

    private func call<T: Decodable>(_ method: HTTPMethod, _ path: String, query: [(String, String)] = [], body: Data? = nil,
                                    expectBody: Bool = true) async throws(AppStoreServerAPIError) -> T {
        let (status, data) = try await send(method, path, query: query, body: body)
        if !expectBody, let empty = Empty() as? T { _ = status; return empty }
        do {
            return try JSONDecoder().decode(T.self, from: data)
        } catch {
            throw .malformedResponse(path: path, reason: "\(error)")
        }
    }

    /// One logical request with retries; returns a 2xx status and its body or throws.
    private func send(_ method: HTTPMethod, _ path: String, query: [(String, String)], body: Data?) async throws(AppStoreServerAPIError)
        -> (Int, Data)
    {
        let policy = configuration.retry
        var attempt = 0
        var lastFailure = ""
        while attempt < policy.maxAttempts {
            attempt += 1
            var request = HTTPClientRequest(url: url(path, query))
            request.method = method
            request.headers.add(name: "Authorization", value: "Bearer \(signer.token())")
            request.headers.add(name: "Accept", value: "application/json")
            request.headers.add(name: "User-Agent", value: "entitlement-fleet")
            if let body {
                request.headers.add(name: "Content-Type", value: "application/json")
                request.body = .bytes(ByteBuffer(bytes: body))
            }
            let delay: Duration
            await limit.acquire()
            do {
                let response = try await http.execute(request, timeout: .nanoseconds(Int64(configuration.requestTimeout.components.seconds * 1_000_000_000
                    + configuration.requestTimeout.components.attoseconds / 1_000_000_000)))
                let buffer = try await response.body.collect(upTo: 64 * 1024 * 1024)
                limit.release()
                let status = Int(response.status.code)
                let data = Data(buffer.readableBytesView)
                if (200..<300).contains(status) { return (status, data) }
                let apiBody = try? JSONDecoder().decode(APIErrorBody.self, from: data)
                if status == 401 {
                    signer.reset()
                    let c = signer.credentials
                    throw AppStoreServerAPIError.unauthorized(keyId: c.keyId, issuerId: c.issuerId, bundleId: c.bundleId)
                }
                guard status == 429 || status >= 500 else {
                    throw AppStoreServerAPIError.api(status: status, errorCode: apiBody?.errorCode, errorMessage: apiBody?.errorMessage, path: path)
                }
                lastFailure = "HTTP \(status)" + (apiBody.map { " errorCode \($0.errorCode)" } ?? "")
                if status == 429, let ra = policy.retryAfter(response.headers.first(name: "Retry-After")) {
                    delay = ra
                } else {
                    delay = policy.backoff(afterAttempt: attempt)
                }
            } catch let e as AppStoreServerAPIError {
                throw e
            } catch {
                limit.release()
                lastFailure = "network error: \(error)"
                delay = policy.backoff(afterAttempt: attempt)
            }
            guard attempt < policy.maxAttempts else { break }
            logger.notice("App Store Server API retry", metadata: ["path": "\(path)", "reason": "\(lastFailure)", "delay": "\(delay)"])
            configuration.onRetry?(path, lastFailure, delay)
            do { try await Task.sleep(for: delay) } catch { throw .retriesExhausted(attempts: attempt, last: "cancelled", path: path) }
        }
        throw .retriesExhausted(attempts: attempt, last: lastFailure, path: path)
    }
}
