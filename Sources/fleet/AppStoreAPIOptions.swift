import AppStoreServerAPI
import AppStoreVerification
import ArgumentParser
import EntitlementDomain
import FleetKafka
import FleetOperations
import Foundation

/// Flags shared by the commands that talk to Apple's App Store Server API. Every one also reads `FLEET_<FLAG>` and
/// the `appstore-api:` section of the config file (flag > environment > file). The private key is a file path
/// (in Kubernetes: a Secret mounted as a file); its contents are never printed.
struct AppStoreAPIOptions: ParsableArguments {
    @Option(help: "YAML config file (default: $FLEET_CONFIG).")
    var config: String?

    @Option(name: .customLong("api-base-url"), help: "API base URL (default: Apple's, per --environment).")
    var apiBaseURL: String?

    @Option(name: .customLong("api-key-id"), help: "In-app purchase key id from App Store Connect.")
    var apiKeyId: String?

    @Option(name: .customLong("api-issuer-id"), help: "Issuer id from App Store Connect.")
    var apiIssuerId: String?

    @Option(name: .customLong("api-private-key"), help: "Path of the key's .p8 file (PKCS#8 PEM).")
    var apiPrivateKey: String?

    @Option(name: .customLong("bundle-id"), help: "The app's bundle id.")
    var bundleId: String?

    @Option(name: .customLong("environment"), help: "Production or Sandbox (default Production).")
    var environment: String?

    @Option(name: .customLong("max-concurrent-requests"), help: "Requests in flight at once (default 4).")
    var maxConcurrentRequests: Int?

    @Option(name: .customLong("request-timeout-seconds"), help: "Timeout of one HTTP request (default 30).")
    var requestTimeoutSeconds: Int?

    @Option(name: .customLong("max-attempts"), help: "Attempts per request on 429, 5xx and network errors (default 6).")
    var maxAttempts: Int?

    static let section = "appstore-api"

    func settings() async throws -> FleetSettings {
        do { return try await FleetSettings(section: Self.section, configFile: config) } catch { throw ValidationError("\(error)") }
    }

    /// The client, or a `ValidationError` naming the missing or bad setting (never the key's contents).
    func client(_ s: FleetSettings, progress: Bool = true) throws -> AppStoreServerAPIClient {
        do {
            let envName = s.string("environment", flag: environment, default: "Production")!
            guard let env = APIEnvironment(parsing: envName) else {
                throw FleetSettings.Error.invalidValue(key: "environment", value: envName, expected: "Production or Sandbox")
            }
            let credentials = try APICredentials(
                keyId: try s.requiredString("api-key-id", flag: apiKeyId),
                issuerId: try s.requiredString("api-issuer-id", flag: apiIssuerId),
                bundleId: try s.requiredString("bundle-id", flag: bundleId),
                privateKeyPath: try s.requiredString("api-private-key", flag: apiPrivateKey))
            let concurrency = try s.int("max-concurrent-requests", flag: maxConcurrentRequests, default: 4)
            let timeout = try s.int("request-timeout-seconds", flag: requestTimeoutSeconds, default: 30)
            let attempts = try s.int("max-attempts", flag: maxAttempts, default: 6)
            guard concurrency >= 1, timeout >= 1, attempts >= 1 else {
                throw ValidationError("--max-concurrent-requests, --request-timeout-seconds and --max-attempts must be at least 1")
            }
            let base = s.string("api-base-url", flag: apiBaseURL, default: env.baseURL)!
            guard let url = URL(string: base), url.scheme == "https" || url.scheme == "http", url.host != nil else {
                throw FleetSettings.Error.invalidValue(key: "api-base-url", value: base, expected: "an http(s) URL")
            }
            var configuration = AppStoreServerAPIClient.Configuration(
                baseURL: base, retry: RetryPolicy(maxAttempts: attempts), maxConcurrentRequests: concurrency,
                requestTimeout: .seconds(timeout))
            if progress {
                configuration.onRetry = { @Sendable path, reason, delay in writeStderr("retrying \(path) in \(delay): \(reason)") }
            }
            return AppStoreServerAPIClient(credentials: credentials, configuration: configuration)
        } catch let e as ValidationError {
            throw e
        } catch {
            throw ValidationError("\(error)")
        }
    }
}

/// Where the fetched signed documents go (the raw topic, as if Apple had sent them).
struct RawTopicOptions: ParsableArguments {
    @Option(help: "Kafka bootstrap servers, host:port[,host:port...].")
    var bootstrapServers: String?

    @Option(help: "Raw topic to publish to (default appstore.raw).")
    var topic: String?

    @Option(name: .customLong("kafka-property"), help: "Any librdkafka property, key=value (repeatable).")
    var kafkaProperties: [String] = []

    func producer(_ s: FleetSettings) throws -> (RawPublisher, String) {
        do {
            let kafka = KafkaConfiguration(
                bootstrapServers: try s.requiredString("bootstrap-servers", flag: bootstrapServers), clientId: "fleet-appstore-api",
                properties: try s.kafkaProperties(flag: kafkaProperties))
            let topic = s.string("topic", flag: topic, default: FleetTopics.raw)!
            return (RawPublisher(producer: try KafkaProducer(configuration: kafka), topic: topic), topic)
        } catch {
            throw ValidationError("\(error)")
        }
    }
}

/// Publishes signed documents and waits for every delivery report of a batch before the caller moves on.
struct RawPublisher {
    let producer: KafkaProducer
    let topic: String

    /// Publishes `documents` (value: the JWS, key: `keyField` of its unverified payload); throws unless every one
    /// was acknowledged.
    func publish(_ documents: [String], keyField: PublishKeyField) async throws {
        try await publishKeyed(documents) { PublishInput.key(ofJWS: $0, field: keyField) }
    }

    func publishKeyed(_ documents: [String], key keyOf: (String) -> String?) async throws {
        guard !documents.isEmpty else { return }
        let tally = PublishTally()
        for jws in documents {
            let key = keyOf(jws)
            try producer.enqueue(OutgoingMessage(topic: topic, key: key.map { Array($0.utf8) }, value: Array(jws.utf8))) { result in
                tally.state.withLock { t in
                    switch result {
                    case .success: t.delivered += 1
                    case .failure(let e):
                        t.failed += 1
                        if t.firstError == nil { t.firstError = "\(e)" }
                    }
                }
            }
        }
        let flushed = await producer.flush(deadline: .seconds(60))
        let t = tally.state.withLock { $0 }
        guard flushed, t.delivered == documents.count else {
            throw PublishFailure(description: "published \(t.delivered) of \(documents.count) to \(topic); first error: \(t.firstError ?? "delivery timed out")")
        }
    }

    func close() async { await producer.close(deadline: .seconds(5)) }
}

struct PublishFailure: Error, CustomStringConvertible { var description: String }

/// Runs an API command body, mapping the client's errors to exit codes: 2 for refused credentials (401),
/// 1 for everything else, with one clear line on stderr.
func runAPICommand(_ body: () async throws -> Void) async throws {
    do {
        try await body()
    } catch let e as AppStoreServerAPIError {
        writeStderr("error: \(e)")
        if case .unauthorized = e { throw ExitCode(2) }
        throw ExitCode(1)
    } catch let e as PublishFailure {
        writeStderr("error: \(e)")
        throw ExitCode(1)
    }
}

/// ISO-8601 (with or without fractional seconds, or a bare date), epoch milliseconds, or a duration before now
/// (`30m`, `6h`, `2d`: for periodic runs).
enum APITime {
    static func parse(_ text: String, now: Date = Date()) -> Int64? {
        let t = text.trimmingCharacters(in: .whitespaces)
        if !t.isEmpty, t.allSatisfy(\.isNumber) { return Int64(t) }
        if let unit = t.last, let n = Int64(t.dropLast()), n >= 0 {
            let seconds: Int64? = switch unit {
            case "s": n
            case "m": n * 60
            case "h": n * 3600
            case "d": n * 86_400
            default: nil
            }
            if let seconds { return EpochMillis.millis(now) - seconds * 1000 }
        }
        let f = ISO8601DateFormatter()
        for options in [ISO8601DateFormatter.Options.withInternetDateTime, [.withInternetDateTime, .withFractionalSeconds], [.withFullDate]] {
            f.formatOptions = options
            if let d = f.date(from: t) { return EpochMillis.millis(d) }
        }
        return nil
    }

    static func format(_ ms: Int64) -> String {
        let f = ISO8601DateFormatter()
        return f.string(from: EpochMillis.date(ms))
    }
}
