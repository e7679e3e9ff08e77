import Foundation
import Synchronization

/// Directories a test writes its inputs into (keys, roots, configuration files, logs of a child), removed when the
/// test process exits: a suite's fixture outlives the test that made it, so a `defer` at the call site would be too early.
public enum TemporaryFiles {
    private static let made = Mutex<[URL]>([])
    private static let removeAtExit: Void = { atexit { TemporaryFiles.removeAll() } }()

    /// A new empty directory `<tmp>/<prefix>-<random>`.
    public static func directory(_ prefix: String) throws -> URL {
        removeAtExit
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("\(prefix)-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        made.withLock { $0.append(dir) }
        return dir
    }

    static func removeAll() {
        guard ProcessInfo.processInfo.environment["FLEET_KEEP_TEST_LOGS"] == nil else { return }
        let all = made.withLock { (all: inout [URL]) -> [URL] in
            let taken = all
            all.removeAll()
            return taken
        }
        for dir in all { try? FileManager.default.removeItem(at: dir) }
    }
}
