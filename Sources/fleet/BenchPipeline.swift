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

    @Option(help: "Steady rate for the latency phase (default: 50% of the 3,000/s target).")
    var rate = 1500

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
        let result = try await bench.run()
        print("end to end: \(Int(result.events_per_s)) notifications/s (target >= 3000); at \(result.latency_rate_per_s)/s: p50 \(result.p50_ms) ms, p99 \(result.p99_ms) ms (target p99 < 500 ms); single-thread verify-only \(Int(result.verify_notifications_per_s_single_thread))/s")
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        print(String(decoding: try encoder.encode(result), as: UTF8.self))
    }
}
