import AppStoreVerification
import FleetIngestClient
import Foundation
import Synchronization

/// Demo traffic through `fleet ingest` over HTTP, as Apple and the apps send it: notifications to the Apple endpoint
/// (`{"signedPayload": ...}`), client purchases to `/v1/transactions` (`{"signedTransaction": ...}`, legacy receipts
/// as `{"receipt-data": ...}`). A pool of keep-alive connections on their own threads; a 503 is retried after its
/// Retry-After (as Apple does), so every input ends up acknowledged (200, or 422 for a rejected transaction).
final class DemoIngestFeeder: Sendable {
    static let notificationsPath = "/apple/notifications"
    static let transactionsPath = "/v1/transactions"

    /// The `fleet ingest` arguments of the demo (everything else as in the workers' arguments).
    static func arguments(bootstrap: String, topic: String, port: Int, metricsPort: Int, verification: [String]) -> [String] {
        ["ingest", "--bootstrap-servers", bootstrap, "--topic", topic, "--host", "127.0.0.1", "--port", String(port),
         "--metrics-port", String(metricsPort), "--shutdown-deadline-seconds", "10"] + verification
    }

    /// Where an input goes and with which body.
    static func route(_ value: [UInt8]) -> (path: String, body: [UInt8]) {
        let text = String(decoding: value, as: UTF8.self)
        if !text.contains("."), text.hasPrefix("MI") {
            return (transactionsPath, Array("{\"receipt-data\":\"\(text)\"}".utf8))
        }
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        if parts.count == 3, let payload = Base64.decodeURL(String(parts[1])),
           let json = try? JSONValue.parse(bytes: payload), json["notificationType"] != nil {
            return (notificationsPath, Array("{\"signedPayload\":\"\(text)\"}".utf8))
        }
        var escaped = [UInt8]()
        JSONValue.writeString(text, into: &escaped)
        return (transactionsPath, Array("{\"signedTransaction\":".utf8) + escaped + [UInt8(ascii: "}")])
    }

    private struct State {
        var queue: [[UInt8]] = []
        var head = 0
        var finished = false
        var failures: [String] = []
    }

    private let state = Mutex(State())
    private let wake = NSCondition()
    let acknowledged = Atomic<Int>(0)
    let retried = Atomic<Int>(0)
    private let running = Atomic<Int>(0)
    private let bound: Int

    init(port: Int, connections: Int = 16, bound: Int = 2_000) {
        self.bound = bound
        for _ in 0..<connections {
            running.add(1, ordering: .relaxed)
            let t = Thread { [self] in self.sender(port: port) }
            t.stackSize = 1 << 20
            t.start()
        }
    }

    /// Queues one input; waits (without blocking a thread) while `bound` inputs are queued.
    func submit(_ value: [UInt8]) async throws {
        while state.withLock({ $0.queue.count - $0.head >= bound }) {
            try await Task.sleep(for: .milliseconds(2))
        }
        state.withLock { $0.queue.append(value) }
        signal(all: false)
    }

    /// Waits until every queued input is acknowledged; throws when any could not be delivered.
    func finish() async throws {
        state.withLock { $0.finished = true }
        signal(all: true)
        while running.load(ordering: .relaxed) > 0 { try await Task.sleep(for: .milliseconds(20)) }
        let failures = state.withLock { $0.failures }
        if !failures.isEmpty {
            throw DemoError("\(failures.count) inputs were not accepted by fleet ingest, e.g. \(failures.prefix(3))")
        }
    }

    private func signal(all: Bool) {
        wake.lock()
        if all { wake.broadcast() } else { wake.signal() }
        wake.unlock()
    }

    private func take() -> [UInt8]? {
        while true {
            let (item, done): ([UInt8]?, Bool) = state.withLock { s in
                if s.head < s.queue.count {
                    let v = s.queue[s.head]
                    s.head += 1
                    if s.head > 4096 { s.queue.removeFirst(s.head); s.head = 0 }
                    return (v, false)
                }
                return (nil, s.finished)
            }
            if let item { return item }
            if done { return nil }
            wake.lock()
            _ = wake.wait(until: Date().addingTimeInterval(0.05))
            wake.unlock()
        }
    }

    private func sender(port: Int) {
        defer { running.subtract(1, ordering: .relaxed) }
        var conn: HTTPConnection?
        while let value = take() {
            let (path, body) = Self.route(value)
            var attempt = 0
            while true {
                attempt += 1
                do {
                    if conn == nil || !conn!.isOpen { conn = try HTTPConnection(port: port, timeoutSeconds: 30) }
                    let r = try conn!.postJSON(path, body)
                    if r.status == 200 || r.status == 422 {
                        acknowledged.add(1, ordering: .relaxed)
                        break
                    }
                    if r.status == 503 && attempt < 60 {
                        retried.add(1, ordering: .relaxed)
                        Thread.sleep(forTimeInterval: min(1, Double(r.header("Retry-After") ?? "1") ?? 1))
                        continue
                    }
                    state.withLock { $0.failures.append("\(r.status) \(r.text.prefix(200))") }
                    break
                } catch {
                    conn = nil
                    if attempt < 60 { Thread.sleep(forTimeInterval: 0.2); continue }
                    state.withLock { $0.failures.append("\(error)") }
                    break
                }
            }
        }
    }
}
