import ArgumentParser

/// `fleet bench ...`: in-process benchmarks.
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench",
        abstract: "Benchmarks.",
        subcommands: [BenchVerify.self, BenchKafka.self, BenchWorker.self, BenchSink.self, BenchPipeline.self,
                      BenchIngest.self, BenchChaos.self]
    )
}
