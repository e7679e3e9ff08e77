import AppStoreServerAPI
import AppStoreVerification
import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import NIOCore

extension AppleAPIStandIn {
    /// Checks a bearer token as Apple does; nil when valid, else the reason.
    public func tokenProblem(_ authorization: String?, now: Date = Date()) -> String? {
        guard let authorization, authorization.hasPrefix("Bearer ") else { return "no bearer token" }
        let token = authorization.dropFirst("Bearer ".count)
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else { return "not a compact JWS" }
        guard let hData = base64URLDecode(parts[0]), let cData = base64URLDecode(parts[1]), let sig = base64URLDecode(parts[2]),
              let header = (try? JSONSerialization.jsonObject(with: hData)) as? [String: Any],
              let claims = (try? JSONSerialization.jsonObject(with: cData)) as? [String: Any]
        else { return "undecodable token" }
        guard header["alg"] as? String == "ES256" else { return "alg is not ES256" }
        guard header["typ"] as? String == "JWT" else { return "typ is not JWT" }
        guard header["kid"] as? String == expectation.keyId else { return "unknown kid" }
        guard claims["iss"] as? String == expectation.issuerId else { return "wrong iss" }
        guard claims["aud"] as? String == "appstoreconnect-v1" else { return "wrong aud" }
        guard claims["bid"] as? String == expectation.bundleId else { return "wrong bid" }
        guard let iat = (claims["iat"] as? NSNumber)?.int64Value, let exp = (claims["exp"] as? NSNumber)?.int64Value else {
            return "iat/exp missing"
        }
        let nowS = Int64(now.timeIntervalSince1970)
        guard iat <= nowS + 60 else { return "iat in the future" }
        guard exp > nowS else { return "expired" }
        guard exp - iat <= 3600 else { return "lifetime over 60 minutes" }
        guard let signature = try? P256.Signing.ECDSASignature(rawRepresentation: sig),
              expectation.publicKey.isValidSignature(signature, for: Data((parts[0] + "." + parts[1]).utf8))
        else { return "bad signature" }
        return nil
    }

    func handle(method: String, path: String, query: String, authorization: String?, body: String) -> Response {
        let problem = tokenProblem(authorization)
        let (status, headers, payload) = problem == nil
            ? route(method: method, path: path, query: query, body: body) : (401, [], nil)
        state.withLock { s in
            s.requests.append(RecordedRequest(method: method, path: path, query: query, status: status, tokenProblem: problem, body: body))
        }
        var fields = HTTPFields()
        for (name, value) in headers { if let n = HTTPField.Name(name) { fields[n] = value } }
        var buffer = ByteBuffer()
        if let payload {
            fields[.contentType] = "application/json"
            buffer.writeBytes(payload)
        }
        return Response(status: .init(code: status), headers: fields, body: .init(byteBuffer: buffer))
    }

    private func json(_ value: some Encodable) -> Data {
        let e = JSONEncoder()
        e.outputFormatting = [.sortedKeys]
        return (try? e.encode(value)) ?? Data()
    }

    private func error(_ status: Int, _ code: Int, _ message: String) -> (Int, [(String, String)], Data?) {
        (status, [], json(APIErrorBody(errorCode: code, errorMessage: message)))
    }

    private func queryItems(_ query: String) -> [(String, String)] {
        query.split(separator: "&").map { item in
            let kv = item.split(separator: "=", maxSplits: 1).map { String($0).removingPercentEncoding ?? String($0) }
            return (kv[0], kv.count > 1 ? kv[1] : "")
        }
    }

    private func route(method: String, path: String, query: String, body: String) -> (Int, [(String, String)], Data?) {
        // Injected faults first.
        let fault: Int? = state.withLock { s in
            if let until = s.downUntil, ContinuousClock.now < until { return s.downStatus }
            guard let i = s.failNext.firstIndex(where: { path.hasPrefix($0.pathPrefix) }) else { return nil }
            return s.failNext.remove(at: i).status
        }
        if let fault {
            return fault == 429 ? (429, [("Retry-After", "1")], json(APIErrorBody(errorCode: 4290000, errorMessage: "Rate limit exceeded.")))
                : (fault, [], fault >= 500 ? json(APIErrorBody(errorCode: 5000000, errorMessage: "An unknown error occurred.")) : nil)
        }
        let segments = path.split(separator: "/").map(String.init)
        let q = queryItems(query)
        func param(_ name: String) -> String? { q.first { $0.0 == name }?.1 }

        /// The path parameters when `method` and the path match `pattern` ("*" is a parameter), else nil.
        func match(_ m: String, _ pattern: String) -> [String]? {
            let p = pattern.split(separator: "/").map(String.init)
            guard m == method, p.count == segments.count else { return nil }
            var params: [String] = []
            for (want, got) in zip(p, segments) {
                if want == "*" { params.append(got.removingPercentEncoding ?? got) } else if want != got { return nil }
            }
            return params
        }

        if match("POST", "/inApps/v1/notifications/history") != nil {
            guard let request = try? JSONDecoder().decode(NotificationHistoryRequest.self, from: Data(body.utf8)) else {
                return error(400, 4000000, "Invalid request.")
            }
            guard request.startDate < request.endDate else { return error(400, 4000017, "Invalid start date.") }
            var index = 0
            if let token = param("paginationToken") {
                guard token.hasPrefix("page-"), let i = Int(token.dropFirst(5)) else {
                    return error(400, 4000020, "Invalid pagination token.")
                }
                index = i
            }
            return state.withLock { s -> (Int, [(String, String)], Data?) in
                if s.throttlePage == index {
                    s.throttlePage = nil
                    return (429, [("Retry-After", s.throttleRetryAfter)], json(APIErrorBody(errorCode: 4290000, errorMessage: "Rate limit exceeded.")))
                }
                let pages = s.notificationPages
                let items = index < pages.count ? pages[index] : []
                let hasMore = index + 1 < pages.count
                let response = NotificationHistoryResponse(
                    notificationHistory: items.map { NotificationHistoryItem(signedPayload: $0, sendAttemptResults: [SendAttempt(attemptDate: 0, sendAttemptResult: "SUCCESS")]) },
                    hasMore: hasMore, paginationToken: hasMore ? "page-\(index + 1)" : nil)
                return (200, [], json(response))
            }

        }
        if let id = (match("GET", "/inApps/v2/history/*") ?? match("GET", "/inApps/v2/refund/lookup/*"))?.first {
            let refunds = segments[2] == "refund"
            return state.withLock { s -> (Int, [(String, String)], Data?) in
                guard let original = s.transactionOwner[id] else {
                    return (404, [], json(APIErrorBody(errorCode: AppStoreServerAPIError.transactionIdNotFound, errorMessage: "Transaction id not found.")))
                }
                let all = (refunds ? s.refunds[original] : s.histories[original]) ?? []
                let start = param("revision").flatMap { Int($0) } ?? 0
                guard start >= 0, start <= all.count else { return (400, [], json(APIErrorBody(errorCode: 4000005, errorMessage: "Invalid revision."))) }
                let ordered = param("sort") == "DESCENDING" ? Array(all.reversed()) : all
                let end = min(ordered.count, start + s.historyPageSize)
                let response = HistoryResponse(
                    revision: String(end), hasMore: end < ordered.count, bundleId: expectation.bundleId, appAppleId: nil,
                    environment: "Sandbox", signedTransactions: Array(ordered[start..<end]))
                return (200, [], json(response))
            }

        }
        if let id = match("GET", "/inApps/v1/subscriptions/*")?.first {
            return state.withLock { s -> (Int, [(String, String)], Data?) in
                guard let original = s.transactionOwner[id] else {
                    return (404, [], json(APIErrorBody(errorCode: AppStoreServerAPIError.transactionIdNotFound, errorMessage: "Transaction id not found.")))
                }
                let items = s.statuses[original] ?? []
                let response = StatusResponse(environment: "Sandbox", bundleId: expectation.bundleId, appAppleId: nil,
                                              data: items.isEmpty ? [] : [SubscriptionGroupStatus(subscriptionGroupIdentifier: "21000001", lastTransactions: items)])
                return (200, [], json(response))
            }

        }
        if let id = match("GET", "/inApps/v1/transactions/*")?.first {
            return state.withLock { s -> (Int, [(String, String)], Data?) in
                guard let original = s.transactionOwner[id], let history = s.histories[original],
                      let signed = history.first(where: { UnverifiedJWS.string($0, "transactionId") == id }) ?? history.last
                else {
                    return (404, [], json(APIErrorBody(errorCode: AppStoreServerAPIError.transactionIdNotFound, errorMessage: "Transaction id not found.")))
                }
                return (200, [], json(TransactionInfoResponse(signedTransactionInfo: signed)))
            }

        }
        if let orderId = match("GET", "/inApps/v1/lookup/*")?.first {
            return state.withLock { s -> (Int, [(String, String)], Data?) in
                let signed = s.histories[orderId] ?? []
                return (200, [], json(OrderLookupResponse(status: signed.isEmpty ? 1 : 0, signedTransactions: signed)))
            }

        }
        if let id = match("PUT", Self.consumptionPathPrefix + "*")?.first {
            guard let request = try? JSONDecoder().decode(ConsumptionRequest.self, from: Data(body.utf8)) else {
                return error(400, 4000000, "Invalid request.")
            }
            return state.withLock { s -> (Int, [(String, String)], Data?) in
                guard s.transactionOwner[id] != nil else {
                    return (404, [], json(APIErrorBody(errorCode: AppStoreServerAPIError.transactionIdNotFound, errorMessage: "Transaction id not found.")))
                }
                s.consumption.append(ConsumptionCall(transactionId: id, body: request))
                return (202, [], nil)
            }

        }
        if match("POST", "/inApps/v1/notifications/test") != nil {
            return state.withLock { s -> (Int, [(String, String)], Data?) in
                let token = UUID().uuidString.lowercased() + "_" + String(Int(Date().timeIntervalSince1970))
                s.testNotifications[token] = s.testNotificationPayload
                return (200, [], json(TestNotificationResponse(testNotificationToken: token)))
            }

        }
        if let token = match("GET", "/inApps/v1/notifications/test/*")?.first {
            return state.withLock { s -> (Int, [(String, String)], Data?) in
                guard let payload = s.testNotifications[token] else {
                    return (404, [], json(APIErrorBody(errorCode: AppStoreServerAPIError.testNotificationNotFound, errorMessage: "Test notification not found.")))
                }
                return (200, [], json(TestNotificationStatusResponse(
                    signedPayload: payload, sendAttemptResults: [SendAttempt(attemptDate: EpochMillis.now(), sendAttemptResult: "SUCCESS")])))
            }
        }
        return (404, [], nil)
    }
}
