import Foundation
import Logging
import Synchronization

/// Structured logging for fleet processes: one JSON object per line on stderr (`json`), or readable text (`text`).
public enum FleetLogging {
    private static let done = Mutex(false)

    /// Bootstraps swift-log once per process. `format` is `json` or `text`; `level` a swift-log level name.
    public static func bootstrap(format: String, level: String) {
        let first = done.withLock { d -> Bool in
            defer { d = true }
            return !d
        }
        guard first else { return }
        let lvl = Logger.Level(rawValue: level.lowercased()) ?? .info
        if format.lowercased() == "json" {
            LoggingSystem.bootstrap { label in
                var h = JSONLogHandler(label: label)
                h.logLevel = lvl
                return h
            }
        } else {
            LoggingSystem.bootstrap { label in
                var h = StreamLogHandler.standardError(label: label)
                h.logLevel = lvl
                return h
            }
        }
    }
}

/// One JSON object per log line: `ts`, `level`, `logger`, `msg`, and the metadata as string fields.
public struct JSONLogHandler: LogHandler {
    public var metadata: Logger.Metadata = [:]
    public var logLevel: Logger.Level = .info
    public let label: String
    private static let lock = Mutex(())

    public init(label: String) { self.label = label }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var fields: [String: String] = [:]
        for (k, v) in metadata { fields[k] = "\(v)" }
        if let extra = event.metadata { for (k, v) in extra { fields[k] = "\(v)" } }
        let ts = ISO8601DateFormatter.string(
            from: Date(), timeZone: TimeZone(identifier: "UTC")!,
            formatOptions: [.withInternetDateTime, .withFractionalSeconds])
        var line = "{\"ts\":\(Self.quote(ts)),\"level\":\(Self.quote(event.level.rawValue)),\"logger\":\(Self.quote(label)),\"msg\":\(Self.quote(event.message.description))"
        for k in fields.keys.sorted() { line += ",\(Self.quote(k)):\(Self.quote(fields[k]!))" }
        line += "}\n"
        Self.lock.withLock { _ in FileHandle.standardError.write(Data(line.utf8)) }
    }

    static func quote(_ s: String) -> String {
        var out = "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20: out += String(format: "\\u%04x", scalar.value)
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }
}

/// One line to stdout (unbuffered: a command's result lines interleave correctly with its child processes' output).
public func writeStdout(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

/// One line to stderr.
public func writeStderr(_ line: String) {
    FileHandle.standardError.write(Data((line + "\n").utf8))
}
