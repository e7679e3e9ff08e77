import AppStoreVerification
import FleetKafka
import FleetTestPKI
import Foundation
import Testing

@testable import FleetIngest
@testable import FleetIngestRequests

@Suite("ingest request parsing and settings")
struct IngestRequestTests {
    @Test("a notification body is keyed by the unverified notificationUUID; extra keys are accepted")
    func notificationKey() throws {
        let jws = IngestHarness.pki.signNotification(type: .test, notificationUUID: "0f4c2a58-aaaa-bbbb-cccc-0123456789ab")
        let parsed = try IngestRequests.notification(notificationBody(jws, extra: ",\"newAppleKey\":[1]"))
        #expect(parsed.key == Array("0f4c2a58-aaaa-bbbb-cccc-0123456789ab".utf8))
        // A signedPayload that is not a JWS is published unkeyed (the workers reject it with a reason).
        #expect(try IngestRequests.notification(Array("{\"signedPayload\":\"garbage\"}".utf8)).key == nil)
    }

    @Test("the key scan finds only the top-level member, skipping nested objects, arrays and strings that contain it")
    func keyScan() {
        func key(_ json: String) -> String? { IngestRequests.topLevelMember(Array(json.utf8), Array("notificationUUID".utf8)) }
        let nested = "{\"data\":{\"notificationUUID\":\"inner\",\"s\":\"}{\\\"\"},\"x\":[1,{\"notificationUUID\":2}],\"notificationUUID\":\"outer\"}"
        #expect(key(nested) == "outer")
        #expect(key("{ \"notificationUUID\" : 12345 }") == "12345")
        #expect(key("{\"a\":\"notificationUUID\",\"b\":true}") == nil)
        #expect(key("{\"notificationUUID\":\"\"}") == nil)
        #expect(key("{\"notificationUUID\":\"a\\\"b\"}") == nil)  // escapes: unkeyed
        #expect(key("{\"notificationUUID\":\"" + String(repeating: "a", count: 257) + "\"}") == nil)
        #expect(key("[\"notificationUUID\"]") == nil)
        #expect(key("{\"notificationUUID\"") == nil)
        #expect(key("{\"a\":{\"b\":") == nil)
        #expect(key("") == nil)
    }

    @Test("the unverified claim is read only from a JWS of exactly three segments")
    func claimSegments() {
        let payload = Base64.encodeURL(Array("{\"transactionId\":\"42\"}".utf8))
        func claim(_ jws: String) -> String? { IngestRequests.unverifiedClaim(jws, "transactionId") }
        #expect(claim("eyJh.\(payload).sig") == "42")
        #expect(claim(".\(payload).") == "42")  // empty header and signature: still keyed (the workers reject it)
        #expect(claim("\(payload)") == nil)
        #expect(claim("h.\(payload)") == nil)
        #expect(claim("h.\(payload).s.") == nil)
        #expect(claim("h.\(payload).s.t") == nil)
        #expect(claim("h..s") == nil)
        #expect(claim("") == nil)
        #expect(claim("...") == nil)
    }

    @Test("the claim read from the payload's first 512 base64 characters is the whole payload's")
    func claimFromThePayloadsBeginning() {
        func jws(_ json: String) -> String { "h.\(Base64.encodeURL(Array(json.utf8))).s" }
        let filler = ",\"filler\":\"" + String(repeating: "x", count: 1200) + "\"}"
        func claim(_ json: String) -> String? { IngestRequests.unverifiedClaim(jws(json), "transactionId") }
        #expect(claim("{\"transactionId\":\"2000000000000077\"" + filler) == "2000000000000077")
        #expect(claim("{\"a\":1" + filler.dropLast() + ",\"transactionId\":\"late\"}") == "late")  // past the prefix
        // A number or a string cut by the prefix's end is read whole from the whole payload.
        for pad in 350...400 {
            let lead = "{\"p\":\"" + String(repeating: "y", count: pad) + "\",\"transactionId\":"
            #expect(claim(lead + "123456789012345678" + filler) == "123456789012345678", "pad \(pad)")
            #expect(claim(lead + "\"abcdefghijklmnopqr\"" + filler) == "abcdefghijklmnopqr", "pad \(pad)")
        }
        #expect(claim("{\"transactionId\":\"a\\\"b\"" + filler) == nil)  // escapes: unkeyed, as before
    }

    @Test("the usual body read without a JSON parse gives what the full parse gives, and only for that shape")
    func soleMemberFastPath() throws {
        let tx = IngestHarness.pki.sign(TestPayloads.transaction(transactionId: "2000000000000077"))
        let note = IngestHarness.pki.signNotification(type: .test, notificationUUID: "0f4c2a58-aaaa-bbbb-cccc-0123456789ab")
        func same(_ body: String, fast: Bool) {
            let b = Array(body.utf8)
            #expect((IngestRequests.sole(.signedTransaction, b) != nil || IngestRequests.sole(.signedPayload, b) != nil) == fast,
                    "\(body.prefix(60))")
            func outcome<T>(_ f: ([UInt8]) throws(BadBody) -> T) -> Result<T, BadBody> {
                do { return .success(try f(b)) } catch { return .failure(error) }
            }
            #expect(outcome(IngestRequests.transaction) == outcome(IngestRequests.parsedTransaction))
            #expect(outcome(IngestRequests.notification) == outcome(IngestRequests.parsedNotification))
        }
        same("{\"signedTransaction\":\"\(tx)\"}", fast: true)
        same("{\"signedPayload\":\"\(note)\"}", fast: true)
        same("{\"signedPayload\":\"\(tx)\"}", fast: true)  // a transaction where a notification belongs: no notificationUUID
        same("{\"signedTransaction\":\"a.b.c\"}", fast: true)
        same("{\"signedTransaction\":\"x\"}", fast: true)
        // Everything else takes the full parse.
        for body in [
            "{\"signedTransaction\":\"\"}", "{\"signedTransaction\": \"\(tx)\"}", " {\"signedTransaction\":\"\(tx)\"}",
            "{\"signedTransaction\":\"\(tx)\"} ", "{\"signedTransaction\":\"\(tx)\",\"appAccountToken\":\"t\"}",
            "{\"signedTransaction\":\"ab\\u0041c\"}", "{\"signedTransaction\":\"a\\\"}", "{\"signedTransaction\":\"a\"b\"}",
            "{\"signedTransaction\":\"a b\"}", "{\"signedTransaction\":\"a\u{1}b\"}", "{\"signedTransaction\":\"é\"}",
            "{\"signedTransaction\":\"a\"", "{\"signedTransaction\":\"a}", "{\"signedTransaction\":\"", "\"}",
            "{\"signedPayload\":\"\(note)\",\"x\":1}", "{\"signedPayload\":\"=\"}", "{\"signedPayload\":\"a+b/c\"}",
            "{\"SignedPayload\":\"abc\"}", "",
        ] {
            same(body, fast: false)
        }
    }

    @Test("transactions: the bare JWS is the value; a receipt body is kept whole; optional fields")
    func transactionParsing() throws {
        let jws = IngestHarness.pki.sign(TestPayloads.transaction(transactionId: "2000000000000042"))
        let t = try IngestRequests.transaction(Array("{\"signedTransaction\":\"\(jws)\",\"deviceVerificationId\":\"d\",\"appAccountToken\":null}".utf8))
        #expect(t.kind == .signedTransaction)
        #expect(t.value == Array(jws.utf8))
        #expect(t.key == Array("2000000000000042".utf8))
        #expect(t.deviceVerificationId == "d")
        #expect(t.appAccountToken == nil)
        let body = Array("{ \"receipt-data\" : \"MIIabc\", \"password\": \"x\" }".utf8)
        let r = try IngestRequests.transaction(body)
        #expect(r.kind == .receipt)
        #expect(r.value == body)
    }

    @Test("bearer comparison")
    func bearer() {
        let token = Array("0123456789abcdef0123".utf8)
        #expect(IngestHTTP.authorized("Bearer 0123456789abcdef0123", token: token))
        #expect(IngestHTTP.authorized("bearer 0123456789abcdef0123", token: token))
        #expect(!IngestHTTP.authorized("Bearer 0123456789abcdef012", token: token))
        #expect(!IngestHTTP.authorized("Bearer 0123456789abcdef01234", token: token))
        #expect(!IngestHTTP.authorized("Bearer ", token: token))
        #expect(!IngestHTTP.authorized(nil, token: token))
    }

    @Test("content types")
    func contentTypes() {
        #expect(IngestHTTP.isJSON("application/json"))
        #expect(IngestHTTP.isJSON("Application/JSON; charset=utf-8"))
        #expect(IngestHTTP.isJSON("application/vnd.api+json"))
        #expect(IngestHTTP.isJSON(nil))
        #expect(!IngestHTTP.isJSON("text/plain"))
        #expect(!IngestHTTP.isJSON("multipart/form-data; boundary=x"))
    }

    @Test("the producer is always idempotent with acks=all and the publish deadline as message timeout")
    func producerGuarantees() throws {
        var c = IngestConfiguration(kafka: KafkaConfiguration(
            bootstrapServers: "x:1", properties: ["enable.idempotence": "false", "acks": "1", "message.timeout.ms": "300000"],
            idempotence: false))
        c.publishTimeout = .milliseconds(2500)
        let p = c.producerConfiguration
        #expect(p.idempotence)
        #expect(p.properties["enable.idempotence"] == "true")
        #expect(p.properties["acks"] == "all")
        #expect(p.properties["message.timeout.ms"] == "2500")
        #expect(p.messageTimeoutMilliseconds == 2500)
        #expect(p.lingerMilliseconds < 2500)
    }

    @Test("the producer does not linger unless a linger is asked for (each request waits for its own report)")
    func producerLinger() {
        let plain = IngestConfiguration(kafka: KafkaConfiguration(bootstrapServers: "x:1")).producerConfiguration
        #expect(plain.lingerMilliseconds == 0)
        let asked = IngestConfiguration(kafka: KafkaConfiguration(bootstrapServers: "x:1", properties: ["linger.ms": "3"]))
        #expect(asked.producerConfiguration.lingerMilliseconds == 5)  // the library default; the property wins
        #expect(asked.producerConfiguration.properties["linger.ms"] == "3")
    }

    @Test("the producer compresses with zstd at level 1 unless a codec or a level is asked for")
    func producerCompression() {
        let plain = IngestConfiguration(kafka: KafkaConfiguration(bootstrapServers: "x:1")).producerConfiguration
        #expect(plain.properties["compression.type"] == "zstd")
        #expect(plain.properties["compression.level"] == "1")
        let level = IngestConfiguration(kafka: KafkaConfiguration(bootstrapServers: "x:1", properties: ["compression.level": "5"]))
        #expect(level.producerConfiguration.properties["compression.type"] == "zstd")
        #expect(level.producerConfiguration.properties["compression.level"] == "5")
        let lz4 = IngestConfiguration(kafka: KafkaConfiguration(bootstrapServers: "x:1", properties: ["compression.type": "lz4"]))
        #expect(lz4.producerConfiguration.properties["compression.type"] == "lz4")
        #expect(lz4.producerConfiguration.properties["compression.level"] == nil)
    }

    @Test("invalid settings are refused with the key named; the token is never shown")
    func validation() {
        var c = IngestConfiguration(kafka: KafkaConfiguration(bootstrapServers: "x:1"))
        c.maxBodyBytes = 10
        #expect(throws: IngestConfigurationError.self) { try c.validate() }
        c = IngestConfiguration(kafka: KafkaConfiguration(bootstrapServers: "x:1"))
        c.transactionsPath = c.notificationsPath
        #expect(throws: IngestConfigurationError.self) { try c.validate() }
        for (key, set) in [("event-loop-threads", { (c: inout IngestConfiguration, n: Int) in c.eventLoopThreads = n }),
                           ("verifier-threads", { (c: inout IngestConfiguration, n: Int) in c.verifierThreads = n })] {
            for bad in [0, -1, 257] {
                c = IngestConfiguration(kafka: KafkaConfiguration(bootstrapServers: "x:1"))
                set(&c, bad)
                do { try c.validate(); Issue.record("\(key) \(bad) was accepted") } catch {
                    #expect(error.key == key)
                }
            }
        }
        c = IngestConfiguration(kafka: KafkaConfiguration(bootstrapServers: "x:1"))
        // One loop per core, as many as the verifier threads.
        #expect(c.eventLoopThreads == IngestConfiguration.defaultEventLoopThreads)
        #expect(c.eventLoopThreads == c.verifierThreads)
        c.apiToken = Array("short-secret".utf8)
        do { try c.validate(); Issue.record("a short token was accepted") } catch {
            #expect(!"\(error)".contains("short-secret"))
            #expect("\(error)".contains("api-token-file"))
        }
    }
}
