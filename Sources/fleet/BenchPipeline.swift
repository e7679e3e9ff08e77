import ArgumentParser
import FleetBenchmarks
import FleetDemo
import FleetDevStack
import FleetOperations
import Foundation

/// `fleet bench pipeline`: end-to-end events/s and latency of the demo stack, beside the verify-only reference.
struct BenchPipeline: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pipeline",
        abstract: "Measure end-to-end throughput (published -> row in PostgreSQL) and latency of the whole stack.")

    @Option(help: "Worker processes.")
    var workers = 2

    @Option(help: "Writers of the sink process (`fleet sink --writers`).")
    var sinkWriters = 1

    @Option(help: "Notifications in the throughput burst.")
    var burst = 30_000

    @Option(help: "Steady rate for the latency phase (default: 50% of the 4,000/s target).")
    var rate = 2000

    @Option(help: "Seconds of the latency phase.")
    var seconds = 10

    func run() async throws {
        FleetLogging.bootstrap(format: "text", level: "warning")
        let reference = try VerifyBenchmark.run(seconds: 3, threads: 1)
        var bench = PipelineBenchmark(executable: currentExecutable(), verifyReference: reference.notifications_per_s)
        bench.workers = max(1, workers)
        bench.sinkWriters = max(1, sinkWriters)
        bench.burst = max(100, burst)
        bench.latencyRate = max(1, rate)
        bench.latencySeconds = max(1, seconds)
        var result = try await bench.run()
        result.checks = [
            "throughput_target_met": result.events_per_s >= 4_000,
            "p99_target_met": result.p99_ms < 300 && result.latency_rate_per_s >= 2_000,
        ]
        print("end to end: \(Int(result.events_per_s)) notifications/s (target >= 4000); at \(result.latency_rate_per_s)/s: p50 \(result.p50_ms) ms, p99 \(result.p99_ms) ms (target p99 < 300 ms at 2,000/s); single-thread verify-only \(Int(result.verify_notifications_per_s_single_thread))/s")
        func share(_ pct: Double?) -> String { pct.map { "\($0) %" } ?? "unknown" }
        print("machine idle: \(share(result.burst_idle_pct)) in the burst, \(share(result.latency_idle_pct)) in the latency phase")
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        print(String(decoding: try encoder.encode(result), as: UTF8.self))
    }
}
