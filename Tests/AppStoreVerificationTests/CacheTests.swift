import AppStoreVerification
import Crypto
import Foundation
import FleetTestPKI
import Testing

@Suite struct ChainCacheTests {
    @Test func hitsAfterTheFirstVerification() throws {
        let cache = ChainCache(capacity: 16)
        let v = Fixtures.verifier(cache: cache)
        let pki = Fixtures.pki
        _ = try v.verify(pki.sign(Fixtures.transaction()))
        #expect(cache.misses == 1)
        #expect(cache.hits == 0)
        for _ in 0..<5 { _ = try v.verify(pki.sign(Fixtures.transaction())) }
        #expect(cache.misses == 1)
        #expect(cache.hits == 5)
        // A notification with two nested JWS on the same chain: three hits.
        let tx = Fixtures.transaction()
        let renewal = TestPayloads.renewalInfo(originalTransactionId: "2000000000000001", signedDate: Fixtures.t0)
        _ = try v.verify(pki.signNotification(type: .didRenew, transaction: tx, renewal: renewal, signedDate: Fixtures.t0))
        #expect(cache.hits == 8)
        #expect(cache.misses == 1)
    }

    @Test func aChainDifferingOnlyInTheIntermediateMisses() throws {
        let cache = ChainCache(capacity: 16)
        let v = Fixtures.verifier(cache: cache)
        let pki = Fixtures.pki
        _ = try v.verify(pki.sign(Fixtures.transaction()))
        // Same leaf key and root, another intermediate (re-issued leaf): different bytes, so a miss.
        let other = try pki.withNewIntermediate()
        _ = try v.verify(other.sign(Fixtures.transaction()))
        #expect(cache.misses == 2)
        // Same leaf certificate, but x5c[1] swapped for a different intermediate: must miss and fail, not hit.
        let swapped = pki.sign(Fixtures.transaction(), header: .init(x5c: [pki.x5c[0], other.x5c[1], pki.x5c[2]]))
        expectRejected(.untrustedChain) { () throws(VerificationError) in _ = try v.verify(swapped) }
        #expect(cache.misses == 3)
    }

    @Test func aCachedChainStillChecksEachMessagesTime() throws {
        let cache = ChainCache(capacity: 16)
        let v = Fixtures.verifier(cache: cache)
        let leaf = try Fixtures.pki.withLeafValidity(
            Date(timeIntervalSince1970: 1_700_000_000), Date(timeIntervalSince1970: 1_760_000_000))
        _ = try v.verify(leaf.sign(Fixtures.transaction(signedDate: Fixtures.t0)))
        #expect(cache.count >= 1)
        let hitsBefore = cache.hits
        expectRejected(.certificateNotValidAtTime) { () throws(VerificationError) in
            _ = try v.verify(leaf.sign(Fixtures.transaction(signedDate: 1_760_000_001_000)))
        }
        expectRejected(.certificateNotValidAtTime) { () throws(VerificationError) in
            _ = try v.verify(leaf.sign(Fixtures.transaction(signedDate: 1_699_999_999_000)))
        }
        #expect(cache.hits == hitsBefore + 2, "the rejections must come from cache hits")
        // And its own signature.
        let tampered = flipCharacter(leaf.sign(Fixtures.transaction()), segment: 2, at: 5)
        expectRejected(.invalidSignature) { () throws(VerificationError) in _ = try v.verify(tampered) }
    }

    @Test func entriesAnchoredByAnotherRootAreNotUsed() throws {
        let cache = ChainCache(capacity: 16)
        let a = Fixtures.verifier(cache: cache)
        let otherPKI = try TestPKI()
        let b = Fixtures.verifier(otherPKI, cache: cache)
        let jws = Fixtures.pki.sign(Fixtures.transaction())
        _ = try a.verify(jws)
        expectRejected(.untrustedChain) { () throws(VerificationError) in _ = try b.verify(jws) }
    }

    @Test func boundedUnderTenThousandDistinctChains() {
        let cache = ChainCache(capacity: 256)
        let key = P256.Signing.PrivateKey().publicKey
        for k in 0..<10_000 {
            var bytes = Array("leaf-\(k)|intermediate".utf8)
            bytes.append(contentsOf: (0..<64).map { UInt8(truncatingIfNeeded: $0 &+ k) })
            let entry = VerifiedChain(leafKey: key, notBeforeMillis: 0, notAfterMillis: .max, rootFingerprint: [1])
            cache.insert(ChainCacheKey(bytes: bytes), entry)
            if k % 1000 == 0 { #expect(cache.count <= 256) }
        }
        #expect(cache.count == 256)
        #expect(cache.evictions == 10_000 - 256)
        // The most recent entries survive (LRU), the oldest are gone.
        var recent = Array("leaf-9999|intermediate".utf8)
        recent.append(contentsOf: (0..<64).map { UInt8(truncatingIfNeeded: $0 &+ 9999) })
        #expect(cache.lookup(ChainCacheKey(bytes: recent)) != nil)
        var old = Array("leaf-0|intermediate".utf8)
        old.append(contentsOf: (0..<64).map { UInt8(truncatingIfNeeded: $0) })
        #expect(cache.lookup(ChainCacheKey(bytes: old)) == nil)
    }

    @Test func leastRecentlyUsedIsEvictedFirst() {
        let cache = ChainCache(capacity: 2)
        let key = P256.Signing.PrivateKey().publicKey
        let e = VerifiedChain(leafKey: key, notBeforeMillis: 0, notAfterMillis: .max, rootFingerprint: [1])
        let a = ChainCacheKey(bytes: [1]), b = ChainCacheKey(bytes: [2]), c = ChainCacheKey(bytes: [3])
        cache.insert(a, e)
        cache.insert(b, e)
        _ = cache.lookup(a)
        cache.insert(c, e)
        #expect(cache.lookup(a) != nil)
        #expect(cache.lookup(b) == nil)
        #expect(cache.lookup(c) != nil)
    }

    @Test func boundedThroughTheVerifierWithManyLeaves() throws {
        let cache = ChainCache(capacity: 8)
        let v = Fixtures.verifier(cache: cache)
        for _ in 0..<30 {
            let leaf = try Fixtures.pki.withNewLeaf()
            _ = try v.verify(leaf.sign(Fixtures.transaction()))
            #expect(cache.count <= 8)
        }
        #expect(cache.misses == 30)
    }

    @Test func concurrentVerificationSharesTheCache() async throws {
        let cache = ChainCache(capacity: 64)
        let v = Fixtures.verifier(cache: cache)
        let pki = Fixtures.pki
        let inputs = (0..<40).map { _ in pki.sign(Fixtures.transaction()) }
        let bad = flipCharacter(inputs[0], segment: 2)
        try await withThrowingTaskGroup(of: Int.self) { group in
            for t in 0..<4 {
                group.addTask {
                    var ok = 0
                    for (i, s) in inputs.enumerated() where (i + t) % 2 == 0 {
                        if (try? v.verify(s)) != nil { ok += 1 }
                        if (try? v.verify(bad)) != nil { return -1 }
                    }
                    return ok
                }
            }
            for try await n in group { #expect(n == 20) }
        }
        #expect(cache.misses >= 1 && cache.misses <= 4)
        #expect(cache.hits + cache.misses == 160)
    }
}
