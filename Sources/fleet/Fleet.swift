import ArgumentParser

@main
struct Fleet: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fleet",
        abstract: "entitlement-fleet: verify App Store JWS from Kafka and maintain entitlements in PostgreSQL.",
        subcommands: [
            Verify.self, Worker.self, Sink.self, Migrate.self, Tail.self, Demo.self, Bench.self,
            DevKafka.self, Publish.self, Lag.self, Consume.self,
            Dashboard.self,
            Reconcile.self, Backfill.self, TestNotification.self, Responder.self,
            Ingest.self,
        ]
    )
}
