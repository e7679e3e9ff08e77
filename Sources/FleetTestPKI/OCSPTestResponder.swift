import Crypto
import FleetLoopback
import Foundation
import SwiftASN1
import Synchronization
import X509

#if canImport(Glibc)
    import Glibc
#endif

/// A real OCSP responder for tests and the revocation benchmark: `openssl ocsp -index ... -port ...` answering for the
/// certificates one CA issued, signed with the CA's own key (or another key, for the wrong-signer case). Answers carry
/// nextUpdate = now + `validMinutes`. Requests are counted at the responder (its `-text` log). Never used in production.
public final class OCSPTestResponder: @unchecked Sendable {
    public enum Status: Sendable { case good, revoked }

    public let port: Int
    public let directory: URL
    private let process: Process
    private let log: URL

    public var url: String { "http://127.0.0.1:\(port)" }

    /// Starts a responder for certificates issued by `issuer`; `statuses` lists the serials it knows (any other
    /// serial is answered `unknown`). Throws when openssl is missing or does not start listening within 10 s.
    public init(
        issuer: Certificate, signer: Certificate, signerKeyPEM: String, statuses: [(Certificate, Status)],
        port: Int? = nil, validMinutes: Int = 60
    ) throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("ocsp-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        self.directory = dir
        self.port = try port ?? Self.freePort()
        try issuer.serializeAsPEM().pemString.write(to: dir.appendingPathComponent("ca.pem"), atomically: true, encoding: .utf8)
        try signer.serializeAsPEM().pemString.write(to: dir.appendingPathComponent("signer.pem"), atomically: true, encoding: .utf8)
        try signerKeyPEM.write(to: dir.appendingPathComponent("signer.key"), atomically: true, encoding: .utf8)
        // openssl's index needs a distinct subject per line (unique_subject), hence the serial in the name.
        var index = ""
        for (cert, status) in statuses {
            let serial = Self.hex(cert.serialNumber)
            switch status {
            case .good: index += "V\t391231000000Z\t\t\(serial)\tunknown\t/CN=test-\(serial)\n"
            case .revoked: index += "R\t391231000000Z\t250101000000Z,keyCompromise\t\(serial)\tunknown\t/CN=test-\(serial)\n"
            }
        }
        try index.write(to: dir.appendingPathComponent("index.txt"), atomically: true, encoding: .utf8)
        log = dir.appendingPathComponent("responder.log")
        _ = FileManager.default.createFile(atPath: log.path, contents: nil)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        // stdbuf: the log is read while the responder runs (one "OCSP Request Data" block per request).
        p.arguments = [
            "stdbuf", "-o0", "openssl", "ocsp", "-index", "index.txt", "-port", "\(self.port)", "-CA", "ca.pem",
            "-rsigner", "signer.pem", "-rkey", "signer.key", "-nmin", "\(validMinutes)", "-text",
        ]
        p.currentDirectoryURL = dir
        let handle = try FileHandle(forWritingTo: log)
        p.standardOutput = handle
        p.standardError = handle
        try p.run()
        process = p
        LiveResponders.add(p.processIdentifier, directory: dir.path)
        let deadline = Date().addingTimeInterval(10)
        while !logText.contains("ACCEPT") {
            guard p.isRunning, Date() < deadline else {
                stop()
                throw ResponderError("openssl ocsp did not start on port \(self.port): \(logText)")
            }
            usleep(20_000)
        }
    }

    /// Stops the responder and removes its directory (keys, index, log): nothing is left in the temporary directory.
    deinit {
        stop()
        try? FileManager.default.removeItem(at: directory)
    }

    struct ResponderError: Error, CustomStringConvertible {
        let description: String
        init(_ d: String) { description = d }
    }

    private var logText: String { (try? String(contentsOf: log, encoding: .utf8)) ?? "" }

    /// Requests answered so far.
    public var requestCount: Int { logText.components(separatedBy: "OCSP Request Data:").count - 1 }

    public func stop() {
        // SIGKILL: openssl's responder catches SIGTERM and only looks at it between requests, so blocked in
        // accept() it never exits (waitUntilExit then hung the test process).
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        LiveResponders.remove(process.processIdentifier)
    }

    /// The serial as openssl's index writes it (uppercase hex of the integer's bytes).
    static func hex(_ serial: Certificate.SerialNumber) -> String {
        var bytes = Array(serial.bytes)
        while bytes.count > 1 && bytes[0] == 0 { bytes.removeFirst() }
        return bytes.map { String(format: "%02X", $0) }.joined()
    }

    /// A TCP port nobody listens on right now, for a responder started later on it: `Loopback.freePort`'s choice,
    /// below the kernel's ephemeral range. A port from that range is also the local port of any outgoing connection,
    /// and a worker test that starts its responder only after holding its inputs for a while (dozens of Kafka
    /// connections later) once found its port taken: "ocsp: Error starting accept" in a fresh-clone `make test`.
    public static func freePort() throws -> Int {
        let port = Loopback.freePort()
        guard port > 0 else { throw ResponderError("no free loopback port") }
        return port
    }
}

/// The responders still running, stopped when this process exits. A responder held for a whole test run (a suite's
/// `static let` fixture) is never deinitialized, and openssl, a child of ours, would otherwise outlive the run: each
/// `make test` left its responders listening, and their directories behind.
enum LiveResponders {
    private static let running = Mutex<[pid_t: String]>([:])
    private static let cleanupAtExit: Void = { atexit { LiveResponders.stopAll() } }()

    static func add(_ pid: pid_t, directory: String) {
        cleanupAtExit
        running.withLock { $0[pid] = directory }
    }

    static func remove(_ pid: pid_t) { _ = running.withLock { $0.removeValue(forKey: pid) } }

    static func stopAll() {
        let all = running.withLock { (all: inout [pid_t: String]) -> [pid_t: String] in
            let taken = all
            all.removeAll()
            return taken
        }
        for (pid, directory) in all {
            kill(pid, SIGKILL)
            try? FileManager.default.removeItem(atPath: directory)
        }
    }
}
