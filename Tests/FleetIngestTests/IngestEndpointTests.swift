import AppStoreVerification
import FleetIngest
import FleetIngestClient
import FleetKafka
import FleetTestPKI
import FleetTestSupport
import Foundation
import Testing

@Suite("fleet ingest endpoints", .serialized)
struct IngestEndpointTests {
    static let notifications = "/apple/notifications"
    static let transactions = "/v1/transactions"

    @Test("300 concurrent notifications: all 200 after the report, all on the topic byte for byte, keyed by notificationUUID")
    func concurrentNotifications() async throws {
        let h = try await IngestHarness()
        let pki = IngestHarness.pki
        let uuids = (0..<300).map { _ in UUID().uuidString.lowercased() }
        // Unknown keys Apple may add are accepted and kept.
        let bodies = uuids.enumerated().map { i, uuid in
            notificationBody(pki.signNotification(type: .didRenew, transaction: TestPayloads.transaction(), notificationUUID: uuid),
                             extra: i % 2 == 0 ? ",\"futureKey\":{\"a\":[1,2]}" : "")
        }
        let statuses = try await concurrently(bodies.count, threads: 16) { i, conn in
            if conn == nil { conn = try h.connect() }
            return try conn!.postJSON(Self.notifications, bodies[i]).status
        }
        #expect(statuses.allSatisfy { $0 == 200 }, "statuses: \(Dictionary(grouping: statuses, by: { $0 }).mapValues(\.count))")
        let messages = try await h.read(atLeast: bodies.count)
        #expect(messages.count == bodies.count)
        let byKey = Dictionary(messages.map { (String(decoding: $0.key ?? [], as: UTF8.self), $0.value) }, uniquingKeysWith: { a, _ in a })
        for (i, uuid) in uuids.enumerated() {
            #expect(byKey[uuid] == bodies[i], "notification \(i) not on the topic byte for byte")
        }
        await h.stop()
    }

    @Test("bad input: 400 with a reason, 413, 415 (type or encoding), 405; nothing published; the server keeps serving")
    func badInput() async throws {
        let h = try await IngestHarness()
        let pki = IngestHarness.pki
        let good = notificationBody(pki.signNotification(type: .test))
        let cases: [(name: String, body: [UInt8], status: Int, reason: String)] = [
            ("not JSON", Array("hello".utf8), 400, "not_json"),
            ("truncated JSON", Array(good.dropLast(7)), 400, "not_json"),
            ("empty body", [], 400, "not_json"),
            ("array", Array("[1,2]".utf8), 400, "not_an_object"),
            ("no signedPayload", Array("{\"payload\":\"x\"}".utf8), 400, "missing_signed_payload"),
            ("signedPayload a number", Array("{\"signedPayload\":42}".utf8), 400, "signed_payload_not_a_string"),
            ("signedPayload null", Array("{\"signedPayload\":null}".utf8), 400, "signed_payload_not_a_string"),
            ("signedPayload empty", Array("{\"signedPayload\":\"\"}".utf8), 400, "empty_signed_payload"),
            ("deeply nested", Array((String(repeating: "[", count: 5000) + String(repeating: "]", count: 5000)).utf8), 400, "not_json"),
            ("invalid UTF-8", [0x7B, 0x22, 0xFF, 0xFE, 0x22, 0x3A, 0x31, 0x7D], 400, "*"),
        ]
        let results = try await onThread { () -> [(Int, String)] in
            let c = try h.connect()
            return try cases.map { k in
                let r = try c.postJSON(Self.notifications, k.body)
                return (r.status, (json(r)["error"] as? String) ?? "")
            }
        }
        for (k, r) in zip(cases, results) {
            #expect(r.0 == k.status, "\(k.name): status \(r.0)")
            #expect(k.reason == "*" ? !r.1.isEmpty : r.1 == k.reason, "\(k.name): reason \(r.1)")
        }
        // Transactions endpoint: wrong types and missing input.
        let txCases: [(String, String)] = [
            ("{}", "missing_input"),
            ("{\"signedTransaction\":1}", "signed_transaction_not_a_string"),
            ("{\"receipt-data\":[\"x\"]}", "receipt_data_not_a_string"),
            ("{\"signedTransaction\":\"a.b.c\",\"receipt-data\":\"MIIx\"}", "ambiguous_input"),
            ("{\"signedTransaction\":\"a.b.c\",\"deviceVerificationId\":7}", "device_verification_id_not_a_string"),
            ("{\"signedTransaction\":\"a.b.c\",\"appAccountToken\":false}", "app_account_token_not_a_string"),
        ]
        let txResults = try await onThread { () -> [(Int, String)] in
            let c = try h.connect()
            return try txCases.map { body, _ in
                let r = try c.postJSON(Self.transactions, Array(body.utf8))
                return (r.status, (json(r)["error"] as? String) ?? "")
            }
        }
        for (k, r) in zip(txCases, txResults) {
            #expect(r.0 == 400 && r.1 == k.1, "\(k.0): \(r)")
        }
        // Content type, method, size.
        let other = try await onThread { () -> [Int] in
            var out: [Int] = []
            out.append(try h.connect().request("POST", Self.notifications, headers: [("Content-Type", "text/plain")], body: good).status)
            out.append(try h.connect().request("POST", Self.notifications, headers: [("Content-Type", "application/x-www-form-urlencoded")], body: good).status)
            let gzip = try h.connect().request("POST", Self.notifications, headers: [("Content-Type", "application/json"), ("Content-Encoding", "gzip")], body: good)
            out.append(gzip.status)
            out.append(json(gzip)["error"] as? String == "unsupported_content_encoding" ? 1 : 0)
            out.append(try h.connect().request("POST", Self.notifications, headers: [("Content-Type", "application/json"), ("Content-Encoding", "identity")], body: Array("[]".utf8)).status)
            let get = try h.connect().request("GET", Self.notifications)
            out.append(get.status)
            out.append(get.header("Allow") == "POST" ? 1 : 0)
            // 5 MiB sent whole (as most HTTP libraries do): 413 from the declared length, the rest discarded unread
            // (never buffered), and the connection still serves the next request.
            let huge = [UInt8](repeating: UInt8(ascii: "a"), count: 5 * 1024 * 1024)
            let c = try h.connect()
            out.append(try c.postJSON(Self.notifications, huge).status)
            out.append(try c.postJSON(Self.notifications, Array("[]".utf8)).status)
            // 64 MiB declared: refused from the header and the connection closed (the body is not read at all).
            let c1 = try h.connect()
            try c1.send(raw: Array("POST \(Self.notifications) HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: \(64 << 20)\r\n\r\n".utf8))
            out.append(try c1.readResponse().status)
            out.append(c1.isOpen ? 0 : 1)
            // Chunked, no length: refused once the bound is passed.
            let c2 = try h.connect()
            try c2.send(raw: Array("POST \(Self.notifications) HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".utf8))
            let chunk = [UInt8](repeating: UInt8(ascii: "b"), count: 16 * 1024)
            var status = 0
            // Five 16 KiB chunks pass the 64 KiB bound with the last one (all of it read, so the close is clean).
            for _ in 0..<5 {
                do { try c2.send(raw: Array((String(chunk.count, radix: 16) + "\r\n").utf8) + chunk + [13, 10]) } catch { break }
            }
            if let r2 = try? c2.readResponse() { status = r2.status }
            out.append(status)
            return out
        }
        #expect(other == [415, 415, 415, 1, 400, 405, 1, 413, 400, 413, 1, 413], "\(other)")
        // Still serving; exactly the one good body reached the topic.
        let ok = try await onThread { try h.connect().postJSON(Self.notifications, good).status }
        #expect(ok == 200)
        let messages = try await h.read(atLeast: 1)
        #expect(messages.count == 1)
        #expect(messages.first?.value == good)
        await h.stop()
    }

    @Test("/v1/transactions: valid → 200 verified with events, forged → 422 with a reason, both published with headers")
    func transactionsVerifiedInline() async throws {
        let h = try await IngestHarness()
        let pki = IngestHarness.pki
        let txId = "2000000123456789"
        let valid = pki.sign(TestPayloads.transaction(productId: "com.example.fleet.premium.monthly", transactionId: txId))
        let forged = try TestPKI.forged().sign(TestPayloads.transaction(transactionId: "2000000999999999"))
        let receipt = Array("{\"receipt-data\":\"MIIT0QYJKoZIhvcNAQcCoIITwjCCE74CAQExCzAJBgUrDgMCGgUAMIIDcgYJKoZIhvcNAQcBoIIDYwSCA18xggNbMAoCAQgCAQEEAhYAMAoCARQCAQEEAgwAMAsCAQECAQEEAwIBADALAgELAgEBBAMCAQAwCwIBDwIBAQQDAgEAMAsCARACAQEEAwIBADALAgEZAgEBBAMCAQMwDAIBCgIBAQQEFgI0KzAMAgEOAgEBBAQCAgDnMA0CAQ0CAQEEBQIDAf8/\"}".utf8)
        let results = try await onThread { () -> [HTTPResult] in
            let c = try h.connect()
            return [
                try c.postJSON(Self.transactions, Array("{\"signedTransaction\":\"\(valid)\",\"appAccountToken\":\"6f1a7c2e-1111-4a4a-8b8b-1234567890ab\"}".utf8)),
                try c.postJSON(Self.transactions, Array("{\"signedTransaction\":\"\(forged)\"}".utf8)),
                try c.postJSON(Self.transactions, receipt),
                try c.postJSON(Self.transactions, Array("{\"signedTransaction\":\"\(valid)\",\"deviceVerificationId\":\"another-device\"}".utf8)),
            ]
        }
        let ok = json(results[0])
        #expect(results[0].status == 200, "\(results[0].text)")
        #expect(ok["verdict"] as? String == "verified")
        #expect(ok["kind"] as? String == "transaction")
        #expect(ok["transactionIds"] as? [String] == [txId])
        let events = ok["events"] as? [[String: Any]] ?? []
        #expect(!events.isEmpty)
        #expect(events.first?["productId"] as? String == "com.example.fleet.premium.monthly")
        #expect(events.first?["effect"] as? String != nil)
        #expect(events.first?["validUntil"] as? NSNumber != nil)
        let rejected = json(results[1])
        #expect(results[1].status == 422, "\(results[1].text)")
        #expect(rejected["verdict"] as? String == "rejected")
        #expect(rejected["reason"] as? String == RejectionReason.untrustedChain.rawValue)
        #expect((rejected["detail"] as? String)?.isEmpty == false)
        #expect(results[2].status == 422)
        // Today the core answers LEGACY_RECEIPT_UNSUPPORTED; once it verifies receipts, this made-up one is still rejected.
        #expect((json(results[2])["reason"] as? String)?.isEmpty == false, "\(results[2].text)")
        #expect(results[3].status == 422)
        #expect(json(results[3])["reason"] as? String == "DEVICE_VERIFICATION_MISMATCH", "\(results[3].text)")
        let messages = try await h.read(atLeast: 4)
        #expect(messages.count == 4)
        let values = Set(messages.map(\.value))
        #expect(values.contains(Array(valid.utf8)), "the bare JWS of signedTransaction is published")
        #expect(values.contains(Array(forged.utf8)))
        #expect(values.contains(receipt), "a receipt body is published unchanged")
        #expect(messages.contains { header($0, "device-verification-id") == "another-device" && $0.value == Array(valid.utf8) })
        #expect(messages.contains { header($0, "app-account-token") == "6f1a7c2e-1111-4a4a-8b8b-1234567890ab" })
        await h.stop()
    }

    @Test("a transaction answered in front of Hummingbird (TransactionFastPath) and one answered by the route agree: status, fields, body")
    func fastPathAndRouteAgree() async throws {
        let h = try await IngestHarness()
        let pki = IngestHarness.pki
        let valid = Array("{\"signedTransaction\":\"\(pki.sign(TestPayloads.transaction(transactionId: "2000000000000777")))\"}".utf8)
        let forged = Array("{\"signedTransaction\":\"\(try TestPKI.forged().sign(TestPayloads.transaction()))\"}".utf8)
        let bad = Array("{\"signedTransaction\":1}".utf8)
        let pairs = try await onThread { () -> [(fast: HTTPResult, route: HTTPResult)] in
            let c = try h.connect()
            // `Connection: keep-alive` changes nothing for HTTP/1.1, but the fast path leaves every request with a
            // Connection field to the route.
            return try [valid, forged, bad].map { body in
                (try c.postJSON(Self.transactions, body), try c.postJSON(Self.transactions, body, headers: [("Connection", "keep-alive")]))
            }
        }
        for (fast, route) in pairs {
            #expect(fast.status == route.status)
            #expect(fast.text == route.text)
            let names = { (r: HTTPResult) in Set(r.headers.map { $0.name.lowercased() }) }
            #expect(names(fast) == names(route), "fields \(fast.headers) against \(route.headers)")
            for name in ["content-type", "content-length", "server"] { #expect(fast.header(name) == route.header(name), "\(name)") }
        }
        #expect(pairs.map(\.fast.status) == [200, 422, 400])
        await h.stop()
    }

    @Test("bearer token on /v1/transactions (401 otherwise); the Apple endpoint stays open")
    func bearerToken() async throws {
        let token = "s3cret-token-0123456789abcdef"
        let h = try await IngestHarness { $0.apiToken = Array(token.utf8) }
        let pki = IngestHarness.pki
        let body = Array("{\"signedTransaction\":\"\(pki.sign(TestPayloads.transaction()))\"}".utf8)
        let statuses = try await onThread { () -> [Int] in
            let c = try h.connect()
            var out = [try c.postJSON(Self.transactions, body).status]
            out.append(try c.postJSON(Self.transactions, body, headers: [("Authorization", "Bearer wrong-token-0123456789abcdef")]).status)
            out.append(try c.postJSON(Self.transactions, body, headers: [("Authorization", "Bearer " + token + "x")]).status)
            out.append(try c.postJSON(Self.transactions, body, headers: [("Authorization", "Basic " + token)]).status)
            out.append(try c.postJSON(Self.transactions, body, headers: [("Authorization", "Bearer " + token)]).status)
            out.append(try c.postJSON(Self.notifications, notificationBody(pki.signNotification(type: .test))).status)
            return out
        }
        #expect(statuses == [401, 401, 401, 401, 200, 200], "\(statuses)")
        let messages = try await h.read(atLeast: 2)
        #expect(messages.count == 2)
        await h.stop()
    }

    @Test("Expect: 100-continue: 100 before the body is sent; a request refused first gets only its answer and is closed; HTTP/1.0 ignores it")
    func expectContinue() async throws {
        let h = try await IngestHarness()
        let pki = IngestHarness.pki
        let body = Array("{\"signedTransaction\":\"\(pki.sign(TestPayloads.transaction()))\"}".utf8)
        @Sendable func head(_ path: String, version: String = "1.1", type: String = "application/json", length: Int, expect: String = "100-Continue") -> [UInt8] {
            Array("POST \(path) HTTP/\(version)\r\nHost: x\r\nContent-Type: \(type)\r\nContent-Length: \(length)\r\nExpect: \(expect)\r\n\r\n".utf8)
        }
        let (r, stillOpen) = try await onThread { () -> ([String: HTTPResult], [String: Bool]) in
            var out: [String: HTTPResult] = [:], open: [String: Bool] = [:]
            // The head alone: the server asks for the body (the client would wait 1 s or more otherwise), then answers.
            let c = try h.connect()
            try c.send(raw: head(Self.transactions, length: body.count))
            out["interim"] = try c.readResponse()
            try c.send(raw: body)
            out["final"] = try c.readResponse()
            // The connection is kept: the next request on it is served.
            out["next"] = try c.postJSON(Self.transactions, body)
            // Refused before the body is read: only the final answer, and the connection is closed (the body never came).
            let wrongType = try h.connect()
            try wrongType.send(raw: head(Self.transactions, type: "text/plain", length: body.count))
            out["wrongType"] = try wrongType.readResponse()
            open["wrongType"] = wrongType.isOpen
            let huge = try h.connect()
            try huge.send(raw: head(Self.notifications, length: 5 * 1024 * 1024, expect: "100-continue"))
            out["huge"] = try huge.readResponse()
            open["huge"] = huge.isOpen
            // HTTP/1.0: the expectation is ignored; the body sent after a pause gets the final answer, with nothing before it.
            let old = try h.connect()
            try old.send(raw: head(Self.transactions, version: "1.0", length: body.count))
            Thread.sleep(forTimeInterval: 0.5)
            try old.send(raw: body)
            out["http10"] = try old.readResponse()
            return (out, open)
        }
        #expect(r["interim"]?.status == 100)
        #expect(r["interim"]?.body.isEmpty == true)
        #expect(r["final"]?.status == 200, "\(r["final"]?.text ?? "")")
        #expect(r["final"].map { json($0)["verdict"] as? String } == "verified")
        #expect(r["next"]?.status == 200)
        #expect(r["wrongType"]?.status == 415)
        #expect(r["wrongType"]?.header("Connection") == "close")
        #expect(stillOpen["wrongType"] == false)
        #expect(r["huge"]?.status == 413)
        #expect(r["huge"].map { json($0)["error"] as? String } == "too_large")
        #expect(r["huge"]?.header("Connection") == "close")
        #expect(stillOpen["huge"] == false)
        #expect(r["http10"]?.status == 200, "HTTP/1.0 got \(String(describing: r["http10"]?.status)) first")
        let messages = try await h.read(atLeast: 3, timeout: .seconds(10))
        #expect(messages.count == 3, "the three whole transactions are published, nothing else")
        await h.stop()
    }

    @Test("pipelined requests in one write are answered in order, each after its own delivery report")
    func pipelined() async throws {
        let h = try await IngestHarness()
        let pki = IngestHarness.pki
        let note = notificationBody(pki.signNotification(type: .test))
        let tx = Array("{\"signedTransaction\":\"\(pki.sign(TestPayloads.transaction()))\"}".utf8)
        func post(_ path: String, _ body: [UInt8]) -> [UInt8] {
            Array("POST \(path) HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: \(body.count)\r\n\r\n".utf8) + body
        }
        let wire = post(Self.transactions, tx) + Array("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".utf8)
            + post(Self.notifications, Array("nope".utf8)) + post(Self.notifications, note)
        let answers = try await onThread { () -> [HTTPResult] in
            let c = try h.connect()
            try c.send(raw: wire)
            return try (0..<4).map { _ in try c.readResponse() }
        }
        #expect(answers.map(\.status) == [200, 200, 400, 200])
        #expect(json(answers[0])["verdict"] as? String == "verified")
        #expect(answers[1].text == "ok\n")
        #expect(json(answers[2])["error"] as? String == "not_json")
        #expect(json(answers[3])["status"] as? String == "accepted")
        let messages = try await h.read(atLeast: 2, timeout: .seconds(10))
        #expect(messages.count == 2)
        await h.stop()
    }

    @Test("a slow client is cut off at the request deadline (408, then closed); others are served meanwhile; nothing published")
    func slowClient() async throws {
        let h = try await IngestHarness { $0.requestTimeout = .seconds(2) }
        let good = notificationBody(IngestHarness.pki.signNotification(type: .test))
        let head = Array("POST \(Self.notifications) HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: \(good.count)\r\n\r\n".utf8)
        // One slow client waits for its answer after a few bytes; it sent a whole request first on the same
        // connection, so the deadline is each request's own, not the connection's.
        async let waiting = onThread { () -> (first: Int, seconds: Double, answer: HTTPResult?) in
            let slow = try h.connect()
            let first = try slow.postJSON(Self.notifications, good).status
            Thread.sleep(forTimeInterval: 1.5)
            try slow.send(raw: head + good.prefix(10))
            let began = Date()
            // A byte every 0.5 s for a second does not move the deadline. (Sending on after the answer would reset the
            // connection and lose the answer, so the dribble stops a second before the deadline.)
            for b in good.dropFirst(10).prefix(2) {
                Thread.sleep(forTimeInterval: 0.5)
                try slow.send(raw: [b])
            }
            let answer = try? slow.readResponse()
            return (first, Date().timeIntervalSince(began), answer)
        }
        // Another dribbles a byte a second and never reads: its connection is closed all the same.
        async let dribbling = onThread { () -> (closed: Bool, seconds: Double, other: Int) in
            let slow = try h.connect()
            try slow.send(raw: head + good.prefix(10))
            let began = Date()
            let other = try h.connect().postJSON(Self.notifications, good).status
            var closed = false
            for b in good.dropFirst(10).prefix(40) {
                Thread.sleep(forTimeInterval: 1)
                do { try slow.send(raw: [b]) } catch { closed = true; break }
            }
            return (closed, Date().timeIntervalSince(began), other)
        }
        let (w, d) = try await (waiting, dribbling)
        #expect(w.first == 200)
        #expect(w.answer?.status == 408, "the slow request was answered \(String(describing: w.answer?.status))")
        #expect(w.answer.map { json($0)["error"] as? String } == "request_timeout")
        #expect(w.answer?.header("Connection") == "close")
        #expect(w.seconds >= 1.9 && w.seconds < 50, "answered after \(w.seconds) s")
        #expect(d.other == 200)
        #expect(d.closed, "the slow connection was never closed")
        #expect(d.seconds < 50)
        let messages = try await h.read(atLeast: 2, timeout: .seconds(10))
        #expect(messages.count == 2, "only the two whole requests are published")
        await h.stop()
    }

    @Test("Apple's real Sandbox notifications go through and are read back byte for byte; a real transaction verifies")
    func appleRealFixtures() async throws {
        let dir = Paths.appleReal
        guard FileManager.default.fileExists(atPath: dir.appendingPathComponent("3.jws").path) else {
            print("skipped: \(dir.path) absent")
            return
        }
        func load(_ name: String) throws -> String {
            try String(contentsOf: dir.appendingPathComponent(name), encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let root = try [UInt8](Data(contentsOf: dir.appendingPathComponent("AppleRootCA-G3.cer")))
        let policy = try VerificationPolicy(
            roots: TrustedRoot.load(derOrPEM: root), bundleId: "com.loki-project.loki-messenger", appAppleId: 1470168868,
            environments: [.sandbox], validationTime: .signedDate)
        let h = try await IngestHarness(policy: policy)
        let bodies = [try notificationBody(load("2.jws")), try notificationBody(load("3.jws"), extra: ",\"unknown\":true")]
        let transaction = try load("4.jws")
        let results = try await onThread { () -> [HTTPResult] in
            let c = try h.connect()
            return try bodies.map { try c.postJSON(Self.notifications, $0) }
                + [try c.postJSON(Self.transactions, Array("{\"signedTransaction\":\"\(transaction)\"}".utf8))]
        }
        #expect(results.map(\.status) == [200, 200, 200], "\(results.map(\.text))")
        #expect(json(results[2])["transactionIds"] as? [String] == ["2000001024998954"])
        let messages = try await h.read(atLeast: 3)
        #expect(messages.count == 3)
        for body in bodies { #expect(messages.contains { $0.value == body }, "a real notification was not read back byte for byte") }
        #expect(messages.allSatisfy { $0.key != nil }, "notifications keyed by notificationUUID, the transaction by transactionId")
        await h.stop()
    }
}
