import FleetTestSupport
import Foundation
import Testing

@testable import fleet

/// Every `fleet` command line shown in the README (and docs/) parses with the real command-line parser: flags,
/// subcommands and values are what the binary accepts. What each command does is exercised by the behavioural tests
/// (verify, publish, lag, tail, dev-kafka, worker, sink, migrate, demo, bench) and by CI (`make test`).
@Suite("README commands")
struct ReadmeCommandsTests {
    static let documents = ["README.md", "docs/kubernetes.md"]

    /// Shell lines of the ```sh blocks, continuation lines joined.
    static func shellLines(_ text: String) -> [String] {
        var lines: [String] = []
        var inBlock = false
        var pending = ""
        for raw in text.split(separator: "\n", omittingEmptySubsequences: false) {
            let line = String(raw)
            if line.hasPrefix("```") {
                inBlock = line == "```sh"  // a block opens with ```sh and closes with ```
                continue
            }
            guard inBlock else { continue }
            var l = line
            if let hash = l.range(of: "   #") ?? l.range(of: "  # ") { l = String(l[..<hash.lowerBound]) }
            if l.hasSuffix("\\") {
                pending += l.dropLast() + " "
                continue
            }
            lines.append((pending + l).trimmingCharacters(in: .whitespaces))
            pending = ""
        }
        return lines.filter { !$0.isEmpty && !$0.hasPrefix("#") }
    }

    /// Minimal shell word splitting (single and double quotes).
    static func words(_ line: String) -> [String] {
        var out: [String] = []
        var current = ""
        var quote: Character?
        var started = false
        for c in line {
            if let q = quote {
                if c == q { quote = nil } else { current.append(c) }
            } else if c == "'" || c == "\"" {
                quote = c
                started = true
            } else if c == " " {
                if started || !current.isEmpty { out.append(current) }
                current = ""
                started = false
            } else {
                current.append(c)
            }
        }
        if started || !current.isEmpty { out.append(current) }
        return out
    }

    /// The `fleet` invocations of a line: environment assignments dropped, `&&` chains split.
    static func fleetInvocations(_ line: String) -> [[String]] {
        line.components(separatedBy: "&&").compactMap { part in
            var w = words(part.trimmingCharacters(in: .whitespaces))
            while let first = w.first, first.contains("="), !first.hasPrefix("-") { w.removeFirst() }
            guard let first = w.first, first == "fleet" || first.hasSuffix("/fleet") else { return nil }
            return Array(w.dropFirst())
        }
    }

    static func documentedInvocations() throws -> [(String, [String])] {
        var all: [(String, [String])] = []
        for doc in documents {
            let url = FleetBinary.repoRoot.appendingPathComponent(doc)
            let text = try String(contentsOf: url, encoding: .utf8)
            for line in shellLines(text) {
                for args in fleetInvocations(line) { all.append((doc, args)) }
            }
        }
        return all
    }

    @Test("the README's fleet commands are found")
    func found() throws {
        let invocations = try Self.documentedInvocations()
        let subcommands = Set(invocations.compactMap { $0.1.first })
        // The benchmarks, the offline verifier and the production commands are all documented as runnable lines.
        for expected in ["demo", "verify", "worker", "sink", "migrate", "bench"] {
            #expect(subcommands.contains(expected), "README shows no `fleet \(expected)` command line")
        }
    }

    @Test("every documented fleet command line parses")
    func parse() throws {
        for (doc, args) in try Self.documentedInvocations() {
            do {
                _ = try Fleet.parseAsRoot(args)
            } catch {
                Issue.record("\(doc): `fleet \(args.joined(separator: " "))` does not parse: \(Fleet.message(for: error))")
            }
        }
    }

    @Test("the parser check is real: a misspelt flag fails")
    func negative() {
        #expect(throws: (any Error).self) { _ = try Fleet.parseAsRoot(["verify", "--root-certficate", "x.cer"]) }
        #expect(throws: (any Error).self) { _ = try Fleet.parseAsRoot(["bench", "nothing"]) }
    }

    @Test("the documented Apple root fingerprint matches Apple's certificate (when the fixtures are present)")
    func fingerprint() throws {
        let cert = FleetBinary.repoRoot.deletingLastPathComponent()
            .appendingPathComponent("shared/fixtures/apple-real/AppleRootCA-G3.cer")
        guard let der = FileManager.default.contents(atPath: cert.path) else { return }  // skip: fixtures absent
        let readme = try String(contentsOf: FleetBinary.repoRoot.appendingPathComponent("README.md"), encoding: .utf8)
        let digest = sha256Hex(Array(der)).uppercased()
        let colon = stride(from: 0, to: digest.count, by: 2).map { i -> String in
            let a = digest.index(digest.startIndex, offsetBy: i)
            return String(digest[a..<digest.index(a, offsetBy: 2)])
        }.joined(separator: ":")
        #expect(readme.contains("SHA256 Fingerprint=\(colon)"))
    }
}

import Crypto

func sha256Hex(_ bytes: [UInt8]) -> String {
    SHA256.hash(data: bytes).map { String(format: "%02x", $0) }.joined()
}
