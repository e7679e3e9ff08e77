import AppStoreVerification
import EntitlementDomain
import FleetDemo
import FleetKafka
import FleetTestPKI
import FleetWorker
import Testing

/// The demo's generated traffic: what `fleet demo` and the chaos soak publish and then check against.
@Suite struct DemoTrafficTests {
    static let pki = try! TestPKI()

    static func options(seed: UInt64) -> DemoTraffic.Options {
        var o = DemoTraffic.Options()
        o.subscribers = 24
        o.months = 3
        o.ticketBuyers = 12
        o.badShare = 0.1
        o.seed = seed
        o.end = 1_763_900_000_000
        return o
    }

    @Test func sameSeedSameTimelineOtherSeedAnother() throws {
        let a = try DemoTraffic(pki: Self.pki, options: Self.options(seed: 7))
        let b = try DemoTraffic(pki: Self.pki, options: Self.options(seed: 7))
        let c = try DemoTraffic(pki: Self.pki, options: Self.options(seed: 8))
        #expect(!a.items.isEmpty)
        // Signatures are randomised (ECDSA); what the generator decided is not.
        #expect(a.items.map(\.expectation) == b.items.map(\.expectation))
        #expect(a.items.map(\.key) == b.items.map(\.key))
        #expect(a.items.map(\.deliverAt) == b.items.map(\.deliverAt))
        #expect(a.items.map(\.deliverAt) != c.items.map(\.deliverAt) || a.items.map(\.expectation) != c.items.map(\.expectation))
        #expect(a.items.map(\.deliverAt) == a.items.map(\.deliverAt).sorted(), "items come in delivery order")
    }

    @Test func everyInputGetsTheVerdictTheGeneratorIntended() throws {
        let o = Self.options(seed: 3)
        let traffic = try DemoTraffic(pki: Self.pki, options: o)
        let processor = InputProcessor(
            verifier: SignedDataVerifier(policy: try Self.pki.policy(bundleId: o.bundleId, appAppleId: o.appAppleId, environments: [o.environment])),
            mapper: EntitlementMapper(catalogue: try ProductCatalogue.parse(DemoTraffic.catalogueYAML)))
        var verified = 0, rejected = 0
        var reasons: Set<String> = []
        var answerable: [String] = []
        for (i, item) in traffic.items.enumerated() {
            let at = InputCoordinates(topic: FleetTopics.raw, partition: 0, offset: Int64(i))
            switch processor.process(value: item.value, deviceVerificationId: nil, at: at) {
            case .events(let events, _):
                for e in events where e.notification?.type == "CONSUMPTION_REQUEST" && e.notification!.signedDate > o.end - 12 * 3_600_000 {
                    answerable.append(e.transactionId ?? "")
                }
                #expect(item.expectation == "valid" || item.expectation == "replay", "input #\(i) verified, generator meant \(item.expectation)")
                #expect(!events.isEmpty || item.expectation == "replay", "input #\(i) verified to no event")
                verified += 1
            case .rejected(let reason, let detail):
                #expect(item.expectation == reason.rawValue, "input #\(i) rejected as \(reason.rawValue) (\(detail)), generator meant \(item.expectation)")
                reasons.insert(reason.rawValue)
                rejected += 1
            case .retryable(let reason, let detail):
                Issue.record("input #\(i) retryable (\(reason.rawValue): \(detail)) without revocation checks")
            }
        }
        #expect(verified > rejected, "mostly valid traffic")
        #expect(rejected > 0 && reasons.count >= 2, "the bad share covers several reasons: \(reasons)")
        // The responder has work in the demo: CONSUMPTION_REQUESTs inside Apple's 12-hour window, about purchases the
        // App Store knows (the stand-in answers 404 for any other transaction).
        let known = Set(traffic.storedTransactions.map(\.transactionId))
        #expect(!answerable.isEmpty)
        #expect(answerable.allSatisfy { known.contains($0) }, "\(answerable)")
    }

    /// The chaos soak spreads the answerable CONSUMPTION_REQUESTs through its traffic: the same inputs, in an order
    /// that puts them (each after its purchase) among the older traffic instead of at the very end.
    @Test func recentRequestsSpreadThroughTheTraffic() throws {
        var o = Self.options(seed: 5)
        o.ticketBuyers = 100
        let atEnd = try DemoTraffic(pki: Self.pki, options: o)
        o.spreadRecentRequests = true
        let spread = try DemoTraffic(pki: Self.pki, options: o)
        // The same inputs (signatures are randomized, so compared by key and intent), in another order.
        func inputs(_ t: DemoTraffic) -> [String] { t.items.map { "\($0.key ?? "-") \($0.expectation)" } }
        #expect(inputs(spread).sorted() == inputs(atEnd).sorted(), "the same inputs")
        #expect(inputs(spread) != inputs(atEnd), "in another order")
        #expect(spread.items.map(\.deliverAt) == spread.items.map(\.deliverAt).sorted(), "items come in delivery order")

        let processor = InputProcessor(
            verifier: SignedDataVerifier(policy: try Self.pki.policy(bundleId: o.bundleId, appAppleId: o.appAppleId, environments: [o.environment])),
            mapper: EntitlementMapper(catalogue: try ProductCatalogue.parse(DemoTraffic.catalogueYAML)))
        /// Where each answerable request is in the traffic (as a share of it), with the position of its purchase.
        func positions(_ traffic: DemoTraffic) -> [(request: Double, purchase: Int?, at: Int)] {
            var firstSeen: [String: Int] = [:]
            var out: [(Double, Int?, Int)] = []
            for (i, item) in traffic.items.enumerated() {
                let at = InputCoordinates(topic: FleetTopics.raw, partition: 0, offset: Int64(i))
                guard case .events(let events, _) = processor.process(value: item.value, deviceVerificationId: nil, at: at) else { continue }
                for e in events {
                    guard let t = e.transactionId else { continue }
                    if e.notification == nil, firstSeen[t] == nil { firstSeen[t] = i }
                    if e.notification?.type == "CONSUMPTION_REQUEST", e.notification!.signedDate > o.end - 12 * 3_600_000 {
                        out.append((Double(i) / Double(traffic.items.count), firstSeen[t], i))
                    }
                }
            }
            return out
        }
        let before = positions(atEnd), after = positions(spread)
        #expect(before.count == max(1, o.ticketBuyers / 20))
        #expect(after.count == before.count)
        #expect(before.allSatisfy { $0.request > 0.95 }, "without the option they come last: \(before.map(\.request))")
        #expect(after.filter { $0.request < 0.9 }.count >= after.count / 2, "spread: \(after.map(\.request))")
        #expect(after.allSatisfy { r in r.purchase.map { $0 < r.at } ?? false }, "each purchase comes before its request")
        // The chaos soak asks for more of them than the demo's one per 20 ticket buyers.
        o.recentRequests = 9
        #expect(positions(try DemoTraffic(pki: Self.pki, options: o)).count == 9)
    }

    @Test func catalogueParsesAndCoversEveryProductType() throws {
        let catalogue = try ProductCatalogue.parse(DemoTraffic.catalogueYAML)
        #expect(catalogue.products.count == 7)
        #expect(Set(catalogue.products.values.map(\.kind)) == Set(ProductCatalogue.ProductKind.allCases))
    }
}

@Suite struct BacklogGateBudget {
    @Test func budgetKeepsAPartitionUnderTheMockRetention() {
        for size in [200, 1_000, 5_000, 50_000] {
            let budget = BacklogGate.budget(messageBytes: size)
            #expect(budget >= 1)
            #expect(budget * size <= BacklogGate.mockPartitionBytes, "\(budget) messages of \(size) bytes fit in one partition")
        }
        #expect(BacklogGate.budget(messageBytes: 1_000) >= BacklogGate.budget(messageBytes: 5_000))
    }
}
