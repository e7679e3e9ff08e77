import AppStoreVerification
import FleetRevocation
import FleetTestPKI
import FleetTestSupport
import Foundation
import Synchronization
import Testing

/// `--revocation-check` against real OCSP responders (`openssl ocsp`, started per suite on 127.0.0.1): every verdict,
/// the cache's one request per certificate, and the failure modes. Skips when openssl is not installed.
@Suite(.serialized, .enabled(if: Harness.opensslAvailable))
struct RevocationTests {
    static let shared: RevocationTestPKI? = try? RevocationTestPKI(extraGoodLeaves: 6)

    var pki: RevocationTestPKI {
        get throws {
            guard let p = Self.shared else { throw Harness.Failure("could not start the openssl OCSP responders") }
            return p
        }
    }

    @Test func goodChainVerifiesInBothModes() async throws { try await offPool { try self.goodChainVerifiesInBothModesBlocking() } }

    func goodChainVerifiesInBothModesBlocking() throws {
        let p = try pki
        for mode in [RevocationSettings.Mode.soft, .hard] {
            let h = Harness(p.good, mode: mode)
            let item = try h.verifier.verify(p.good.sign(TestPayloads.transaction()))
            guard case .transaction = item else { Issue.record("not a transaction"); return }
            #expect(h.events.count(of: "revoked") == 0 && h.events.count(of: "unchecked") == 0)
        }
    }

    @Test func revokedLeafIsRejected() async throws { try await offPool { try self.revokedLeafIsRejectedBlocking() } }

    func revokedLeafIsRejectedBlocking() throws {
        let p = try pki
        for mode in [RevocationSettings.Mode.soft, .hard] {
            let h = Harness(p.revokedLeaf, mode: mode)
            let e = h.expectFailure(p.revokedLeaf.sign(TestPayloads.transaction()))
            #expect(e?.reason == .certificateRevoked)
            #expect(e?.isRetryable == false)
        }
    }

    @Test func revokedIntermediateIsRejected() async throws { try await offPool { try self.revokedIntermediateIsRejectedBlocking() } }

    func revokedIntermediateIsRejectedBlocking() throws {
        let p = try pki
        let h = Harness(p.revokedIntermediate, mode: .soft)
        let e = h.expectFailure(p.revokedIntermediate.sign(TestPayloads.transaction()))
        #expect(e?.reason == .certificateRevoked)
    }

    @Test func offModeNeverAsks() async throws { try await offPool { try self.offModeNeverAsksBlocking() } }

    func offModeNeverAsksBlocking() throws {
        let p = try pki
        let before = p.leafResponder.requestCount
        let h = Harness(p.revokedLeaf, mode: .off)
        _ = try h.verifier.verify(p.revokedLeaf.sign(TestPayloads.transaction()))
        #expect(h.cache.fetches == 0)
        #expect(p.leafResponder.requestCount == before)
    }

    @Test(arguments: ["unknown", "down", "slow", "wrongSigner", "stale"])
    func statusUnavailableIsRetryableInHardAndUncheckedInSoft(_ name: String) async throws { try await offPool { try self.statusUnavailableIsRetryableInHardAndUncheckedInSoftBlocking(name) } }

    func statusUnavailableIsRetryableInHardAndUncheckedInSoftBlocking(_ name: String) throws {
        let p = try pki
        let chain: TestPKI
        var clockOffset: Int64 = 0
        switch name {
        case "unknown": chain = p.unknownLeaf
        case "down": chain = p.down
        case "slow": chain = p.slow
        case "wrongSigner": chain = p.wrongSigner
        default:
            // The responder's answers say nextUpdate = now + 60 min; two days later they are stale.
            chain = p.good
            clockOffset = 2 * 86_400_000
        }
        let payload = TestPayloads.transaction(purchaseDate: TestPayloads.nowMillis() + clockOffset)
        let jws = chain.sign(payload)
        let hard = Harness(chain, mode: .hard, clockOffset: clockOffset)
        let e = hard.expectFailure(jws)
        #expect(e?.reason == .revocationStatusUnavailable, "\(name): \(String(describing: e))")
        #expect(e?.isRetryable == true)
        #expect(hard.events.count(of: "unavailable") == 1)

        let soft = Harness(chain, mode: .soft, clockOffset: clockOffset)
        _ = try soft.verifier.verify(jws)
        #expect(soft.events.count(of: "unchecked") == 1, "\(name)")
        if name == "slow" || name == "down" {
            #expect(soft.events.kinds.contains(name == "slow" ? "timeout" : "unreachable"), "\(soft.events.kinds)")
        }
    }

    @Test func oneRequestPerCertificateHoweverManyMessages() async throws { try await offPool { try self.oneRequestPerCertificateHoweverManyMessagesBlocking() } }

    func oneRequestPerCertificateHoweverManyMessagesBlocking() throws {
        let p = try pki
        let leaves = p.goodLeaves
        let leafBefore = p.leafResponder.requestCount
        let rootBefore = p.rootResponder.requestCount
        // No chain cache: every message re-verifies its chain, so every one asks the revocation cache.
        let h = Harness(p.good, mode: .hard, chainCache: nil)
        let messages = (0..<40).map { i in leaves[i % leaves.count].sign(TestPayloads.transaction()) }
        // Concurrent cold misses (8 threads, as a worker verifies) share one request per certificate.
        let failures = Atomic<Int>(0)
        DispatchQueue.concurrentPerform(iterations: 8) { t in
            for i in stride(from: t, to: messages.count, by: 8) where (try? h.verifier.verify(messages[i])) == nil {
                failures.add(1, ordering: .relaxed)
            }
        }
        #expect(failures.load(ordering: .relaxed) == 0)
        #expect(p.leafResponder.requestCount - leafBefore == leaves.count)
        #expect(p.rootResponder.requestCount - rootBefore == 1)
        #expect(h.cache.fetches == leaves.count + 1)
        #expect(h.cache.hits >= messages.count)
    }

    @Test func warmChainCacheDoesNoRevocationWork() async throws { try await offPool { try self.warmChainCacheDoesNoRevocationWorkBlocking() } }

    func warmChainCacheDoesNoRevocationWorkBlocking() throws {
        let p = try pki
        let h = Harness(p.good, mode: .hard)
        _ = try h.verifier.verify(p.good.sign(TestPayloads.transaction()))
        let (hits, misses) = (h.cache.hits, h.cache.misses)
        for _ in 0..<20 { _ = try h.verifier.verify(p.good.sign(TestPayloads.transaction())) }
        #expect(h.cache.hits == hits && h.cache.misses == misses)
    }

    @Test func answersAreRefreshedInTheBackgroundBeforeExpiry() async throws {
        let p = try pki
        // A one-minute cap: answers are refreshed once 20% of it (12 s) is left; the clock jumps 50 s ahead.
        let clock = TestClock()
        let h = Harness(p.good, mode: .hard, clock: clock, maxAgeMillis: 60_000)
        _ = try h.verifier.verify(p.good.sign(TestPayloads.transaction()))
        #expect(h.cache.fetches == 2)
        clock.shift.store(50_000, ordering: .relaxed)
        _ = try h.verifier.verify(p.good.sign(TestPayloads.transaction()))  // served at once, refresh started
        let deadline = ContinuousClock.now + .seconds(20)
        while h.cache.fetches < 4 && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        #expect(h.cache.fetches == 4)
        // Past the old expiry, the refreshed answers keep the chain usable without a foreground fetch.
        clock.shift.store(70_000, ordering: .relaxed)
        _ = try h.verifier.verify(p.good.sign(TestPayloads.transaction()))
        #expect(h.cache.fetches == 4)
    }

    @Test func hardModeRecoversWhenTheResponderComesBack() async throws { try await offPool { try self.hardModeRecoversWhenTheResponderComesBackBlocking() } }

    func hardModeRecoversWhenTheResponderComesBackBlocking() throws {
        let p = try pki
        // A responder for a fresh leaf that starts only after the first attempt failed.
        let port = try OCSPTestResponder.freePort()
        var o = TestPKI.Options()
        o.leafOCSPURL = "http://127.0.0.1:\(port)"
        o.intermediateOCSPURL = p.rootResponder.url
        let chain = try p.good.withNewLeaf(options: o)
        let h = Harness(chain, mode: .hard)
        let jws = chain.sign(TestPayloads.transaction())
        #expect(h.expectFailure(jws)?.reason == .revocationStatusUnavailable)
        let responder = try OCSPTestResponder(
            issuer: chain.intermediate, signer: chain.intermediate, signerKeyPEM: chain.intermediateKey.pemRepresentation,
            statuses: [(chain.leaf, .good)], port: port)
        defer { responder.stop() }
        // Failures are remembered for failureRetryMillis (200 ms here): retry until it has passed.
        let deadline = Date().addingTimeInterval(10)
        var verified = false
        while !verified && Date() < deadline {
            verified = (try? h.verifier.verify(jws)) != nil
            if !verified { usleep(50_000) }
        }
        #expect(verified)
        #expect(responder.requestCount == 1)
    }
}

/// A clock shift tests move forward.
final class TestClock: Sendable {
    let shift = Atomic<Int64>(0)
}

/// One verifier wired to the real HTTP fetcher, with a recorded event stream.
struct Harness {
    static let opensslAvailable: Bool = {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = ["openssl", "version"]
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        guard (try? p.run()) != nil else { return false }
        p.waitUntilExit()
        return p.terminationStatus == 0
    }()

    struct Failure: Error, CustomStringConvertible {
        let description: String
        init(_ d: String) { description = d }
    }

    final class Events: Sendable {
        let list = Mutex<[String]>([])
        func add(_ e: RevocationEvent) {
            let name: String
            switch e {
            case .cacheHit: name = "hit"
            case .cacheMiss: name = "miss"
            case .fetched(let s): name = "fetched:\(s)"
            case .fetchFailed(let kind, _): name = kind
            case .unchecked: name = "unchecked"
            case .revoked: name = "revoked"
            case .unavailable: name = "unavailable"
            }
            list.withLock { $0.append(name) }
        }
        var kinds: [String] { list.withLock { $0 } }
        func count(of name: String) -> Int { kinds.filter { $0 == name }.count }
    }

    let verifier: SignedDataVerifier
    let cache: RevocationCache
    let events = Events()

    init(
        _ pki: TestPKI, mode: RevocationSettings.Mode, clockOffset: Int64 = 0, clock: TestClock? = nil,
        chainCache: ChainCache? = ChainCache(capacity: 16), maxAgeMillis: Int64 = 24 * 3_600_000
    ) {
        let offset = clockOffset
        let now: @Sendable () -> Int64 = {
            SignedDataVerifier.systemNowMillis() + offset + (clock?.shift.load(ordering: .relaxed) ?? 0)
        }
        let fetcher = OCSPHTTPFetcher(timeout: .seconds(1))
        let events = self.events
        cache = RevocationCache(
            settings: RevocationSettings(mode: mode, maxAgeMillis: maxAgeMillis, failureRetryMillis: 200),
            fetch: { await fetcher.fetch(request: $0, uri: $1) }, now: now, observe: { events.add($0) })
        // Validation time "now" on the same clock, so the chain is checked at the (shifted) time of the answers.
        verifier = SignedDataVerifier(
            policy: try! pki.policy(validationTime: .now), chainCache: chainCache, now: now,
            revocation: RevocationChecker(cache: cache))
    }

    func expectFailure(_ jws: String) -> VerificationError? {
        do {
            _ = try verifier.verify(jws)
            Issue.record("verified; expected a failure")
            return nil
        } catch {
            return error
        }
    }
}
