import AppStoreVerification
import FleetBenchmarks
import Testing

@Suite struct VerifyBenchmarkRuns {
    @Test func benchmarkRunsAndEveryOperationSucceeds() throws {
        let cache = ChainCache()
        let r = try VerifyBenchmark.run(seconds: 0.25, threads: 1, cache: cache)
        #expect(r.transactions_per_s > 0)
        #expect(r.notifications_per_s > 0)
        #expect(r.uncached_transactions_per_s > 0)
        #expect(r.raw_es256_verifies_per_s > 0)
        #expect(r.raw_notification_inputs_per_s > 0, "the three signing inputs of each notification verify with the leaf key")
        #expect(r.cache_hit_ratio == 1)
        #expect(cache.misses == 1)
    }
}
