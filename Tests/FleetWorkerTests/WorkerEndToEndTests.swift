import AppStoreVerification
import EntitlementDomain
import FleetDevStack
import FleetKafka
import FleetOperations
import FleetTestPKI
import FleetTestSupport
import Foundation
import Logging
import Testing

@testable import FleetWorker

private let day: Int64 = 86_400_000

/// What one raw input must become.
private enum Expect {
    case events([String])
    case rejected(String)
}

private let catalogueYAML = """
products:
  com.example.fleet.premium.monthly: { type: auto-renewable, entitlement: premium }
  com.example.tickets.10: { type: consumable, units: 10, entitlement: tickets }
  com.example.lifetime: { type: non-consumable, entitlement: lifetime }
"""

/// A mixed stream: valid notifications of many types, client transactions, forged, malformed, wrong bundle, ...
private func mixedStream(_ pki: TestPKI) throws -> [(value: [UInt8], headers: [KafkaHeader], expect: Expect, name: String)] {
    let forged = try TestPKI.forged()
    let t0 = TestPayloads.nowMillis() - 40 * day
    var out: [(value: [UInt8], headers: [KafkaHeader], expect: Expect, name: String)] = []
    func add(_ jws: String, _ e: Expect, headers: [KafkaHeader] = [], name: String = "") { out.append((Array(jws.utf8), headers, e, name)) }

    let sub = TestPayloads.transaction(transactionId: "1000", originalTransactionId: "1000", purchaseDate: t0, signedDate: t0 + 1)
    let renewal = TestPayloads.renewalInfo(originalTransactionId: "1000", signedDate: t0 + 1)
    let cases: [(NotificationTypeV2, Subtype?, String)] = [
        (.subscribed, .initialBuy, "SUBSCRIPTION_STARTED"), (.didRenew, nil, "SUBSCRIPTION_RENEWED"),
        (.didRenew, .billingRecovery, "SUBSCRIPTION_RECOVERED"), (.didChangeRenewalStatus, .autoRenewDisabled, "AUTO_RENEW_DISABLED"),
        (.didChangeRenewalPref, .upgrade, "PLAN_UPGRADED"), (.didChangeRenewalPref, .downgrade, "PLAN_CHANGE_SCHEDULED"),
        (.didFailToRenew, .gracePeriod, "GRACE_PERIOD_STARTED"), (.gracePeriodExpired, nil, "GRACE_PERIOD_ENDED"),
        (.expired, .voluntary, "SUBSCRIPTION_EXPIRED"), (.priceIncrease, .pending, "PRICE_INCREASE_PENDING"),
        (.refundDeclined, nil, "REFUND_DECLINED"), (.renewalExtended, nil, "RENEWAL_DATE_EXTENDED"),
        (.consumptionRequest, nil, "REFUND_REQUESTED"), (.offerRedeemed, nil, "OFFER_REDEEMED"),
    ]
    for (i, c) in cases.enumerated() {
        add(pki.signNotification(type: c.0, subtype: c.1, transaction: sub, renewal: renewal, signedDate: t0 + Int64(i) * 1000), .events([c.2]))
    }
    let refunded = TestPayloads.transaction(transactionId: "1000", originalTransactionId: "1000", purchaseDate: t0, signedDate: t0 + 5 * day,
                                            revocationDate: t0 + 5 * day, revocationReason: .other, revocationType: .refundFull)
    add(pki.signNotification(type: .refund, transaction: refunded, renewal: renewal, signedDate: t0 + 5 * day), .events(["REFUNDED"]))
    add(pki.signNotification(type: .refundReversed, transaction: sub, renewal: renewal, signedDate: t0 + 6 * day), .events(["REFUND_REVERSED"]))
    let family = TestPayloads.transaction(productId: "com.example.lifetime", transactionId: "2000", type: .nonConsumable, signedDate: t0,
                                          inAppOwnershipType: .familyShared, revocationDate: t0, revocationReason: .other, revocationType: .familyRevoke)
    add(pki.signNotification(type: .revoke, transaction: family, signedDate: t0 + 2), .events(["FAMILY_ACCESS_REVOKED"]))
    add(pki.signNotification(type: .test, signedDate: t0), .events(["TEST_RECEIVED"]))
    add(pki.sign(TestPayloads.summaryNotification(signedDate: t0)), .events(["RENEWAL_EXTENSION_SUMMARY"]))
    add(pki.sign(TestPayloads.rescindConsentNotification(signedAppTransactionInfo: pki.sign(TestPayloads.appTransaction(receiptCreationDate: t0)), signedDate: t0)), .events(["CONSENT_RESCINDED"]))
    add(pki.signNotification(type: NotificationTypeV2("SOMETHING_NEW"), transaction: sub, signedDate: t0), .events(["UNKNOWN_NOTIFICATION"]))
    // Client-sent StoreKit 2 data.
    let tickets = TestPayloads.transaction(productId: "com.example.tickets.10", transactionId: "3000", purchaseDate: t0, type: .consumable, signedDate: t0, quantity: 2)
    add(pki.sign(tickets), .events(["ONE_TIME_PURCHASED"]))
    add(pki.sign(tickets), .events(["ONE_TIME_PURCHASED"]))  // a replay: same events again, the sink credits once
    add(pki.sign(TestPayloads.transaction(transactionId: "4000", purchaseDate: TestPayloads.nowMillis() - day, signedDate: TestPayloads.nowMillis() - day + 5)), .events(["SUBSCRIPTION_OBSERVED"]))
    add(pki.sign(renewal), .events(["RENEWAL_INFO_OBSERVED"]))
    add(pki.sign(TestPayloads.appTransaction(receiptCreationDate: t0)), .events(["APP_TRANSACTION_OBSERVED"]))
    // Apple's POST body shape is accepted too.
    add("{\"signedPayload\":\"\(pki.signNotification(type: .test, signedDate: t0 + 9))\"}", .events(["TEST_RECEIVED"]))
    // Device check from the seeds.
    let nonce = UUID().uuidString.lowercased(), device = UUID().uuidString
    let digest = Base64.encodeStandard(Array(SHA384Digest.of(nonce + device.lowercased())))
    let bound = TestPayloads.transaction(productId: "com.example.tickets.10", transactionId: "5000", type: .consumable, signedDate: t0,
                                         extra: ["deviceVerification": .string(digest), "deviceVerificationNonce": .string(nonce)])
    add(pki.sign(bound), .events(["ONE_TIME_PURCHASED"]), headers: [KafkaHeader(key: "device-verification-id", string: device)])
    add(pki.sign(bound), .rejected("DEVICE_VERIFICATION_MISMATCH"), headers: [KafkaHeader(key: "device-verification-id", string: UUID().uuidString)])
    // Everything that must be refused, each for its own reason.
    add(forged.sign(sub), .rejected("UNTRUSTED_CHAIN"))
    add(forged.signNotification(type: .didRenew, transaction: sub, signedDate: t0), .rejected("UNTRUSTED_CHAIN"))
    let nestedForged = pki.sign(TestPayloads.notification(type: .didRenew, signedDate: t0, signedTransactionInfo: forged.sign(sub)))
    add(nestedForged, .rejected("UNTRUSTED_CHAIN"), name: "nested-forged")
    add(pki.sign(TestPayloads.transaction(bundleId: "com.other.app", signedDate: t0)), .rejected("WRONG_BUNDLE_ID"))
    add(pki.sign(TestPayloads.transaction(environment: .production, signedDate: t0)), .rejected("WRONG_ENVIRONMENT"))
    add(pki.sign(TestPayloads.transaction(productId: "com.unknown.product", signedDate: t0)), .rejected("UNKNOWN_PRODUCT"))
    var tampered = Array(pki.sign(sub).utf8)
    tampered[tampered.firstIndex(of: UInt8(ascii: "."))! + 10] ^= 0x01
    out.append((tampered, [], .rejected("INVALID_SIGNATURE"), "tampered"))
    add("garbage line", .rejected("MALFORMED_JWS"))
    add("", .rejected("MALFORMED_JWS"))
    add("MIITtgYJKoZIhvcNAQcCoIITpzCCE6MCAQExCzAJBgUrDgMCGgUAMIIDVwYJKoZIhvcNAQcBoIIDSASCA0QxggNAMAoCAQgCAQEEAhYAMAoCARQCAQEEAgwAMAsCAQECAQEEAwIBADALAgEDAgEBBAMMATEwCwIBCwIBAQQDAgEAMAsCAQ8CAQEEAwIBADALAgEQAgEBBAMCAQAwCwIBGQIBAQQDAgEDMAwCAQoCAQEEBBYCNCswDAIBDgIBAQQEAgIAiTANAgENAgEBBAUCAwHVgzANAgETAgEBBAUMAzEuMDAOAgEJAgEBBAYCBFAyNTMwGAIBBAIBAgQQ", .rejected("MALFORMED_RECEIPT"))
    add(pki.signer.sign(sub, header: .init(alg: "none")), .rejected("UNSUPPORTED_ALGORITHM"))
    return out
}

import Crypto
private enum SHA384Digest {
    static func of(_ s: String) -> [UInt8] { Array(SHA384.hash(data: Array(s.utf8))) }
}

@Suite(.serialized)
struct WorkerEndToEndTests {
    let logger = Logger(label: "worker-test")

    @Test func mixedStreamYieldsExpectedEventsAndRejections() async throws {
        let cluster = try EmbeddedKafkaCluster(brokers: 3)
        defer { cluster.shutdown() }
        try cluster.createTopic("raw", partitions: 3)
        try cluster.createTopic("result", partitions: 3)
        try cluster.createTopic("rejected", partitions: 1)
        let pki = try TestPKI()
        let stream = try mixedStream(pki)
        let refs = try await publish(cluster.bootstrapServers, topic: "raw", partitions: 3, values: stream.map { ($0.value, $0.headers) })

        let config = WorkerConfiguration(
            kafka: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers, clientId: "worker-test", sessionTimeoutMilliseconds: 6000, heartbeatIntervalMilliseconds: 500),
            group: "verifiers", inputTopics: ["raw"], resultTopic: "result", rejectedTopic: "rejected",
            policy: try pki.policy(environments: [.sandbox]), catalogue: try ProductCatalogue.parse(catalogueYAML),
            requireKnownProducts: true, threads: 2, maxBatch: 16)
        let worker = try VerifierWorker(configuration: config, logger: logger)
        let task = Task { try await worker.run() }
        defer { task.cancel() }

        let expectedEvents = stream.reduce(0) { n, s in if case .events(let k) = s.expect { return n + k.count }; return n }
        let expectedRejections = stream.count - stream.filter { if case .events = $0.expect { return true }; return false }.count
        let events = try await readTopic(cluster.bootstrapServers, "result", atLeast: expectedEvents)
        let rejections = try await readTopic(cluster.bootstrapServers, "rejected", atLeast: expectedRejections)
        task.cancel()
        _ = try? await task.value

        // Every input accounted for exactly once: the counts add up to the input count.
        #expect(events.count == expectedEvents)
        #expect(rejections.count == expectedRejections)
        let stats = worker.statistics
        #expect(stats.inputs == stream.count)
        #expect(stats.verified + stats.rejected == stream.count)

        let validator = try SchemaValidator(path: TestPaths.eventSchema)
        var eventsBySource: [InputRef: [EntitlementEvent]] = [:]
        for m in events {
            let json = try JSONValue.parse(bytes: m.value)
            #expect(validator.errors(json).isEmpty, "\(validator.errors(json))")
            let e = try EntitlementEvent(jsonBytes: m.value)
            #expect(header(m, "event-id") == e.eventId)
            #expect(header(m, "event-kind") == e.kind)
            #expect(m.key.map { String(decoding: $0, as: UTF8.self) } == EntitlementMapper.partitionKey(for: e))
            eventsBySource[InputRef(partition: e.source.partition, offset: e.source.offset), default: []].append(e)
        }
        var rejectedBySource: [InputRef: KafkaMessage] = [:]
        for m in rejections {
            let ref = InputRef(partition: Int32(header(m, "source-partition") ?? "") ?? -1, offset: Int64(header(m, "source-offset") ?? "") ?? -1)
            #expect(rejectedBySource[ref] == nil, "exactly one rejected record per input")
            rejectedBySource[ref] = m
            #expect(header(m, "source-topic") == "raw")
            #expect(!(header(m, "detail") ?? "").isEmpty)
        }
        for (i, s) in stream.enumerated() {
            let ref = refs[i]
            switch s.expect {
            case .events(let kinds):
                #expect(eventsBySource[ref]?.map(\.kind) == kinds, "input \(i) \(String(decoding: s.value.prefix(40), as: UTF8.self))")
                #expect(rejectedBySource[ref] == nil)
            case .rejected(let reason):
                let r = rejectedBySource[ref]
                #expect(header(r!, "reason") == reason, "input \(i): \(header(r!, "reason") ?? "none") \(header(r!, "detail") ?? "")")
                #expect(r?.value == s.value, "the rejected record carries the original bytes unchanged")
                #expect(eventsBySource[ref] == nil)
            }
        }
        // The nested forgery names the nested field.
        let nested = rejectedBySource[refs[stream.firstIndex { $0.name == "nested-forged" }!]]
        #expect(header(nested!, "detail")?.contains("signedTransactionInfo") == true)
        // Consumables carry catalogue units x quantity.
        #expect(eventsBySource.values.flatMap { $0 }.first { $0.transactionId == "3000" }?.units == 20)
    }

    @Test func killedWorkerLosesNothing() async throws {
        guard let fleet = TestPaths.fleet else {
            Issue.record("the fleet executable is not built; run `swift build` first (make test does)")
            return
        }
        let cluster = try EmbeddedKafkaCluster(brokers: 1)
        defer { cluster.shutdown() }
        try cluster.createTopic("raw", partitions: 4)
        try cluster.createTopic("result", partitions: 4)
        try cluster.createTopic("rejected", partitions: 1)
        let pki = try TestPKI()
        let root = TestPaths.tempFile("root.der", TestPKI.der(pki.root))
        let t0 = TestPayloads.nowMillis() - day
        var values: [(value: [UInt8], headers: [KafkaHeader])] = []
        for i in 0..<3000 {
            let txn = TestPayloads.transaction(productId: "com.example.tickets.10", transactionId: String(10_000 + i), purchaseDate: t0, type: .consumable, signedDate: t0 + Int64(i))
            values.append((Array((i % 50 == 0 ? "bad input \(i)" : pki.sign(txn)).utf8), []))
        }
        let refs = try await publish(cluster.bootstrapServers, topic: "raw", partitions: 4, values: values)
        let args = ["worker", "--bootstrap-servers", cluster.bootstrapServers, "--group", "verifiers", "--input-topic", "raw",
                    "--result-topic", "result", "--rejected-topic", "rejected", "--root-certificate", root,
                    "--bundle-id", TestPayloads.bundleId, "--environment", "Sandbox", "--metrics-port", "0", "--threads", "1",
                    "--kafka-property", "session.timeout.ms=6000", "--kafka-property", "heartbeat.interval.ms=500",
                    "--log-format", "text"]
        let first = try ChildProcess(fleet, args)
        // Let it get part of the way, then kill it without warning.
        _ = try await readTopic(cluster.bootstrapServers, "result", atLeast: 600, timeout: .seconds(60))
        first.terminate(SIGKILL)
        _ = await first.waitExit(timeout: .seconds(5))
        let second = try ChildProcess(fleet, args)
        defer { second.terminate(SIGKILL) }
        let admin = KafkaAdmin(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers))
        let deadline = ContinuousClock.now + .seconds(90)
        var committed: Int64 = 0
        while ContinuousClock.now < deadline {
            let lag = try await admin.consumerLag(groupId: "verifiers", topics: ["raw"])
            committed = lag.reduce(0, { $0 + ($1.committedOffset ?? 0) })
            if committed == Int64(values.count) { break }
            try await Task.sleep(for: .milliseconds(500))
        }
        #expect(committed == Int64(values.count), "the second worker committed every input")
        let events = try await readTopic(cluster.bootstrapServers, "result", atLeast: 2940, timeout: .seconds(30))
        let rejections = try await readTopic(cluster.bootstrapServers, "rejected", atLeast: 60, timeout: .seconds(30))
        var ids: [InputRef: Set<String>] = [:]
        for m in events {
            let e = try EntitlementEvent(jsonBytes: m.value)
            ids[InputRef(partition: e.source.partition, offset: e.source.offset), default: []].insert(e.eventId)
        }
        let rejectedRefs = Set(rejections.map { InputRef(partition: Int32(header($0, "source-partition")!)!, offset: Int64(header($0, "source-offset")!)!) })
        for (i, ref) in refs.enumerated() {
            if i % 50 == 0 {
                #expect(rejectedRefs.contains(ref), "bad input \(i) has its rejection")
            } else {
                // At least once; a redelivered input yields the very same eventId.
                #expect(ids[ref]?.count == 1, "input \(i) at \(ref) has \(ids[ref]?.count ?? 0) distinct event ids")
            }
        }
        #expect(events.count >= 2940)
    }

    @Test func sigtermFinishesInFlightWorkAndCommits() async throws {
        guard let fleet = TestPaths.fleet else {
            Issue.record("the fleet executable is not built; run `swift build` first (make test does)")
            return
        }
        let cluster = try EmbeddedKafkaCluster(brokers: 1)
        defer { cluster.shutdown() }
        try cluster.createTopic("raw", partitions: 2)
        try cluster.createTopic("result", partitions: 2)
        try cluster.createTopic("rejected", partitions: 1)
        let pki = try TestPKI()
        let root = TestPaths.tempFile("root.der", TestPKI.der(pki.root))
        let values = (0..<500).map { i in
            (Array(pki.sign(TestPayloads.transaction(transactionId: String(50_000 + i), signedDate: TestPayloads.nowMillis() - 1000)).utf8), [KafkaHeader]())
        }
        _ = try await publish(cluster.bootstrapServers, topic: "raw", partitions: 2, values: values)
        let worker = try ChildProcess(fleet, [
            "worker", "--bootstrap-servers", cluster.bootstrapServers, "--group", "verifiers", "--input-topic", "raw",
            "--result-topic", "result", "--rejected-topic", "rejected", "--root-certificate", root,
            "--bundle-id", TestPayloads.bundleId, "--environment", "Sandbox", "--metrics-port", "0",
            "--shutdown-deadline-seconds", "8", "--kafka-property", "session.timeout.ms=6000", "--log-format", "text"])
        _ = try await readTopic(cluster.bootstrapServers, "result", atLeast: 500, timeout: .seconds(60))
        let began = ContinuousClock.now
        worker.terminate(SIGTERM)
        let status = await worker.waitExit(timeout: .seconds(12))
        #expect(status == 0, "exit status \(String(describing: status)); log:\n\(worker.output.suffix(2000))")
        #expect(ContinuousClock.now - began < .seconds(10), "exits within the shutdown deadline")
        let lag = try await KafkaAdmin(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers))
            .consumerLag(groupId: "verifiers", topics: ["raw"])
        #expect(lag.reduce(0) { $0 + ($1.committedOffset ?? 0) } == 500, "every processed input's offset is committed: \(lag)")
        #expect(lag.totalLag == 0)
    }
}
