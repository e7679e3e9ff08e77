import AppStoreVerification
import Foundation
import Synchronization

/// The built `fleet` executable, for tests that run CLI commands or start fleet processes, and the repository's paths.
/// `FLEET_EXECUTABLE` wins when set (CI, a release build); else the `fleet` beside the test bundle (up to four
/// directories up, as SwiftPM lays out `.build/<triple>/debug`), else `<repo>/.build/debug/fleet`.
public enum FleetBinary {
    /// The repository: `<repo>/Sources/FleetTestSupport/FleetBinary.swift`, three levels up.
    public static let repoRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()
    /// The user's fixtures and seeds beside the repository (`../shared`); tests skip when they are absent.
    public static let shared = repoRoot.deletingLastPathComponent().appendingPathComponent("shared")

    public static let path: String? = {
        var candidates: [String] = []
        if let env = ProcessInfo.processInfo.environment["FLEET_EXECUTABLE"], !env.isEmpty { candidates.append(env) }
        var dirs: [URL] = [Bundle.main.bundleURL.deletingLastPathComponent()]
        if let arg0 = CommandLine.arguments.first {
            var dir = URL(fileURLWithPath: arg0).resolvingSymlinksInPath().deletingLastPathComponent()
            for _ in 0..<4 {
                dirs.append(dir)
                dir = dir.deletingLastPathComponent()
            }
        }
        candidates += dirs.map { $0.appendingPathComponent("fleet").path }
        candidates.append(repoRoot.appendingPathComponent(".build/debug/fleet").path)
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0) }
    }()

    public static var url: URL? { path.map { URL(fileURLWithPath: $0) } }
    public static var available: Bool { path != nil }

    public struct NotBuilt: Error, CustomStringConvertible {
        public var description: String { "the fleet executable was not found (set FLEET_EXECUTABLE or run swift build --build-tests)" }
    }

    /// The built binary's URL, or `NotBuilt`.
    public static func require() throws -> URL {
        guard let url else { throw NotBuilt() }
        return url
    }

    public struct Output: Sendable {
        public var status: Int32
        public var stdout: String
        public var stderr: String
        /// How long the process ran, from its start to its exit as the process monitor saw it (not the caller's
        /// wall clock, which a busy cooperative pool can stretch); nil when it was killed at the timeout.
        public var duration: Duration? = nil
        /// Every stdout line that parses as JSON.
        public var lines: [JSONValue] { stdout.split(separator: "\n").compactMap { try? JSONValue.parse(String($0)) } }
        /// The last stdout line, parsed as JSON (benchmarks print their figures there).
        public var lastJSON: JSONValue? { stdout.split(separator: "\n").last.flatMap { try? JSONValue.parse(String($0)) } }
    }

    /// Runs `fleet args...` to completion with `stdin` (closed after it) and returns its status and output.
    public static func run(_ args: [String], stdin: String? = nil, environment: [String: String]? = nil) throws -> Output {
        let p = Process()
        p.executableURL = try require()
        p.arguments = args
        if let environment { p.environment = environment }
        let out = Pipe(), err = Pipe(), input = Pipe()
        p.standardOutput = out
        p.standardError = err
        p.standardInput = input
        try p.run()
        if let stdin { input.fileHandleForWriting.write(Data(stdin.utf8)) }
        try input.fileHandleForWriting.close()
        // stderr on its own thread: a child that fills one pipe while we block on the other would never finish.
        let errData = Collected()
        let reader = Thread { errData.set(err.fileHandleForReading.readDataToEndOfFile()) }
        reader.start()
        let o = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        let e = errData.wait()
        return Output(status: p.terminationStatus, stdout: String(decoding: o, as: UTF8.self), stderr: String(decoding: e, as: UTF8.self))
    }

    /// Runs `fleet args...` to completion, output to files (no pipe can fill up); killed after `timeout` (status -1,
    /// and a line saying so at the end of stderr).
    public static func run(_ args: [String], timeout: Duration, environment: [String: String]? = nil) async throws -> Output {
        let child = try start(args, environment: environment)
        guard let status = await child.waitExit(timeout: timeout) else {
            child.terminate(SIGKILL)
            _ = await child.waitExit(timeout: .seconds(10))
            return Output(status: -1, stdout: child.readStdout(),
                          stderr: child.readStderr() + "\n[killed: fleet \(args.joined(separator: " ")) timed out after \(timeout)]")
        }
        return Output(status: status, stdout: child.readStdout(), stderr: child.readStderr(), duration: child.ranFor)
    }

    /// Starts `fleet args...`: stdout and stderr to files of their own (`firstLine`, `readStdout`, `readStderr`).
    public static func start(_ args: [String], environment: [String: String]? = nil) throws -> ChildProcess {
        try ChildProcess(try require().path, args, environment: environment, separateStdout: true)
    }

    /// Starts `fleet args...` with stdout and stderr together in a log file (`output`).
    public static func spawn(_ args: [String], environment: [String: String]? = nil) throws -> ChildProcess {
        try ChildProcess(try require().path, args, environment: environment)
    }
}

/// A child process started by a test, its output in files (a pipe nobody reads would stall it). Killed with SIGKILL
/// when released while still running.
public final class ChildProcess: @unchecked Sendable {
    public let process = Process()
    /// stdout, when separate.
    public let stdoutFile: URL?
    /// stderr, or stdout and stderr together.
    public let logFile: URL

    /// `environment` is added to this process's environment.
    public init(_ executable: String, _ arguments: [String], environment: [String: String]? = nil, separateStdout: Bool = false) throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("fleet-test-\(UUID().uuidString)")
        logFile = base.appendingPathExtension("log")
        _ = FileManager.default.createFile(atPath: logFile.path, contents: nil)
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        if let environment { process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
        let log = try FileHandle(forWritingTo: logFile)
        if separateStdout {
            let out = base.appendingPathExtension("out")
            _ = FileManager.default.createFile(atPath: out.path, contents: nil)
            process.standardOutput = try FileHandle(forWritingTo: out)
            stdoutFile = out
        } else {
            process.standardOutput = log
            stdoutFile = nil
        }
        process.standardError = log
        process.standardInput = FileHandle.nullDevice
        let exited = self.exited
        // Called on Foundation's process-monitoring thread, whatever the test's own tasks are doing.
        process.terminationHandler = { _ in exited.mark() }
        try process.run()
    }

    private let started = ContinuousClock.now
    private let exited = ExitTime()

    /// From the start to the exit; nil while the child runs.
    public var ranFor: Duration? { exited.instant.map { $0 - started } }

    /// Kills the child if still running and removes its output files (a test reads them, and quotes them in its
    /// failures, before it releases the child); `FLEET_KEEP_TEST_LOGS=1` keeps them.
    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        guard ProcessInfo.processInfo.environment["FLEET_KEEP_TEST_LOGS"] == nil else { return }
        for file in [logFile, stdoutFile].compactMap({ $0 }) { try? FileManager.default.removeItem(at: file) }
    }

    public var pid: Int32 { process.processIdentifier }
    public var isRunning: Bool { process.isRunning }

    public func terminate(_ signal: Int32) { kill(process.processIdentifier, signal) }

    /// Waits for exit up to `timeout` (polling, never blocking a thread); the exit status, or nil if still running.
    public func waitExit(timeout: Duration) async -> Int32? {
        let deadline = ContinuousClock.now + timeout
        while process.isRunning {
            if ContinuousClock.now > deadline { return nil }
            try? await Task.sleep(for: .milliseconds(50))
        }
        return process.terminationStatus
    }

    /// stdout so far (separate stdout only).
    public func readStdout() -> String { stdoutFile.flatMap { try? String(contentsOf: $0, encoding: .utf8) } ?? "" }

    /// The log file so far: stderr, or both streams.
    public func readStderr() -> String { (try? String(contentsOf: logFile, encoding: .utf8)) ?? "" }
    public var output: String { readStderr() }

    /// The first complete line of stdout; nil when none was written within `timeout` (or the child exited first).
    public func firstLine(timeout: Duration) async -> String? {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            let text = readStdout()
            if let newline = text.firstIndex(of: "\n") { return String(text[..<newline]) }
            if !process.isRunning { return nil }
            try? await Task.sleep(for: .milliseconds(50))
        }
        return nil
    }
}

/// When a child process exited, as Foundation's process monitor reported it.
private final class ExitTime: Sendable {
    private let value = Mutex<ContinuousClock.Instant?>(nil)
    func mark() { value.withLock { $0 = ContinuousClock.now } }
    var instant: ContinuousClock.Instant? { value.withLock { $0 } }
}

/// Data produced on another thread, awaited by a blocking caller.
private final class Collected: @unchecked Sendable {
    private let lock = NSCondition()
    private var data: Data?
    func set(_ d: Data) {
        lock.lock()
        data = d
        lock.broadcast()
        lock.unlock()
    }
    func wait() -> Data {
        lock.lock()
        defer { lock.unlock() }
        while data == nil { lock.wait() }
        return data!
    }
}
