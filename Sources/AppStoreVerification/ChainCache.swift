import Crypto
import Synchronization
import X509

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A verified certificate chain: what a cache hit needs to check a message without touching the certificates again.
public struct VerifiedChain: Sendable {
    /// The leaf's P-256 key (the chain was fully verified when this entry was made); nil for a chain whose leaf key
    /// is of another type (RSA receipt signers), see `leafCertificateKey`.
    public let leafKey: P256.Signing.PublicKey?
    /// The leaf's key as swift-certificates holds it (set for chains verified by `AppleChainVerifier`).
    public let leafCertificateKey: Certificate.PublicKey?
    /// Intersection of the leaf, intermediate and anchoring root validity windows, in ms since the epoch (inclusive).
    public let notBeforeMillis: Int64
    public let notAfterMillis: Int64
    /// SHA-256 of the DER of the configured root that anchored the chain.
    public let rootFingerprint: [UInt8]
    /// The verified path (leaf first, the anchoring root last), kept for revocation checks; empty when unknown.
    public let certificates: [Certificate]
    /// How fresh the chain's revocation answers are (shared by every copy of this entry; unused when checks are off).
    public let revocation: RevocationStamp

    public init(
        leafKey: P256.Signing.PublicKey, notBeforeMillis: Int64, notAfterMillis: Int64, rootFingerprint: [UInt8],
        certificates: [Certificate] = []
    ) {
        self.leafKey = leafKey
        self.leafCertificateKey = nil
        self.notBeforeMillis = notBeforeMillis
        self.notAfterMillis = notAfterMillis
        self.rootFingerprint = rootFingerprint
        self.certificates = certificates
        self.revocation = RevocationStamp()
    }

    public init(
        leafCertificateKey: Certificate.PublicKey, notBeforeMillis: Int64, notAfterMillis: Int64, rootFingerprint: [UInt8],
        certificates: [Certificate] = []
    ) {
        self.leafKey = P256.Signing.PublicKey(leafCertificateKey)
        self.leafCertificateKey = leafCertificateKey
        self.notBeforeMillis = notBeforeMillis
        self.notAfterMillis = notAfterMillis
        self.rootFingerprint = rootFingerprint
        self.certificates = certificates
        self.revocation = RevocationStamp()
    }

    @inline(__always) public func isValid(atMillis t: Int64) -> Bool { t >= notBeforeMillis && t <= notAfterMillis }
}

/// The exact bytes a chain is cached under, with a precomputed hash (computed outside the cache lock).
public struct ChainCacheKey: Hashable, Sendable {
    public let bytes: [UInt8]
    let hash: UInt64

    public init(bytes: [UInt8]) {
        self.bytes = bytes
        self.hash = bytes.withUnsafeBufferPointer { ChainCacheKey.fastHash($0) }
    }

    public init(_ buffer: UnsafeBufferPointer<UInt8>) {
        self.bytes = Array(buffer)
        self.hash = ChainCacheKey.fastHash(buffer)
    }

    public static func == (a: ChainCacheKey, b: ChainCacheKey) -> Bool {
        guard a.hash == b.hash, a.bytes.count == b.bytes.count else { return false }
        return a.bytes.withUnsafeBytes { pa in
            b.bytes.withUnsafeBytes { pb in
                pa.count == 0 || memcmp(pa.baseAddress!, pb.baseAddress!, pa.count) == 0
            }
        }
    }

    public func hash(into hasher: inout Hasher) { hasher.combine(hash) }

    /// A fast non-cryptographic hash of the length and (for long keys) two 1 KiB windows: the start (where the leaf
    /// certificate's serial number and key are) and the middle. Equality always compares every byte; collisions only
    /// cost that comparison, and only verified chains are ever inserted, so attacker-chosen keys cannot crowd a bucket.
    static func fastHash(_ p: UnsafeBufferPointer<UInt8>) -> UInt64 {
        let window = 1024
        if p.count <= 2 * window { return hashBytes(p, seed: UInt64(p.count)) }
        let mid = p.count / 2 - window / 2
        let a = hashBytes(UnsafeBufferPointer(rebasing: p[0..<window]), seed: UInt64(p.count))
        return hashBytes(UnsafeBufferPointer(rebasing: p[mid..<(mid + window)]), seed: a)
    }

    /// Four independent multiply lanes over 32-byte blocks (one lane's chain of dependent multiplies was the
    /// bound), then the remaining words and the tail into the first lane, and the lanes folded together.
    static func hashBytes(_ p: UnsafeBufferPointer<UInt8>, seed: UInt64) -> UInt64 {
        let m: UInt64 = 0x5173_9D2B_C8E1_A7F3
        var h0: UInt64 = 0x9E37_79B9_7F4A_7C15 ^ seed
        var h1: UInt64 = h0 &+ 0x243F_6A88_85A3_08D3
        var h2: UInt64 = h0 &+ 0x1319_8A2E_0370_7344
        var h3: UInt64 = h0 &+ 0xA409_3822_299F_31D0
        let n = p.count
        var k = 0
        if let base = p.baseAddress {
            let raw = UnsafeRawPointer(base)
            while k + 32 <= n {
                h0 = (h0.rotatedLeft(5) ^ raw.loadUnaligned(fromByteOffset: k, as: UInt64.self)) &* m
                h1 = (h1.rotatedLeft(5) ^ raw.loadUnaligned(fromByteOffset: k + 8, as: UInt64.self)) &* m
                h2 = (h2.rotatedLeft(5) ^ raw.loadUnaligned(fromByteOffset: k + 16, as: UInt64.self)) &* m
                h3 = (h3.rotatedLeft(5) ^ raw.loadUnaligned(fromByteOffset: k + 24, as: UInt64.self)) &* m
                k += 32
            }
            while k + 8 <= n {
                h0 = (h0.rotatedLeft(5) ^ raw.loadUnaligned(fromByteOffset: k, as: UInt64.self)) &* m
                k += 8
            }
            var tail: UInt64 = 0
            var s: UInt64 = 0
            while k < n {
                tail |= UInt64(p[k]) << s
                s += 8
                k += 1
            }
            h0 = (h0.rotatedLeft(5) ^ tail) &* m
        }
        var h = h0 ^ h1.rotatedLeft(17) ^ h2.rotatedLeft(31) ^ h3.rotatedLeft(47)
        h = (h ^ h >> 32) &* m
        h ^= h >> 29
        return h
    }
}

extension UInt64 {
    @inline(__always) func rotatedLeft(_ n: UInt64) -> UInt64 { (self << n) | (self >> (64 - n)) }
}

/// A bounded, thread-safe LRU cache of verified chains shared by every thread of a process.
///
/// Keys are exact bytes: the verifier uses the exact JWS header segment (which fixes `alg` and every x5c entry) and
/// the exact `x5c[0]` + `x5c[1]` strings, and for legacy receipts the SignerInfo's sid plus the exact DER of the
/// SignedData's certificate set (RSA leaf keys are kept as `leafCertificateKey`), or the sid plus the exact base64
/// characters of that set (the receipt fast path, `ReceiptFastPath.swift`); an entry also records which configured root anchored it, and a hit is only
/// used when that root is trusted by the verifier's policy. A hit never replaces the per-message checks: the
/// message's validation time is checked against the entry's window and its signature against the entry's key.
/// The lock is held only for a hash-table probe and a counter update.
public final class ChainCache: Sendable {
    struct Slot {
        var chain: VerifiedChain
        var lastUsed: UInt64
    }

    struct State {
        var entries: [ChainCacheKey: Slot] = [:]
        var clock: UInt64 = 0
        var hits: Int = 0
        var misses: Int = 0
        var evictions: Int = 0
    }

    public let capacity: Int
    private let state: Mutex<State>

    public init(capacity: Int = 1024) {
        self.capacity = max(1, capacity)
        self.state = Mutex(State())
    }

    /// Looks a key up, counting a hit / a miss as asked (the verifier probes two keys per message and counts one).
    public func lookup(_ key: ChainCacheKey, countHit: Bool = true, countMiss: Bool = true) -> VerifiedChain? {
        state.withLock { s in
            s.clock &+= 1
            let now = s.clock
            if let idx = s.entries.index(forKey: key) {
                s.entries.values[idx].lastUsed = now
                if countHit { s.hits += 1 }
                return s.entries.values[idx].chain
            }
            if countMiss { s.misses += 1 }
            return nil
        }
    }

    /// Inserts (or refreshes) an entry, evicting the least recently used one when full.
    public func insert(_ key: ChainCacheKey, _ chain: VerifiedChain) {
        state.withLock { s in
            s.clock &+= 1
            let now = s.clock
            if s.entries[key] == nil && s.entries.count >= capacity {
                // O(capacity) scan, only on insertion (which follows two P-384 verifications anyway).
                var oldestKey: ChainCacheKey?
                var oldest = UInt64.max
                for (k, v) in s.entries where v.lastUsed < oldest {
                    oldest = v.lastUsed
                    oldestKey = k
                }
                if let oldestKey {
                    s.entries.removeValue(forKey: oldestKey)
                    s.evictions += 1
                }
            }
            s.entries[key] = Slot(chain: chain, lastUsed: now)
        }
    }

    func recordHit() { state.withLock { $0.hits += 1 } }
    func recordMiss() { state.withLock { $0.misses += 1 } }

    public var hits: Int { state.withLock { $0.hits } }
    public var misses: Int { state.withLock { $0.misses } }
    public var count: Int { state.withLock { $0.entries.count } }
    public var evictions: Int { state.withLock { $0.evictions } }

    /// Drops every entry (counters are kept).
    public func removeAll() { state.withLock { $0.entries.removeAll() } }
}
