import AppStoreVerification
import ArgumentParser
import FleetTestPKI
import Foundation

/// `fleet bench verify`: verification throughput on generated Apple-shaped data, against raw swift-crypto ES256.
struct BenchVerify: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "verify",
        abstract: "Measure JWS verification throughput (warm cache, notifications, uncached, raw ES256).",
        discussion: """
            Prints one JSON object: threads, transactions_per_s, notifications_per_s, uncached_transactions_per_s, \
            raw_es256_verifies_per_s, cache_hit_ratio (plus the ratios to raw). Targets on one thread: \
            transactions_per_s >= 0.85 x raw_es256_verifies_per_s, notifications_per_s >= 0.85 x raw / 3; \
            with --compare-threads N, also N threads >= 0.9 x N x one thread. Build with -c release.
            """
    )

    @Option(help: "Seconds per phase.") var seconds: Double = 3
    @Option(help: "Threads.") var threads: Int = 1
    @Flag(help: "Also run one thread and report scaling and whether the targets are met.")
    var checkTargets = false

    func run() throws {
        let workload = try VerifyBenchmark.Workload()
        let result = VerifyBenchmark.run(workload: workload, seconds: seconds, threads: threads, cache: ChainCache())
        var object = try JSONValue.parse(bytes: Array(try JSONEncoder().encode(result)))
        if checkTargets, case .object(var o) = object {
            let single =
                threads == 1 ? result : VerifyBenchmark.run(workload: workload, seconds: seconds, threads: 1, cache: ChainCache())
            var checks: [String: JSONValue] = [
                "single_thread_transactions_per_s": .number(single.transactions_per_s),
                "single_thread_transactions_vs_raw": .number(single.transactions_vs_raw),
                "single_thread_notifications_vs_raw_third": .number(single.notifications_vs_raw_third),
                "transactions_target_met": .bool(single.transactions_vs_raw >= 0.85),
                "notifications_target_met": .bool(single.notifications_vs_raw_third >= 0.85),
            ]
            if threads > 1 {
                let scaling = result.transactions_per_s / max(1, single.transactions_per_s)
                checks["scaling"] = .number((scaling * 1000).rounded() / 1000)
                checks["scaling_target_met"] = .bool(scaling >= 0.9 * Double(threads))
            }
            o["checks"] = .object(checks)
            object = .object(o)
        }
        print(object.serialized(sortedKeys: true))
    }
}
