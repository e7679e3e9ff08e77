import FleetDevStack
import FleetTestSupport
import Foundation
import Testing

import FleetKafka

/// Tests that run the built `fleet` executable as separate processes (`swift build` must have built it).
@Suite(.serialized, .enabled(if: FleetBinary.available, "the fleet executable is not built (run `swift build` first)"))
struct MultiProcessTests {

    /// `topic partition offset` lines of a `fleet consume` output file.
    static func processed(_ path: String) -> [Int32: Set<Int64>] {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return [:] }
        var out: [Int32: Set<Int64>] = [:]
        for line in text.split(separator: "\n") {
            let f = line.split(separator: " ")
            guard f.count == 3, let p = Int32(f[1]), let o = Int64(f[2]) else { continue }  // a torn last line
            out[p, default: []].insert(o)
        }
        return out
    }

    static func lineCount(_ path: String) -> Int {
        ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").count
    }

    @Test func twoConsumerProcessesOneKilledTheOtherTakesOver() async throws {
        let perPartition = 1_000
        let (cluster, topic) = try await TestKafka.sequencedCluster("mp", partitions: 6, perPartition: perPartition)
        defer { cluster.shutdown() }
        let group = TestKafka.unique("mp-g")
        let dir = FileManager.default.temporaryDirectory
        let fileA = dir.appendingPathComponent("\(group)-a.txt").path
        let fileB = dir.appendingPathComponent("\(group)-b.txt").path
        defer { try? FileManager.default.removeItem(atPath: fileA); try? FileManager.default.removeItem(atPath: fileB) }
        func consumerArgs(_ file: String) -> [String] {
            ["consume", "--bootstrap-servers", cluster.bootstrapServers, "--group", group, "--topic", topic,
             "--output", file, "--delay-ms", "2", "--batch-size", "20",
             "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "500",
             "--kafka-property", "auto.commit.interval.ms=200"]
        }
        let a = try FleetBinary.start(consumerArgs(fileA))
        let b = try FleetBinary.start(consumerArgs(fileB))
        defer { a.terminate(SIGKILL); b.terminate(SIGKILL) }
        let admin = KafkaAdmin(configuration: TestKafka.config(cluster.bootstrapServers))

        // Invariant checked while everything runs: a committed offset never passes work nobody recorded yet.
        // (Committed offsets are sampled BEFORE reading the append-only output files.)
        var violations: [String] = []
        @discardableResult
        func checkCommitted() async throws -> [Int32: Int64] {
            let lags = try await admin.consumerLag(groupId: group, topics: [topic])
            let done = Self.processed(fileA).merging(Self.processed(fileB)) { $0.union($1) }
            for l in lags {
                guard let c = l.committedOffset, c > 0 else { continue }
                let have = done[l.partition] ?? []
                if let gap = (0..<c).first(where: { !have.contains($0) }) {
                    violations.append("partition \(l.partition): committed \(c) but offset \(gap) unprocessed")
                }
            }
            return Dictionary(lags.compactMap { l in l.committedOffset.map { (l.partition, $0) } }, uniquingKeysWith: max)
        }

        // Wait until both processes have processed messages (the group is shared), then let A work a little more.
        var deadline = ContinuousClock.now + .seconds(40)
        while Self.lineCount(fileA) == 0 || Self.lineCount(fileB) == 0 {
            guard ContinuousClock.now < deadline else {
                Issue.record("both consumers never processed messages: A \(Self.lineCount(fileA)), B \(Self.lineCount(fileB))\n\(a.readStderr())\n\(b.readStderr())")
                return
            }
            try await checkCommitted()
            try await Task.sleep(for: .milliseconds(300))
        }
        let aPartitions = Set(Self.processed(fileA).keys), bPartitions = Set(Self.processed(fileB).keys)
        let linesAtShare = Self.lineCount(fileA)
        while Self.lineCount(fileA) < linesAtShare + 150, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(50))
        }
        a.terminate(SIGKILL)
        _ = await a.waitExit(timeout: .seconds(5))
        let aDone = Self.processed(fileA).values.map(\.count).reduce(0, +)
        #expect(aDone < perPartition * 6, "A finished everything before it was killed; the test proves nothing")

        // B must take over A's partitions (after the session timeout) and finish everything.
        deadline = ContinuousClock.now + .seconds(60)
        var complete = false
        while ContinuousClock.now < deadline {
            let committed = try await checkCommitted()
            let byB = Self.processed(fileB)
            let done = Self.processed(fileA).merging(byB) { $0.union($1) }
            // Every message processed, and every partition either committed to its end or finished by B: A may have
            // processed a partition to its end and been killed before committing it (auto-commit every 200 ms), and
            // then only B, once the group gives it that partition, redelivers and commits the rest. SIGTERM before that
            // assignment leaves the partition committed short with B never having owned it (seen 2026-11-29: 979).
            let settled = (0..<6).map(Int32.init).allSatisfy { p in
                committed[p] == Int64(perPartition) || (byB[p]?.contains(Int64(perPartition - 1)) ?? false)
            }
            if (0..<6).allSatisfy({ (done[Int32($0)]?.count ?? 0) == perPartition }), settled { complete = true; break }
            try await Task.sleep(for: .milliseconds(300))
        }
        #expect(complete, "not every message was processed: \(Self.processed(fileA).mapValues(\.count)) / \(Self.processed(fileB).mapValues(\.count))")
        // B took over every partition A left unfinished (A may have finished one entirely before it was killed).
        let unfinishedByA = Set((0..<6).map(Int32.init).filter { (Self.processed(fileA)[$0]?.count ?? 0) < perPartition })
        #expect(unfinishedByA.isSubset(of: Set(Self.processed(fileB).keys)), "B did not take over all of A's unfinished partitions")
        #expect(!aPartitions.isEmpty && !bPartitions.isEmpty)

        // B leaves gracefully: everything ends committed.
        b.terminate(SIGTERM)
        #expect(await b.waitExit(timeout: .seconds(20)) == 0)
        try await checkCommitted()
        #expect(violations.isEmpty, "\(violations.prefix(5))")
        let lags = try await admin.consumerLag(groupId: group, topics: [topic])
        // On failure, B's own account of its last seconds: its assignments, a refused offsets_store, a failed commit
        // or an abandoned close (its last stderr line says which close it had).
        let bTail = String(b.readStderr().suffix(4000))
        #expect(lags.map(\.committedOffset) == Array(repeating: Int64(perPartition), count: 6), "B's stderr (tail):\n\(bTail)")
        #expect(lags.totalLag == 0)
    }

    @Test func devKafkaPublishAndLagEndToEnd() async throws {
        let dev = try FleetBinary.start(["dev-kafka", "--brokers", "1", "--partitions", "3", "--topic", "raw"])
        defer { dev.terminate(SIGKILL) }
        let first = await dev.firstLine(timeout: .seconds(20))
        let prefix = "bootstrap.servers="
        guard let first, first.hasPrefix(prefix) else {
            Issue.record("dev-kafka first line: \(first ?? "nil"); stderr: \(dev.readStderr())")
            return
        }
        let bootstrap = String(first.dropFirst(prefix.count))
        #expect(bootstrap.split(separator: ",").count == 1)

        func b64url(_ s: String) -> String {
            Data(s.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-")
                .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
        }
        let header = b64url(#"{"alg":"ES256","x5c":[]}"#)
        let jws1 = "\(header).\(b64url(#"{"notificationType":"TEST","notificationUUID":"uuid-1"}"#)).c2ln"
        let jws2 = "\(header).\(b64url(#"{"notificationType":"DID_RENEW","notificationUUID":"uuid-2","data":{}}"#)).c2ln"
        let input = FileManager.default.temporaryDirectory.appendingPathComponent(TestKafka.unique("publish") + ".txt")
        defer { try? FileManager.default.removeItem(at: input) }
        let lines = [jws1, #"{"signedPayload":"\#(jws2)"}"#, "", "not-a-jws-at-all"]
        try lines.joined(separator: "\n").write(to: input, atomically: true, encoding: .utf8)

        let published = try await FleetBinary.run(["publish", "--bootstrap-servers", bootstrap, "--topic", "raw", input.path], timeout: .seconds(60))
        #expect(published.status == 0, "\(published.stdout)\(published.stderr)")
        #expect(published.stdout.contains("delivered 3 of 3"), "\(published.stdout)")
        #expect(published.stdout.contains("1 unkeyed"), "\(published.stdout)")

        // Consume them: bare JWS values, keys from the payload; process two of the three.
        let config = TestKafka.config(bootstrap)
        let group = TestKafka.unique("e2e-g")
        let consumer = try KafkaConsumer(configuration: config, groupId: group, topics: ["raw"])
        var got: [KafkaMessage] = []
        let deadline = ContinuousClock.now + .seconds(30)
        while got.count < 3, ContinuousClock.now < deadline {
            got += try await consumer.nextBatch(maxMessages: 10, timeout: .milliseconds(500))
        }
        let byValue = Dictionary(got.map { (String(decoding: $0.value, as: UTF8.self), $0) }) { a, _ in a }
        #expect(Set(byValue.keys) == [jws1, jws2, "not-a-jws-at-all"])
        #expect(byValue[jws1]?.key == Array("uuid-1".utf8))
        #expect(byValue[jws2]?.key == Array("uuid-2".utf8))
        #expect(byValue["not-a-jws-at-all"].map { $0.key == nil } == true)
        for v in [jws1, jws2] { if let m = byValue[v] { consumer.markProcessed(m) } }
        #expect(await consumer.close(deadline: .seconds(10)))

        let lag = try await FleetBinary.run(["lag", "--bootstrap-servers", bootstrap, "--group", group, "--topic", "raw", "--json"], timeout: .seconds(60))
        #expect(lag.status == 0, "\(lag.stderr)")
        struct Report: Decodable { var total: Int64; var partitions: [PartitionLag] }
        let report = try JSONDecoder().decode(Report.self, from: Data(lag.stdout.utf8))
        #expect(report.total == 1)
        #expect(report.partitions.count == 3)
        #expect(report.partitions.map(\.highWatermark).reduce(0, +) == 3)
        let library = try await KafkaAdmin(configuration: config).consumerLag(groupId: group, topics: ["raw"])
        #expect(library == report.partitions)

        let text = try await FleetBinary.run(["lag", "--bootstrap-servers", bootstrap, "--group", group, "--topic", "raw"], timeout: .seconds(60))
        #expect(text.stdout.contains("total\t1"), "\(text.stdout)")

        // An unknown topic is a clear error, not a crash.
        let missing = try await FleetBinary.run(["lag", "--bootstrap-servers", bootstrap, "--group", group, "--topic", "nope"], timeout: .seconds(60))
        #expect(missing.status != 0)
        #expect(missing.stderr.contains("nope"), "\(missing.stderr)")

        dev.terminate(SIGTERM)
        #expect(await dev.waitExit(timeout: .seconds(10)) == 0)
    }

    @Test func publishFailsWhenNothingCanBeDelivered() async throws {
        let input = FileManager.default.temporaryDirectory.appendingPathComponent(TestKafka.unique("nobroker") + ".txt")
        defer { try? FileManager.default.removeItem(at: input) }
        try "a.b.c\n".write(to: input, atomically: true, encoding: .utf8)
        let r = try await FleetBinary.run([
            "publish", "--bootstrap-servers", "127.0.0.1:1", "--topic", "raw", "--key-field", "none",
            "--kafka-property", "message.timeout.ms=1000", input.path,
        ], timeout: .seconds(30))
        #expect(r.status != 0)
        #expect(r.stdout.contains("delivered 0 of 1"), "\(r.stdout) \(r.stderr)")
        let bad = try await FleetBinary.run(["publish", "--bootstrap-servers", "x:1", "--topic", "raw",
                                             "--kafka-property", "no-equals-sign", input.path], timeout: .seconds(60))
        #expect(bad.status != 0)
        #expect(bad.stderr.contains("key=value"), "\(bad.stderr)")
    }
}
