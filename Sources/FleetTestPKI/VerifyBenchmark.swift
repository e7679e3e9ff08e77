import AppStoreVerification
import Crypto
import Dispatch
import Foundation

/// The `fleet bench verify` measurement: generated Apple-shaped data, verified in process.
public enum VerifyBenchmark {
    public struct Result: Sendable, Codable {
        public var threads: Int
        public var seconds: Double
        /// Warm cache, one signed transaction per verification.
        public var transactions_per_s: Double
        /// Outer notification + nested transaction + nested renewal info per verification.
        public var notifications_per_s: Double
        /// Cache disabled (two P-384 certificate checks per transaction).
        public var uncached_transactions_per_s: Double
        /// swift-crypto P-256 verify of the same signing input (SHA-256 + ECDSA), same threads.
        public var raw_es256_verifies_per_s: Double
        /// Hits / (hits + misses) of the shared chain cache over the warm-cache phases.
        public var cache_hit_ratio: Double
        /// transactions_per_s / raw_es256_verifies_per_s (target >= 0.85 with one thread).
        public var transactions_vs_raw: Double
        /// notifications_per_s / (raw / 3) (target >= 0.85 with one thread).
        public var notifications_vs_raw_third: Double
    }

    /// Generated inputs shared by the phases.
    public struct Workload: Sendable {
        public let pki: TestPKI
        public let transactions: [[UInt8]]
        public let notifications: [[UInt8]]
        public let policy: VerificationPolicy

        public init(count: Int = 64) throws {
            let pki = try TestPKI()
            self.pki = pki
            let now = TestPayloads.nowMillis()
            var txs: [[UInt8]] = []
            var notes: [[UInt8]] = []
            for k in 0..<count {
                let t = TestPayloads.transaction(
                    transactionId: String(2_000_000_000_000_000 + k), purchaseDate: now - 86_400_000,
                    environment: .production, signedDate: now)
                txs.append(Array(pki.sign(t).utf8))
                let r = TestPayloads.renewalInfo(
                    originalTransactionId: String(2_000_000_000_000_000 + k), environment: .production, signedDate: now)
                notes.append(
                    Array(
                        pki.signNotification(
                            type: .didRenew, transaction: t, renewal: r, environment: .production, signedDate: now
                        ).utf8))
            }
            self.transactions = txs
            self.notifications = notes
            self.policy = try pki.policy(environments: [.production])
        }
    }

    /// Runs every phase for `seconds` each on `threads` threads. `cache` is the shared chain cache for the warm phases.
    public static func run(seconds: Double, threads: Int, cache: ChainCache = ChainCache(capacity: 1024)) throws -> Result {
        let w = try Workload()
        return run(workload: w, seconds: seconds, threads: threads, cache: cache)
    }

    public static func run(workload w: Workload, seconds: Double, threads: Int, cache: ChainCache) -> Result {
        let threads = max(1, threads)
        // Raw ES256 of the same signing inputs.
        let leafKey = w.pki.leafKey.publicKey
        let rawInputs: [([UInt8], P256.Signing.ECDSASignature)] = w.transactions.map { jws in
            let lastDot = jws.lastIndex(of: UInt8(ascii: "."))!
            let sig = Base64.decodeURL(String(decoding: jws[(lastDot + 1)...], as: UTF8.self))!
            return (Array(jws[..<lastDot]), try! P256.Signing.ECDSASignature(rawRepresentation: sig))
        }
        let raw = measure(seconds: seconds, threads: threads) { i in
            let (input, sig) = rawInputs[i % rawInputs.count]
            return leafKey.isValidSignature(sig, for: input)
        }

        let verifier = SignedDataVerifier(policy: w.policy, chainCache: cache)
        _ = try? verifier.verify(w.transactions[0])  // warm the cache
        let hits0 = cache.hits
        let misses0 = cache.misses
        let tx = measure(seconds: seconds, threads: threads) { i in
            (try? verifier.verify(w.transactions[i % w.transactions.count])) != nil
        }
        let notes = measure(seconds: seconds, threads: threads) { i in
            (try? verifier.verify(w.notifications[i % w.notifications.count])) != nil
        }
        let hits = cache.hits - hits0
        let misses = cache.misses - misses0

        let uncachedVerifier = SignedDataVerifier(policy: w.policy, chainCache: nil)
        let uncached = measure(seconds: min(seconds, 2), threads: threads) { i in
            (try? uncachedVerifier.verify(w.transactions[i % w.transactions.count])) != nil
        }
        let ratio = hits + misses == 0 ? 0 : Double(hits) / Double(hits + misses)
        return Result(
            threads: threads, seconds: seconds, transactions_per_s: tx, notifications_per_s: notes,
            uncached_transactions_per_s: uncached, raw_es256_verifies_per_s: raw, cache_hit_ratio: ratio,
            transactions_vs_raw: raw > 0 ? tx / raw : 0, notifications_vs_raw_third: raw > 0 ? notes / (raw / 3) : 0)
    }

    /// Per-thread results, written once per thread under the lock.
    final class Counter: @unchecked Sendable {
        private let lock = NSLock()
        private var counts: [Int]
        private var failures: [Int]
        private var ends: [UInt64]
        init(_ n: Int) {
            counts = Array(repeating: 0, count: n)
            failures = Array(repeating: 0, count: n)
            ends = Array(repeating: 0, count: n)
        }
        func record(_ t: Int, count: Int, failed: Int, end: UInt64) {
            lock.lock()
            counts[t] = count
            failures[t] = failed
            ends[t] = end
            lock.unlock()
        }
        func totals() -> (count: Int, failed: Int, lastEnd: UInt64) {
            lock.lock()
            defer { lock.unlock() }
            return (counts.reduce(0, +), failures.reduce(0, +), ends.max() ?? 0)
        }
    }

    /// Operations per second over `seconds`, summed over `threads` OS threads. Failed operations are not counted.
    static func measure(seconds: Double, threads: Int, _ op: @escaping @Sendable (Int) -> Bool) -> Double {
        let counter = Counter(threads)
        let group = DispatchGroup()
        let start = DispatchTime.now().uptimeNanoseconds
        let deadline = start + UInt64(seconds * 1e9)
        var started: [Thread] = []
        for t in 0..<threads {
            group.enter()
            let thread = Thread {
                var n = 0
                var bad = 0
                var i = t * 7919
                while true {
                    for _ in 0..<32 {
                        if !op(i) { bad += 1 }
                        i &+= 1
                        n += 1
                    }
                    if DispatchTime.now().uptimeNanoseconds >= deadline { break }
                }
                counter.record(t, count: n, failed: bad, end: DispatchTime.now().uptimeNanoseconds)
                group.leave()
            }
            thread.stackSize = 1 << 20
            started.append(thread)
        }
        for th in started { th.start() }
        group.wait()
        let (total, failed, lastEnd) = counter.totals()
        let elapsed = Double(max(lastEnd, deadline) - start) / 1e9
        if failed > 0 { FileHandle.standardError.write(Data("benchmark: \(failed) operations failed\n".utf8)) }
        return (Double(total - failed) / elapsed).rounded()
    }
}
