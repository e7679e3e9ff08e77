import AppStoreVerification
import Foundation
import Testing

/// The short variant of the chaos soak (`make chaos` runs the long one): about a minute of traffic on the debug
/// build with every kind of fault injected, then every check of `fleet bench chaos` must pass.
@Suite(.serialized)
struct ChaosCommandTests {
    static let checks = [
        "delivered", "lag_zero", "verified_exactly_once", "rejected_at_least_once", "tables_equal_calm_run",
        "consumables_credited_once", "consumption_answered_once", "sink_rejected_nothing", "no_offset_reset",
    ]
    static let faults = ["kill_worker", "kill_sink", "broker_down", "restart_postgres", "stall_sink_db", "kill_responder", "api_down"]

    /// `make test` runs it after every other test, alone (FLEET_CHAOS_TEST=1), so that the whole suite's load on two
    /// cores does not stretch its timing; `make chaos-short` runs just this.
    @Test(.enabled(if: ProcessInfo.processInfo.environment["FLEET_CHAOS_TEST"] == "1", "set FLEET_CHAOS_TEST=1 (make chaos-short)"))
    func aShortChaosSoakLosesNothingAndAppliesNothingTwice() async throws {
        let run = try await PipelineCommandsTests.fleet(
            ["bench", "chaos", "--minutes", "1", "--seed", "7", "--rate", "25", "--min-fault-gap", "2", "--max-fault-gap", "4"],
            timeout: .seconds(900))
        let context = "stdout:\n\(run.stdout.suffix(6000))\nstderr:\n\(run.stderr.suffix(3000))"
        #expect(run.status == 0, "\(context)")
        let report = try #require(run.lastJSON, "\(context)")
        #expect(report["passed"]?.boolValue == true, "\(context)")
        for check in Self.checks {
            #expect(report["checks"]?[check]?.boolValue == true, "check \(check): \(context)")
        }
        for fault in Self.faults {
            #expect((report["faults"]?[fault]?.int64Value ?? 0) >= 1, "no \(fault) injected: \(context)")
        }
        // A line per fault injected and a line per check.
        let lines = run.stdout.split(separator: "\n")
        #expect(Int64(lines.filter { $0.hasPrefix("fault ") }.count) == report["faults_total"]?.int64Value, "\(context)")
        #expect(lines.filter { $0.hasPrefix("check      PASS") }.count == Self.checks.count, "\(context)")
        #expect(!run.stdout.contains("check      FAIL"))
        // Real work was checked: verified and rejected inputs, and events in the database.
        #expect((report["expected_verified_inputs"]?.int64Value ?? 0) > 500)
        #expect((report["expected_rejected_inputs"]?.int64Value ?? 0) > 10)
        #expect(report["events_in_database"]?.int64Value == report["expected_events"]?.int64Value)
        // The responder answered the recent CONSUMPTION_REQUESTs through the faults.
        #expect((report["consumption"]?["sent"]?.int64Value ?? 0) >= 1, "\(context)")
        #expect((report["consumption_refusals"]?.int64Value ?? 0) >= 1, "the retry path ran: \(context)")
        let inOutages = try #require(report["consumption_refusals_in_api_down"]?.int64Value, "\(context)")
        #expect(inOutages <= report["consumption_refusals"]?.int64Value ?? 0)
    }

    @Test func badFlagsGetAClearError() async throws {
        let run = try await PipelineCommandsTests.fleet(["bench", "chaos", "--workers", "1"], timeout: .seconds(60))
        #expect(run.status != 0)
        #expect(run.stderr.contains("--workers must be at least 2"), "\(run.stderr)")
    }
}
