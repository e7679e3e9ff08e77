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
