import Foundation

/// The path of the running `fleet` binary, so that the child processes a dev stack starts (workers, sinks, ingest)
/// run the same build.
public func currentExecutable() -> String {
    if let path = Bundle.main.executablePath { return path }
    return URL(fileURLWithPath: CommandLine.arguments[0]).standardizedFileURL.path
}
