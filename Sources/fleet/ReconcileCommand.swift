import AppStoreServerAPI
import AppStoreVerification
import ArgumentParser
import FleetOperations
import FleetSink
import Foundation
import Logging

/// `fleet reconcile`: Get Notification History for a window, every `signedPayload` onto the raw topic.
struct Reconcile: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Fetch App Store notification history for a time window and publish every signed notification to the raw topic.",
        discussion: """
            Apple keeps 180 days of history. Each page is published (and acknowledged by Kafka) before the next is
            requested. With --database-url, notifications the sink already stored (by notificationUUID, read from the
            unverified payload) are skipped; without it everything is published and the sink's dedupe by
            notificationUUID makes a rerun harmless. Progress on stderr; one summary line on stdout.
            Exit codes: 0 done, 1 failure, 2 credentials refused (401).
            """
    )

    @OptionGroup var api: AppStoreAPIOptions
    @OptionGroup var kafka: RawTopicOptions

    @Option(help: "Window start: ISO-8601 (2026-11-01T00:00:00Z), epoch milliseconds, or a duration ago (6h, 2d).")
    var since: String?

    @Option(help: "Window end (default: now).")
    var until: String?

    @Flag(name: .customLong("only-failures"), help: "Only notifications Apple failed to deliver.")
    var onlyFailures = false

    @Option(name: .customLong("database-url"), help: "Sink database: skip notifications already stored (env FLEET_DATABASE_URL).")
    var databaseURL: String?

    func run() async throws {
        let s = try await api.settings()
        let sinceText = try requireSetting(s.string("since", flag: since), "since")
        guard let start = APITime.parse(sinceText) else {
            throw ValidationError("--since '\(sinceText)' is neither ISO-8601 nor epoch milliseconds")
        }
        let end: Int64
        if let u = s.string("until", flag: until) {
            guard let parsed = APITime.parse(u) else { throw ValidationError("--until '\(u)' is neither ISO-8601 nor epoch milliseconds") }
            end = parsed
        } else {
            end = EpochMillis.now()
        }
        guard start < end else { throw ValidationError("--since must be before --until") }
        if EpochMillis.now() - start > 180 * 86_400_000 {
            writeStderr("warning: --since is more than 180 days ago; Apple keeps 180 days of notification history")
        }
        let client = try api.client(s)
        let onlyFailures = try s.bool("only-failures", flag: self.onlyFailures)
        let dbURL = s.string("database-url", flag: databaseURL)
        let (publisher, topic) = try kafka.producer(s)
        let known: SinkLookups?
        if let dbURL {
            do { known = try await SinkLookups.connect(try DatabaseURL(dbURL), logger: Logger(label: "fleet.reconcile")) } catch {
                await publisher.close()
                throw ValidationError("cannot use --database-url: \(error)")
            }
        } else {
            known = nil
        }
        var pages = 0, published = 0, skipped = 0
        defer { writeStdout("reconcile: \(pages) page(s), \(published) published, \(skipped) skipped (\(APITime.format(start)) .. \(APITime.format(end)) -> \(topic))") }
        do {
            try await runAPICommand {
                let request = NotificationHistoryRequest(startDate: start, endDate: end, onlyFailures: onlyFailures ? true : nil)
                var token: String? = nil
                repeat {
                    let page = try await client.notificationHistory(request, paginationToken: token)
                    pages += 1
                    var documents = page.notificationHistory.map(\.signedPayload)
                    if let known {
                        let stored = try await known.storedNotificationUUIDs(among: documents.compactMap { UnverifiedJWS.string($0, "notificationUUID") })
                        let before = documents.count
                        documents.removeAll { UnverifiedJWS.string($0, "notificationUUID").map(stored.contains) ?? false }
                        skipped += before - documents.count
                    }
                    try await publisher.publish(documents, keyField: .notificationUUID)
                    published += documents.count
                    writeStderr("page \(pages): \(page.notificationHistory.count) notification(s), \(documents.count) published\(page.hasMore ? ", more to come" : "")")
                    guard page.hasMore else { break }
                    guard let next = page.paginationToken, next != token else {
                        throw AppStoreServerAPIError.malformedResponse(path: "/inApps/v1/notifications/history", reason: "hasMore without a new paginationToken")
                    }
                    token = next
                } while true
            }
        } catch {
            await known?.close()
            await publisher.close()
            throw error
        }
        await known?.close()
        await publisher.close()
    }
}

func requireSetting(_ value: String?, _ key: String) throws -> String {
    guard let value else { throw ValidationError(FleetSettings.Error.missing(key: key).description) }
    return value
}
