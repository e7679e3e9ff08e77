import AppStoreServerAPI
import ArgumentParser
import FleetOperations
import FleetSink
import Foundation
import Logging

/// `fleet backfill`: Transaction History v2 (every page) and All Subscription Statuses onto the raw topic.
struct Backfill: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Fetch the full transaction history and subscription statuses of transactions and publish them to the raw topic.",
        discussion: """
            For each --transaction-id (or, with --from-database, each originalTransactionId the sink knows), every page
            of Transaction History v2 is published (signed transactions, keyed by transactionId), then All
            Subscription Statuses (signedTransactionInfo and signedRenewalInfo). --from-database is paced by
            --requests-per-second. Exit codes: 0 done, 1 failure, 2 credentials refused (401).
            """
    )

    @OptionGroup var api: AppStoreAPIOptions
    @OptionGroup var kafka: RawTopicOptions

    @Option(name: .customLong("transaction-id"), help: "A transaction id (repeatable).")
    var transactionIds: [String] = []

    @Flag(name: .customLong("from-database"), help: "Walk the originalTransactionIds stored by the sink (needs --database-url).")
    var fromDatabase = false

    @Option(name: .customLong("database-url"), help: "Sink database (env FLEET_DATABASE_URL).")
    var databaseURL: String?

    @Option(name: .customLong("requests-per-second"), help: "Pace of --from-database, in transactions per second (default 5).")
    var requestsPerSecond: Double?

    @Flag(name: .customLong("skip-statuses"), help: "Do not fetch All Subscription Statuses.")
    var skipStatuses = false

    func run() async throws {
        let s = try await api.settings()
        let fromDB = try s.bool("from-database", flag: fromDatabase)
        guard fromDB != !transactionIds.isEmpty else {
            throw ValidationError("give either --transaction-id (one or more) or --from-database")
        }
        let rate = Double(s.string("requests-per-second", flag: requestsPerSecond.map { String($0) }, default: "5")!) ?? -1
        guard rate > 0 else { throw ValidationError("--requests-per-second must be a positive number") }
        let client = try api.client(s)
        var ids = transactionIds
        if fromDB {
            let raw = try requireSetting(s.string("database-url", flag: databaseURL), "database-url")
            do { ids = try await Self.originalTransactionIds(url: raw) } catch {
                throw ValidationError("cannot read originalTransactionIds from --database-url: \(error)")
            }
            writeStderr("backfill: \(ids.count) originalTransactionId(s) from the database")
        }
        let (publisher, topic) = try kafka.producer(s)
        var transactions = 0, statuses = 0, pages = 0, notFound = 0
        defer {
            writeStdout("backfill: \(ids.count) id(s), \(pages) history page(s), \(transactions) transaction(s) and \(statuses) status document(s) published, \(notFound) not found (-> \(topic))")
        }
        let interval = Duration.milliseconds(Int64(1000 / rate))
        do {
            try await runAPICommand {
                for (i, id) in ids.enumerated() {
                    let started = ContinuousClock.now
                    do {
                        try await client.allTransactionHistory(transactionId: id) { page in
                            pages += 1
                            try await publisher.publish(page.signedTransactions, keyField: .transactionId)
                            transactions += page.signedTransactions.count
                            writeStderr("\(id): history page \(pages), \(page.signedTransactions.count) transaction(s)\(page.hasMore ? ", more to come" : "")")
                        }
                        if !skipStatuses {
                            var status: StatusResponse? = nil
                            do { status = try await client.subscriptionStatuses(transactionId: id) } catch let e as AppStoreServerAPIError {
                                // Not a subscription (or no status known): the history above is what there is.
                                guard case .api(let code, _, _, _) = e, (400..<500).contains(code) else { throw e }
                                writeStderr("\(id): no subscription statuses (\(e))")
                            }
                            var docs: [String] = []
                            for group in status?.data ?? [] {
                                for item in group.lastTransactions {
                                    if let t = item.signedTransactionInfo { docs.append(t) }
                                    if let r = item.signedRenewalInfo { docs.append(r) }
                                }
                            }
                            // Renewal infos have no transactionId: keyed by originalTransactionId via the fallback below.
                            try await publisher.publishStatuses(docs)
                            statuses += docs.count
                        }
                    } catch let e as AppStoreServerAPIError {
                        if case .api(404, _, _, _) = e {
                            notFound += 1
                            writeStderr("\(id): not found (\(e))")
                        } else {
                            throw e
                        }
                    }
                    if fromDB, i + 1 < ids.count {
                        let elapsed = ContinuousClock.now - started
                        if elapsed < interval { try await Task.sleep(for: interval - elapsed) }
                    }
                }
            }
        } catch {
            await publisher.close()
            throw error
        }
        await publisher.close()
        if notFound > 0 && !fromDB { throw ExitCode(1) }
    }

    static func originalTransactionIds(url: String) async throws -> [String] {
        let lookups = try await SinkLookups.connect(try DatabaseURL(url), logger: Logger(label: "fleet.backfill"))
        do {
            let ids = try await lookups.originalTransactionIds()
            await lookups.close()
            return ids
        } catch {
            await lookups.close()
            throw error
        }
    }
}

extension RawPublisher {
    /// Status documents: transactions keyed by transactionId, renewal infos by originalTransactionId.
    func publishStatuses(_ documents: [String]) async throws {
        let transactions = documents.filter { UnverifiedJWS.string($0, "transactionId") != nil }
        let renewals = documents.filter { UnverifiedJWS.string($0, "transactionId") == nil }
        try await publish(transactions, keyField: .transactionId)
        try await publishKeyed(renewals) { UnverifiedJWS.string($0, "originalTransactionId") }
    }
}
