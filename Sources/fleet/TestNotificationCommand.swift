import AppStoreServerAPI
import ArgumentParser
import FleetOperations
import Foundation

/// `fleet test-notification`: asks Apple to send a TEST notification to the app's server URL and reports whether
/// it arrived.
struct TestNotification: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "test-notification",
        abstract: "Request an App Store test notification, poll its status and print the outcome.",
        discussion: """
            Prints the test notification token, then the send attempts Apple reports (SUCCESS, TIMED_OUT, ...).
            Exit codes: 0 delivered (SUCCESS), 1 not delivered or not reported before --wait-seconds, 2 credentials
            refused (401). With --publish, the returned signedPayload also goes onto the raw topic (needs
            --bootstrap-servers).
            """
    )

    @OptionGroup var api: AppStoreAPIOptions
    @OptionGroup var kafka: RawTopicOptions

    @Option(name: .customLong("wait-seconds"), help: "How long to poll for the status (default 60).")
    var waitSeconds: Int = 60

    @Option(name: .customLong("poll-interval-seconds"), help: "Pause between polls (default 2).")
    var pollIntervalSeconds: Int = 2

    @Flag(help: "Also publish the returned signedPayload to the raw topic.")
    var publish = false

    func validate() throws {
        guard waitSeconds >= 0, pollIntervalSeconds >= 1 else {
            throw ValidationError("--wait-seconds must be >= 0 and --poll-interval-seconds >= 1")
        }
    }

    func run() async throws {
        let s = try await api.settings()
        let client = try api.client(s)
        var delivered = false
        try await runAPICommand {
            let token = try await client.requestTestNotification().testNotificationToken
            writeStdout("test notification requested: token \(token)")
            let deadline = ContinuousClock.now + .seconds(waitSeconds)
            while true {
                do {
                    let status = try await client.testNotificationStatus(token: token)
                    let attempts = status.sendAttemptResults ?? []
                    for a in attempts {
                        writeStdout("send attempt \(a.attemptDate.map(APITime.format) ?? "?"): \(a.sendAttemptResult ?? "unknown")")
                    }
                    delivered = attempts.contains { $0.sendAttemptResult == "SUCCESS" }
                    if publish {
                        let (publisher, topic) = try kafka.producer(s)
                        do { try await publisher.publish([status.signedPayload], keyField: .notificationUUID) } catch {
                            await publisher.close()
                            throw error
                        }
                        await publisher.close()
                        writeStdout("published the test notification's signedPayload to \(topic)")
                    }
                    if !attempts.isEmpty || ContinuousClock.now >= deadline { break }
                } catch let e as AppStoreServerAPIError {
                    // Apple answers 404 (TestNotificationNotFound) until the first send attempt is recorded.
                    guard case .api(404, _, _, _) = e, ContinuousClock.now < deadline else { throw e }
                }
                try await Task.sleep(for: .seconds(pollIntervalSeconds))
            }
        }
        writeStdout(delivered ? "outcome: delivered" : "outcome: NOT delivered")
        if !delivered { throw ExitCode(1) }
    }
}
