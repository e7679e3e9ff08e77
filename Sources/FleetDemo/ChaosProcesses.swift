import FleetDevStack
import FleetOperations
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// One `fleet` child process of the chaos soak that can be SIGKILLed and started again. Every incarnation logs to
/// its own file, `<directory>/<name>.<incarnation>.log` (JSON logs, stdout and stderr), so that nothing a killed
/// process printed is lost to the checks that read the logs. Used from one task at a time.
final class ChaosChild: @unchecked Sendable {
    let name: String
    private let executable: String
    private let directory: String
    /// The arguments for a given metrics port (a fresh port per incarnation).
    private let arguments: @Sendable (Int) -> [String]
    private(set) var process: Process?
    private(set) var incarnation = 0
    private(set) var port = 0

    init(name: String, executable: String, directory: String, arguments: @escaping @Sendable (Int) -> [String]) {
        self.name = name
        self.executable = executable
        self.directory = directory
        self.arguments = arguments
    }

    var isRunning: Bool { process?.isRunning ?? false }
    var pid: Int32 { process?.processIdentifier ?? 0 }

    /// Starts a new incarnation; returns its pid.
    @discardableResult
    func start() throws -> Int32 {
        incarnation += 1
        port = Loopback.freePort()
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = arguments(port)
        let log = "\(directory)/\(name).\(incarnation).log"
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: log))
        p.standardOutput = handle
        p.standardError = handle
        p.standardInput = FileHandle.nullDevice
        var env = ProcessInfo.processInfo.environment
        env["FLEET_CONFIG"] = nil
        env["FLEET_LOG_FORMAT"] = "json"
        p.environment = env
        try p.run()
        process = p
        return p.processIdentifier
    }

    /// SIGKILL, then waits (up to 15 s) until the process is gone.
    func kill9() async {
        guard let p = process, p.isRunning else { return }
        kill(p.processIdentifier, SIGKILL)
        await waitExit(p, timeout: .seconds(15))
    }

    /// SIGTERM, SIGKILL after `grace`.
    func stop(grace: Duration = .seconds(15)) async {
        guard let p = process, p.isRunning else { return }
        kill(p.processIdentifier, SIGTERM)
        await waitExit(p, timeout: grace)
        if p.isRunning {
            kill(p.processIdentifier, SIGKILL)
            await waitExit(p, timeout: .seconds(5))
        }
    }

    /// After a SIGKILL sent elsewhere: waits (at most 5 s) until the process is gone.
    func waitStopped() async {
        if let p = process { await waitExit(p, timeout: .seconds(5)) }
    }

    private func waitExit(_ p: Process, timeout: Duration) async {
        let deadline = ContinuousClock.now + timeout
        while p.isRunning && ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(20)) }
    }

    /// `/readyz` answers 200.
    var isReady: Bool { isRunning && HTTPProbe.get(port: port, path: "/readyz")?.status == 200 }
}

/// Runs blocking work (pg_ctl) off the cooperative thread pool.
func offloaded<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread { continuation.resume(with: Result { try body() }) }
    }
}

/// SplitMix64: the chaos controller's seeded choices.
struct ChaosRandom {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    mutating func uniform(_ range: ClosedRange<Double>) -> Double {
        range.lowerBound + (range.upperBound - range.lowerBound) * Double(next() % 1_000_001) / 1_000_000
    }
    mutating func pick(_ n: Int) -> Int { Int(next() % UInt64(max(1, n))) }
    mutating func shuffled<T>(_ items: [T]) -> [T] {
        var a = items
        for i in stride(from: a.count - 1, to: 0, by: -1) { a.swapAt(i, pick(i + 1)) }
        return a
    }
}
