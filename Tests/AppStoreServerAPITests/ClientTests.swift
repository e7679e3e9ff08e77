import AppStoreVerification
import Crypto
import Foundation
import FleetTestPKI
import FleetDevStack
import FleetTestSupport
import Testing

@testable import AppStoreServerAPI

enum API {
    static let pki = try! TestPKI()
    static let keyId = "KEY1234567"
    static let issuerId = "57246542-96fe-1a63-e053-0824d011072a"
    static let bundleId = TestPayloads.bundleId

    static func standIn(_ key: P256.Signing.PrivateKey) async throws -> AppleAPIStandIn {
        try await AppleAPIStandIn.start(expecting: .init(keyId: keyId, issuerId: issuerId, bundleId: bundleId, publicKey: key.publicKey))
    }

    static func client(_ key: P256.Signing.PrivateKey, _ server: AppleAPIStandIn, keyId: String = API.keyId,
                       retry: RetryPolicy = RetryPolicy(maxAttempts: 4, baseDelay: .milliseconds(20), maxDelay: .milliseconds(200)),
                       concurrency: Int = 4, timeout: Duration = .seconds(30)) -> AppStoreServerAPIClient {
        AppStoreServerAPIClient(
            credentials: APICredentials(keyId: keyId, issuerId: issuerId, bundleId: bundleId, privateKey: key),
            configuration: .init(baseURL: server.baseURL + "/", retry: retry, maxConcurrentRequests: concurrency, requestTimeout: timeout))
    }

    static func verifier() -> SignedDataVerifier {
        SignedDataVerifier(policy: try! pki.policy(), chainCache: ChainCache(capacity: 16))
    }

    static func decodeSegment(_ s: Substring) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: base64URLDecode(s)!)) as? [String: Any] ?? [:]
    }
}

@Suite struct TokenTests {
    @Test func tokenHasApplesShapeVerifiesAndIsReused() throws {
        let key = P256.Signing.PrivateKey()
        let signer = APITokenSigner(credentials: APICredentials(keyId: API.keyId, issuerId: API.issuerId, bundleId: API.bundleId, privateKey: key))
        let now = Date()
        let token = signer.token(now: now)
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        #expect(parts.count == 3)
        let header = API.decodeSegment(parts[0]), claims = API.decodeSegment(parts[1])
        #expect(header["alg"] as? String == "ES256")
        #expect(header["kid"] as? String == API.keyId)
        #expect(header["typ"] as? String == "JWT")
        #expect(claims["iss"] as? String == API.issuerId)
        #expect(claims["aud"] as? String == "appstoreconnect-v1")
        #expect(claims["bid"] as? String == API.bundleId)
        let iat = (claims["iat"] as! NSNumber).int64Value, exp = (claims["exp"] as! NSNumber).int64Value
        #expect(iat == Int64(now.timeIntervalSince1970))
        #expect(exp > iat && exp - iat <= 3600)
        let sig = try P256.Signing.ECDSASignature(rawRepresentation: base64URLDecode(parts[2])!)
        #expect(key.publicKey.isValidSignature(sig, for: Data((parts[0] + "." + parts[1]).utf8)))
        #expect(!P256.Signing.PrivateKey().publicKey.isValidSignature(sig, for: Data((parts[0] + "." + parts[1]).utf8)))
        // Reused until shortly before expiry, then renewed.
        #expect(signer.token(now: now.addingTimeInterval(60)) == token)
        let later = signer.token(now: now.addingTimeInterval(signer.lifetime - signer.renewBefore + 1))
        #expect(later != token)
    }

    @Test func theKeyNeverShowsInDescriptionsOrErrors() throws {
        let (key, pem) = StandInFixtures.apiKey()
        let creds = try APICredentials(keyId: "K", issuerId: "I", bundleId: "B", privateKeyPEM: pem)
        #expect(creds.privateKey.rawRepresentation == key.rawRepresentation)
        let body = pem.split(separator: "\n")[1]
        #expect(!"\(creds)".contains(body))
        #expect("\(creds)".contains("<redacted>"))
        let garbled = pem.replacingOccurrences(of: String(body.prefix(10)), with: "AAAAAAAAAA")
        do {
            _ = try APICredentials(keyId: "K", issuerId: "I", bundleId: "B", privateKeyPEM: garbled, source: "/run/secrets/key.p8")
            Issue.record("a corrupted key was accepted")
        } catch {
            #expect(error == .invalidKey(source: "/run/secrets/key.p8"))
            #expect(!"\(error)".contains(body.suffix(20)))
        }
        #expect(throws: CredentialError.unreadableKeyFile(path: "/nonexistent/key.p8")) {
            try APICredentials(keyId: "K", issuerId: "I", bundleId: "B", privateKeyPath: "/nonexistent/key.p8")
        }
        #expect(throws: CredentialError.missing("key id")) {
            try APICredentials(keyId: "", issuerId: "I", bundleId: "B", privateKeyPEM: pem)
        }
    }

    @Test func retryAfterAndBackoff() {
        let p = RetryPolicy(maxAttempts: 5, baseDelay: .milliseconds(100), maxDelay: .seconds(1), maxRetryAfter: .seconds(60))
        #expect(p.retryAfter("3") == .seconds(3))
        #expect(p.retryAfter("600") == .seconds(60), "capped")
        #expect(p.retryAfter(nil) == nil)
        #expect(p.retryAfter("soon") == nil)
        let now = Date(timeIntervalSince1970: 1_700_000_000)
        #expect(p.retryAfter("Tue, 14 Nov 2023 22:13:30 GMT", now: now) == .seconds(10))
        for attempt in 1...10 {
            let d = p.backoff(afterAttempt: attempt)
            let ceiling = min(Duration.seconds(1), .milliseconds(100) * (1 << (attempt - 1)))
            #expect(d <= ceiling && d >= ceiling / 2, "attempt \(attempt): \(d)")
        }
    }

    @Test func concurrencyLimitNeverAdmitsMoreThanItsBound() async {
        let limit = ConcurrencyLimit(2)
        let peak = LockedValue((now: 0, max: 0))
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<20 {
                group.addTask {
                    await limit.acquire()
                    peak.withLock { $0.now += 1; $0.max = max($0.max, $0.now) }
                    try? await Task.sleep(for: .milliseconds(5))
                    peak.withLock { $0.now -= 1 }
                    limit.release()
                }
            }
        }
        #expect(peak.withLock { $0.max } == 2)
    }
}

@Suite struct ClientAgainstStandInTests {
    @Test func notificationHistoryPagesWithOne429AreFetchedExactly() async throws {
        let key = P256.Signing.PrivateKey()
        let server = try await API.standIn(key)
        let pages = StandInFixtures.notificationPages(pki: API.pki, pages: 3, perPage: 4)
        server.setNotificationHistory(pages: pages, throttlePage: 1)
        let client = API.client(key, server)
        var got: [String] = []
        var token: String? = nil
        var fetched = 0
        let request = NotificationHistoryRequest(startDate: 1, endDate: TestPayloads.nowMillis())
        repeat {
            let page = try await client.notificationHistory(request, paginationToken: token)
            fetched += 1
            got += page.notificationHistory.map(\.signedPayload)
            token = page.hasMore ? page.paginationToken : nil
        } while token != nil
        await server.stop()
        #expect(fetched == 3)
        #expect(got == pages.flatMap { $0 })
        let log = server.requests
        #expect(log.count == 4, "3 pages + the throttled one retried once")
        #expect(log.map(\.status) == [200, 429, 200, 200])
        #expect(log.allSatisfy { $0.tokenProblem == nil })
        #expect(log[1].query == log[2].query, "the throttled page is asked again with the same token")
        let verifier = API.verifier()
        for jws in got { #expect(throws: Never.self) { try verifier.verifyNotification(jws) } }
    }

    @Test func wrongKeyIsRefusedWithAClearErrorAndNotRetried() async throws {
        let key = P256.Signing.PrivateKey()
        let server = try await API.standIn(key)
        server.setNotificationHistory(pages: [[]])
        let client = API.client(P256.Signing.PrivateKey(), server)
        await #expect(throws: AppStoreServerAPIError.unauthorized(keyId: API.keyId, issuerId: API.issuerId, bundleId: API.bundleId)) {
            _ = try await client.notificationHistory(.init(startDate: 1, endDate: 2))
        }
        let wrongKid = API.client(key, server, keyId: "OTHERKEY00")
        await #expect(throws: AppStoreServerAPIError.self) { _ = try await wrongKid.transactionInfo(transactionId: "1") }
        await server.stop()
        #expect(server.requests.map(\.tokenProblem) == ["bad signature", "unknown kid"])
        let message = AppStoreServerAPIError.unauthorized(keyId: "K", issuerId: "I", bundleId: "B").description
        #expect(message.contains("key id 'K'") && message.contains("401"))
    }

    @Test func fiveHundredsAreRetriedAndGiveUpAfterMaxAttempts() async throws {
        let key = P256.Signing.PrivateKey()
        let server = try await API.standIn(key)
        let h = StandInFixtures.subscriptionHistory(pki: API.pki, count: 3)
        server.addHistory(originalTransactionId: h.originalTransactionId, transactionIds: h.transactionIds, signedTransactions: h.signedTransactions)
        server.failNext(2, status: 503)
        let client = API.client(key, server)
        let info = try await client.transactionInfo(transactionId: h.transactionIds[1])
        #expect(info.signedTransactionInfo == h.signedTransactions[1])
        server.failNext(10, status: 500)
        do {
            _ = try await client.transactionInfo(transactionId: h.transactionIds[1])
            Issue.record("expected retries to be exhausted")
        } catch {
            guard case .retriesExhausted(let attempts, let last, _) = error else { Issue.record("\(error)"); return }
            #expect(attempts == 4)
            #expect(last.contains("500"))
            #expect(error.isRetryable)
        }
        await server.stop()
        #expect(server.requests.map(\.status) == [503, 503, 200, 500, 500, 500, 500])
    }

    @Test func anOutageOfTheStandInRefusesEverythingUntilItEnds() async throws {
        let key = P256.Signing.PrivateKey()
        let server = try await API.standIn(key)
        let h = StandInFixtures.subscriptionHistory(pki: API.pki, count: 2)
        server.addHistory(originalTransactionId: h.originalTransactionId, transactionIds: h.transactionIds, signedTransactions: h.signedTransactions)
        server.down(for: .seconds(30))
        let client = API.client(key, server)
        do {
            _ = try await client.transactionInfo(transactionId: h.transactionIds[0])
            Issue.record("answered during the outage")
        } catch {
            guard case .retriesExhausted(_, let last, _) = error else { Issue.record("\(error)"); return }
            #expect(last.contains("503"))
        }
        #expect(!server.requests.isEmpty && server.requests.allSatisfy { $0.status == 503 })
        server.down(for: .zero)
        let info = try await client.transactionInfo(transactionId: h.transactionIds[0])
        #expect(info.signedTransactionInfo == h.signedTransactions[0])
        await server.stop()
    }

    @Test func notFoundIsATypedErrorWithApplesCodeAndNotRetried() async throws {
        let key = P256.Signing.PrivateKey()
        let server = try await API.standIn(key)
        let client = API.client(key, server)
        await #expect(throws: AppStoreServerAPIError.api(status: 404, errorCode: 4040010, errorMessage: "Transaction id not found.",
                                                          path: "/inApps/v2/history/999")) {
            _ = try await client.transactionHistory(transactionId: "999")
        }
        await server.stop()
        #expect(server.requests.count == 1)
    }

    @Test func longTransactionHistoryAndStatusesArriveInFull() async throws {
        let key = P256.Signing.PrivateKey()
        let server = try await API.standIn(key)
        let h = StandInFixtures.subscriptionHistory(pki: API.pki, count: 45)
        server.addHistory(originalTransactionId: h.originalTransactionId, transactionIds: h.transactionIds,
                          signedTransactions: h.signedTransactions, status: h.status)
        let client = API.client(key, server)
        var got: [String] = []
        var pages = 0
        try await client.allTransactionHistory(transactionId: h.transactionIds[10]) { page in
            pages += 1
            got += page.signedTransactions
        }
        #expect(pages == 3)
        #expect(got == h.signedTransactions)
        let status = try await client.subscriptionStatuses(transactionId: h.originalTransactionId)
        #expect(status.data.first?.lastTransactions == [h.status])
        let order = try await client.lookUpOrder(orderId: "NOPE")
        #expect(order.status == 1 && order.signedTransactions.isEmpty)
        await server.stop()
        #expect(server.requests.allSatisfy { $0.tokenProblem == nil })
        #expect(server.requests.first?.query.contains("sort=ASCENDING") == true)
        let verifier = API.verifier()
        for jws in got { #expect(throws: Never.self) { try verifier.verifyTransaction(jws) } }
    }

    @Test func consumptionInformationIsSentAsApplesV2Body() async throws {
        let key = P256.Signing.PrivateKey()
        let server = try await API.standIn(key)
        let h = StandInFixtures.subscriptionHistory(pki: API.pki, count: 1)
        server.addHistory(originalTransactionId: h.originalTransactionId, transactionIds: h.transactionIds, signedTransactions: h.signedTransactions)
        let client = API.client(key, server)
        let body = ConsumptionRequest(customerConsented: true, deliveryStatus: .delivered, consumptionPercentage: 25_000, refundPreference: .decline)
        try await client.sendConsumptionInformation(transactionId: h.originalTransactionId, body)
        await #expect(throws: AppStoreServerAPIError.invalidRequest("consumptionPercentage 100001 outside 0...100000")) {
            try await client.sendConsumptionInformation(transactionId: h.originalTransactionId,
                                                        .init(customerConsented: false, deliveryStatus: .delivered, consumptionPercentage: 100_001))
        }
        await server.stop()
        #expect(server.consumptionCalls == [.init(transactionId: h.originalTransactionId, body: body)])
        #expect(server.requests.first?.method == "PUT")
        #expect(server.requests.first?.body.contains(#""deliveryStatus":"DELIVERED""#) == true)
    }

    @Test func aStalledRequestTimesOutAndIsRetried() async throws {
        let key = P256.Signing.PrivateKey()
        let server = try await API.standIn(key)
        let h = StandInFixtures.subscriptionHistory(pki: API.pki, count: 2)
        server.addHistory(originalTransactionId: h.originalTransactionId, transactionIds: h.transactionIds, signedTransactions: h.signedTransactions)
        server.setRefunds(originalTransactionId: h.originalTransactionId, signedTransactions: [h.signedTransactions[1]])
        // The stalled attempt outlasts the timeout by far; the timeout leaves the retries room on a loaded machine
        // (at 1 s, four attempts all timed out under CI load).
        server.stallNext(1, for: .seconds(12))
        let client = API.client(key, server, timeout: .seconds(4))
        let refunds = try await client.refundHistory(transactionId: h.transactionIds[0])
        #expect(refunds.signedTransactions == [h.signedTransactions[1]])
        #expect(refunds.hasMore == false)
        #expect(server.arrivals == 2, "the stalled attempt was abandoned at the timeout and retried")
        server.stallNext(10, for: .seconds(3))
        let failing = API.client(key, server, retry: RetryPolicy(maxAttempts: 2, baseDelay: .milliseconds(10)), timeout: .milliseconds(500))
        do {
            _ = try await failing.refundHistory(transactionId: h.transactionIds[0])
            Issue.record("expected a timeout")
        } catch {
            guard case .retriesExhausted(let attempts, let last, _) = error else { Issue.record("\(error)"); return }
            #expect(attempts == 2)
            #expect(last.contains("network error"), "\(last)")
        }
        await server.stop()
    }

    @Test func testNotificationRoundTrip() async throws {
        let key = P256.Signing.PrivateKey()
        let server = try await API.standIn(key)
        let payload = API.pki.signNotification(type: .test)
        server.setTestNotificationPayload(payload)
        let client = API.client(key, server)
        let token = try await client.requestTestNotification().testNotificationToken
        let status = try await client.testNotificationStatus(token: token)
        #expect(status.signedPayload == payload)
        #expect(status.sendAttemptResults?.first?.sendAttemptResult == "SUCCESS")
        await #expect(throws: AppStoreServerAPIError.self) { _ = try await client.testNotificationStatus(token: "unknown") }
        await server.stop()
    }
}
