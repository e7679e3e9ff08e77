import ArgumentParser
import FleetDevStack
import FleetDemo
import FleetOperations
import Foundation

/// `fleet demo`: the whole pipeline on embedded defaults (mock Kafka cluster, throwaway PostgreSQL), as processes.
struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the whole fleet on embedded defaults with generated App Store traffic, then summarise.")

    @Option(help: "Verifier worker processes.")
    var workers = 2

    @Option(help: "Writers of the sink process (`fleet sink --writers`).")
    var sinkWriters = 1

    @Option(help: "Simulated subscribers.")
    var subscribers = 300

    @Option(help: "Simulated months of subscription life.")
    var months = 6

    @Option(help: "Consumable (ticket) buyers.")
    var ticketBuyers = 120

    @Option(help: "Inputs published per second.")
    var rate = 1500

    @Option(help: "Random seed of the traffic generator.")
    var seed: UInt64 = 42

    @Flag(help: "Keep the stack running after the summary, until Ctrl-C.")
    var keepRunning = false

    @Flag(help: "Keep the work directory with every process's log after a run that succeeded (a failed run always keeps it).")
    var keepLogs = false

    func run() async throws {
        // The live display is the output; library logs (Kafka client, PostgreSQL) only when something goes wrong.
        FleetLogging.bootstrap(format: "text", level: "warning")
        var options = DemoRunner.Options(executable: currentExecutable())
        options.workers = max(1, workers)
        options.threadsPerWorker = max(1, ProcessInfo.processInfo.activeProcessorCount / options.workers)
        options.ratePerSecond = max(1, rate)
        options.sinkWriters = max(1, sinkWriters)
        options.keepRunning = keepRunning
        options.keepLogs = keepLogs
        options.traffic.subscribers = max(1, subscribers)
        options.traffic.months = max(1, months)
        options.traffic.ticketBuyers = max(0, ticketBuyers)
        options.traffic.seed = seed
        do {
            _ = try await DemoRunner(options: options).run()
        } catch {
            FileHandle.standardError.write(Data("demo failed: \(error)\n".utf8))
            throw ExitCode(1)
        }
    }
}
