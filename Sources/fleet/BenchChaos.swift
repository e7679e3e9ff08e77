import ArgumentParser
import FleetDemo
import FleetDevStack
import FleetOperations
import Foundation

/// `fleet bench chaos`: the chaos soak (see `ChaosSoak`): faults under steady traffic, then checks that nothing was
/// lost, nothing applied twice and no offset was reset. Exit 1 when a check fails.
struct BenchChaos: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "chaos",
        abstract: "Chaos soak: kill workers and the sink, take brokers down, restart and stall PostgreSQL under traffic; then check nothing was lost.",
        discussion: """
            Starts an embedded 3-broker cluster, a throwaway PostgreSQL, `fleet worker` processes and `fleet sink`, \
            publishes demo traffic (lifecycles, consumables, bad inputs) for --minutes while a seeded controller injects \
            one fault every few seconds, waits until every lag is 0, then checks: every input verified (its events in \
            the database exactly once) or rejected (on the rejected topic), tables equal to a calm run over the same \
            inputs, no consumable credited twice, no offset reset. Prints a line per fault and per check, then a JSON \
            line; exits 1 when a check fails.
            """)

    @Option(help: "Minutes of traffic and faults.")
    var minutes = 5.0

    @Option(help: "Seed of the traffic and of the fault schedule.")
    var seed: UInt64 = 1

    @Option(help: "Partitions of the raw and result topics.")
    var partitions = 16

    @Option(help: "Worker processes (at least 2).")
    var workers = 2

    @Option(help: "Inputs per second (the traffic is sized to last --minutes at this rate).")
    var rate = 40

    @Option(help: "Shortest pause between two faults, seconds.")
    var minFaultGap = 3.0

    @Option(help: "Longest pause between two faults, seconds.")
    var maxFaultGap = 8.0

    @Option(help: "Longest stall of the sink's database connection, seconds (over 30 reaches the sink's batch timeout).")
    var maxStall = 8.0

    @Option(help: "Seconds to wait for every lag to reach 0 after the last fault.")
    var drainTimeout = 600

    @Flag(help: "Keep the work directory (process logs) even when every check passed.")
    var keepLogs = false

    func validate() throws {
        guard minutes > 0 else { throw ValidationError("--minutes must be > 0") }
        guard workers >= 2 else { throw ValidationError("--workers must be at least 2") }
        guard partitions >= 1, rate >= 1, drainTimeout >= 1 else { throw ValidationError("--partitions, --rate and --drain-timeout must be >= 1") }
        guard minFaultGap > 0, maxFaultGap >= minFaultGap else { throw ValidationError("need 0 < --min-fault-gap <= --max-fault-gap") }
        guard maxStall >= 3 else { throw ValidationError("--max-stall must be at least 3 seconds") }
    }

    func run() async throws {
        FleetLogging.bootstrap(format: "text", level: "warning")
        var options = ChaosSoak.Options(executable: currentExecutable())
        options.minutes = minutes
        options.seed = seed
        options.partitions = partitions
        options.workers = workers
        options.rate = rate
        options.faultGap = minFaultGap...maxFaultGap
        options.maxStall = maxStall
        options.drainTimeout = .seconds(drainTimeout)
        options.keepLogs = keepLogs
        let report = try await ChaosSoak(options: options).run()
        if !report.passed { throw ExitCode(1) }
    }
}
