import FleetDevStack
import Foundation

/// The embedded Kafka cluster of a benchmark: in a child `fleet dev-kafka` when the `fleet` binary is known (its
/// memory, e.g. a topic of 100,000 events, is then not counted as the measured process's), else in this process.
final class BenchCluster {
    let bootstrapServers: String
    private let embedded: EmbeddedKafkaCluster?
    private let child: Process?

    var isChild: Bool { child != nil }

    init(executable: String?, topics: [String: Int]) throws {
        guard let executable else {
            let cluster = try EmbeddedKafkaCluster(brokers: 1)
            for (topic, partitions) in topics { try cluster.createTopic(topic, partitions: partitions) }
            embedded = cluster
            child = nil
            bootstrapServers = cluster.bootstrapServers
            return
        }
        // `fleet dev-kafka` gives every topic the same partition count: the largest asked for.
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = ["dev-kafka", "--brokers", "1", "--partitions", String(topics.values.max() ?? 1), "--no-retention-watch"]
            + topics.keys.sorted().flatMap { ["--topic", $0] }
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        try process.run()
        // The first stdout line is `bootstrap.servers=...`; EOF first means the child failed.
        var line: [UInt8] = []
        let reader = out.fileHandleForReading
        while line.count < 4096 {
            let byte = reader.readData(ofLength: 1)
            if byte.isEmpty || byte[byte.startIndex] == 10 { break }
            line.append(byte[byte.startIndex])
        }
        let text = String(decoding: line, as: UTF8.self)
        let prefix = "bootstrap.servers="
        guard text.hasPrefix(prefix) else {
            if process.isRunning { process.terminate() }
            throw ValidationError("fleet dev-kafka did not start (first line: \(text.isEmpty ? "none" : text))")
        }
        bootstrapServers = String(text.dropFirst(prefix.count))
        embedded = nil
        child = process
    }

    /// The child's peak resident memory in MB (0 in process: it is the bench process's).
    var peakRSSMegabytes: Double {
        guard let child, child.isRunning else { return 0 }
        return FleetBenchmarks.peakRSSMegabytes(pid: child.processIdentifier)
    }

    func shutdown() {
        embedded?.shutdown()
        if let child, child.isRunning {
            child.terminate()
            child.waitUntilExit()
        }
    }
}
