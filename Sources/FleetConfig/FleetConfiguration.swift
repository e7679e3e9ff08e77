import Configuration
import Foundation
import Yams

/// Layered settings for one fleet process: command-line flag > `FLEET_*` environment variable > YAML file > default.
///
/// The YAML file has the sections `kafka:`, `worker:` and `sink:`; keys inside `worker:`/`sink:` are the flag names
/// without `--` (`input-topic`, `metrics-port`, ...). `kafka:` holds `bootstrap-servers` and `properties` (any
/// librdkafka property, passed through verbatim). Environment variables are `FLEET_` + the flag name in UPPER_SNAKE
/// (`FLEET_INPUT_TOPIC`, lists comma-separated); librdkafka pass-through is `FLEET_KAFKA_<PROPERTY>` with dots as
/// underscores (`FLEET_KAFKA_SECURITY_PROTOCOL` -> `security.protocol`).
public struct FleetSettings: Sendable {
    public enum Error: Swift.Error, CustomStringConvertible, Sendable {
        case unreadableConfigFile(path: String, reason: String)
        case invalidValue(key: String, value: String, expected: String)
        case missing(key: String)

        public var description: String {
            switch self {
            case .unreadableConfigFile(let path, let reason): return "cannot read config file \(path): \(reason)"
            case .invalidValue(let key, let value, let expected):
                return "invalid value '\(value)' for \(key): expected \(expected)"
            case .missing(let key):
                return "missing required setting --\(key) (or \(FleetSettings.environmentName(for: key)), or '\(key)' in the config file)"
            }
        }
    }

    /// The largest config file read (larger ones are refused unread).
    public static let maxConfigFileBytes = 1024 * 1024

    /// The section of the YAML file this process reads (`worker` or `sink`).
    public let section: String
    /// The config file actually read, if any.
    public let configFile: String?
    private let reader: ConfigReader
    private let environment: [String: String]
    private let yamlKafkaProperties: [String: String]

    /// - Parameters:
    ///   - configFile: explicit `--config` path; else `FLEET_CONFIG`; else no file. (A file is never picked up
    ///     implicitly: running from a checkout must not silently apply the example config's values.)
    public init(section: String, configFile explicitPath: String?, environment: [String: String] = ProcessInfo.processInfo.environment) async throws {
        self.section = section
        self.environment = environment
        let path: String?
        if let explicitPath, !explicitPath.isEmpty {
            path = explicitPath
        } else if let fromEnv = environment["FLEET_CONFIG"], !fromEnv.isEmpty {
            path = fromEnv
        } else {
            path = nil
        }
        // Environment variables: key `worker.input-topic` is looked up as FLEET_INPUT_TOPIC.
        let env = EnvironmentVariablesProvider(environmentVariables: environment).mapKeys { key in
            AbsoluteConfigKey(["fleet"] + key.components.dropFirst())
        }
        var providers: [any ConfigProvider] = [env]
        var kafkaProperties: [String: String] = [:]
        if let path {
            guard FileManager.default.isReadableFile(atPath: path) else {
                throw Error.unreadableConfigFile(path: path, reason: "no such readable file")
            }
            // Bounded before anything parses it: a config file is a few KiB; a huge one is a mistake or an attack.
            let size = (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)?.intValue ?? 0
            if size > Self.maxConfigFileBytes {
                throw Error.unreadableConfigFile(
                    path: path, reason: "the file is \(size) bytes; the limit is \(Self.maxConfigFileBytes) bytes")
            }
            do {
                providers.append(try await FileProvider<YAMLSnapshot>(filePath: .init(path)))
                let text = try String(contentsOfFile: path, encoding: .utf8)
                if let root = try Yams.load(yaml: text) as? [String: Any],
                   let kafka = root["kafka"] as? [String: Any],
                   let props = kafka["properties"] as? [String: Any] {
                    for (k, v) in props { kafkaProperties[k] = "\(v)" }
                }
            } catch let error as Error {
                throw error
            } catch {
                throw Error.unreadableConfigFile(path: path, reason: "\(error)")
            }
        }
        self.configFile = path
        self.reader = ConfigReader(providers: providers)
        self.yamlKafkaProperties = kafkaProperties
    }

    /// `FLEET_` + UPPER_SNAKE of a flag name.
    public static func environmentName(for flag: String) -> String {
        "FLEET_" + flag.uppercased().replacingOccurrences(of: "-", with: "_")
    }

    private func key(_ flag: String) -> ConfigKey { ConfigKey([section, flag]) }

    /// A string setting; `kafka.bootstrap-servers` is the file fallback for `bootstrap-servers`.
    public func string(_ flag: String, flag value: String?, default defaultValue: String? = nil) -> String? {
        if let value { return value }
        if let v = reader.string(forKey: key(flag)), !v.isEmpty { return v }
        if flag == "bootstrap-servers", let v = reader.string(forKey: ConfigKey(["kafka", "bootstrap-servers"])) {
            return v
        }
        return defaultValue
    }

    public func requiredString(_ flag: String, flag value: String?, default defaultValue: String? = nil) throws -> String {
        guard let v = string(flag, flag: value, default: defaultValue) else { throw Error.missing(key: flag) }
        return v
    }

    /// A list setting (repeatable flag; comma-separated environment variable; YAML list or comma string).
    public func strings(_ flag: String, flag values: [String], default defaultValue: [String] = []) -> [String] {
        if !values.isEmpty { return values }
        if let v = reader.stringArray(forKey: key(flag)), !v.isEmpty {
            return v.flatMap { $0.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) } }
                .filter { !$0.isEmpty }
        }
        if let v = reader.string(forKey: key(flag)), !v.isEmpty {
            return v.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        }
        return defaultValue
    }

    public func int(_ flag: String, flag value: Int?, default defaultValue: Int) throws -> Int {
        if let value { return value }
        if let s = reader.string(forKey: key(flag)) {
            guard let i = Int(s.trimmingCharacters(in: .whitespaces)) else {
                throw Error.invalidValue(key: flag, value: s, expected: "an integer")
            }
            return i
        }
        if let i = reader.int(forKey: key(flag)) { return i }
        return defaultValue
    }

    public func optionalInt64(_ flag: String, flag value: Int64?) throws -> Int64? {
        if let value { return value }
        if let s = reader.string(forKey: key(flag)) {
            guard let i = Int64(s.trimmingCharacters(in: .whitespaces)) else {
                throw Error.invalidValue(key: flag, value: s, expected: "an integer")
            }
            return i
        }
        if let i = reader.int(forKey: key(flag)) { return Int64(i) }
        return nil
    }

    /// A boolean switch: a set flag wins; else `true/false/1/0/yes/no` from the environment or the file.
    public func bool(_ flag: String, flag value: Bool, default defaultValue: Bool = false) throws -> Bool {
        if value { return true }
        if let b = reader.bool(forKey: key(flag)) { return b }
        if let s = reader.string(forKey: key(flag)) {
            switch s.lowercased() {
            case "true", "1", "yes", "on": return true
            case "false", "0", "no", "off", "": return false
            default: throw Error.invalidValue(key: flag, value: s, expected: "true or false")
            }
        }
        return defaultValue
    }

    /// librdkafka properties: file `kafka.properties`, overridden by `FLEET_KAFKA_*`, overridden by `--kafka-property k=v`.
    public func kafkaProperties(flag values: [String]) throws -> [String: String] {
        var props = yamlKafkaProperties
        for (name, value) in environment where name.hasPrefix("FLEET_KAFKA_") {
            let property = name.dropFirst("FLEET_KAFKA_".count).lowercased().replacingOccurrences(of: "_", with: ".")
            if !property.isEmpty { props[property] = value }
        }
        for item in values {
            guard let eq = item.firstIndex(of: "="), eq != item.startIndex else {
                // The malformed item may be a secret that lost its '=': show only where it starts.
                throw Error.invalidValue(key: "kafka-property", value: String(item.prefix(4)) + "... (\(item.count) characters, not shown)",
                                         expected: "key=value")
            }
            props[String(item[..<eq])] = String(item[item.index(after: eq)...])
        }
        return props
    }
}
