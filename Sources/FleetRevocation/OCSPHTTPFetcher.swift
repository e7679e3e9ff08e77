import AppStoreVerification
import AsyncHTTPClient
import Logging
import Metrics
import Synchronization
import NIOCore
import NIOHTTP1

/// Sends OCSP requests to responders over HTTP (RFC 6960 appendix A: `POST` with `application/ocsp-request`) through
/// AsyncHTTPClient: a per-request timeout, at most `maxConcurrentRequests` in flight, answers up to 64 KiB.
/// Counts `fleet_ocsp_requests_total`, `fleet_ocsp_request_seconds` and `fleet_ocsp_failures_total{kind}`.
public final class OCSPHTTPFetcher: Sendable {
    public let timeout: Duration
    private let http: HTTPClient
    private let slots: Slots
    private let requests = Counter(label: "fleet_ocsp_requests_total")
    private let latency = Metrics.Timer(label: "fleet_ocsp_request_seconds")

    public init(timeout: Duration = .seconds(5), maxConcurrentRequests: Int = 8, httpClient: HTTPClient = .shared) {
        self.timeout = timeout
        self.http = httpClient
        self.slots = Slots(max(1, maxConcurrentRequests))
    }

    static let maxResponseBytes = 64 * 1024

    public func fetch(request: [UInt8], uri: String) async -> OCSPFetchResult {
        guard uri.hasPrefix("http://") || uri.hasPrefix("https://") else {
            return failure("bad_uri", "responder URI \(uri) is not http(s)")
        }
        var req = HTTPClientRequest(url: uri)
        req.method = .POST
        req.headers.add(name: "Content-Type", value: "application/ocsp-request")
        req.headers.add(name: "Accept", value: "application/ocsp-response")
        req.body = .bytes(ByteBuffer(bytes: request))
        await slots.acquire()
        defer { slots.release() }
        requests.increment()
        let began = ContinuousClock.now
        defer {
            let took = (ContinuousClock.now - began).components
            latency.recordNanoseconds(took.seconds * 1_000_000_000 + took.attoseconds / 1_000_000_000)
        }
        let amount = TimeAmount.nanoseconds(
            timeout.components.seconds * 1_000_000_000 + timeout.components.attoseconds / 1_000_000_000)
        do {
            let response = try await http.execute(req, timeout: amount)
            let status = Int(response.status.code)
            let body = try await response.body.collect(upTo: Self.maxResponseBytes)
            guard status == 200 else {
                return failure(status >= 500 ? "http_5xx" : "http_status", "responder \(uri) answered HTTP \(status)")
            }
            return .response(Array(body.readableBytesView))
        } catch let e as HTTPClientError where e == .deadlineExceeded || e == .readTimeout || e == .connectTimeout {
            return failure("timeout", "responder \(uri) did not answer within \(timeout)")
        } catch let e as NIOTooManyBytesError {
            return failure("too_large", "responder \(uri) answered more than \(Self.maxResponseBytes) bytes: \(e)")
        } catch {
            return failure("unreachable", "responder \(uri): \(error)")
        }
    }

    private func failure(_ kind: String, _ detail: String) -> OCSPFetchResult {
        Counter(label: "fleet_ocsp_failures_total", dimensions: [("kind", kind)]).increment()
        return .failure(kind: kind, detail: detail)
    }

    /// A counting semaphore for async callers (waiters resume first come, first served).
    final class Slots: Sendable {
        private let state: Mutex<(free: Int, waiting: [CheckedContinuation<Void, Never>])>
        init(_ n: Int) { state = Mutex((n, [])) }

        func acquire() async {
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                let go = state.withLock { s -> Bool in
                    guard s.free > 0 else {
                        s.waiting.append(c)
                        return false
                    }
                    s.free -= 1
                    return true
                }
                if go { c.resume() }
            }
        }

        func release() {
            state.withLock { s -> CheckedContinuation<Void, Never>? in
                guard !s.waiting.isEmpty else {
                    s.free += 1
                    return nil
                }
                return s.waiting.removeFirst()
            }?.resume()
        }
    }
}
