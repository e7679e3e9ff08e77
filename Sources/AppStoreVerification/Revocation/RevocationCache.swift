import Synchronization

/// What fetching one OCSP answer gave: the responder's DER bytes, or why there are none (`kind` is a metric label:
/// `unreachable`, `timeout`, `http_5xx`, `http_status`, `too_large`, ...).
public enum OCSPFetchResult: Sendable {
    case response([UInt8])
    case failure(kind: String, detail: String)
}

/// Sends one DER OCSP request to a responder URI (the I/O lives outside the core: `FleetRevocation.OCSPHTTPFetcher`).
public typealias OCSPFetch = @Sendable (_ request: [UInt8], _ uri: String) async -> OCSPFetchResult

/// What the revocation layer reports (metrics and logs are the caller's: see `FleetRevocation`).
public enum RevocationEvent: Sendable {
    case cacheHit
    case cacheMiss
    /// An answer fetched: its status as the cache read it (`good`, `revoked`, `unknown`, `unusable`).
    case fetched(status: String)
    /// A fetch failed (kind as in `OCSPFetchResult.failure`).
    case fetchFailed(kind: String, detail: String)
    /// `soft` mode: an input verified although its chain's revocation status could not be established.
    case unchecked(detail: String)
    /// A chain found revoked.
    case revoked(detail: String)
    /// `hard` mode: an input left for a retry because the status could not be established.
    case unavailable(detail: String)
}

/// Revocation-check settings (`--revocation-check`), shared by every verifier of a process.
public struct RevocationSettings: Sendable {
    public enum Mode: String, Sendable, CaseIterable {
        /// No online check (the offline verifier of old).
        case off
        /// Check; when the status cannot be established, verify anyway and count it.
        case soft
        /// Check; when the status cannot be established, the verdict is retryable (never a rejection).
        case hard
    }

    public var mode: Mode
    /// An answer is kept until its nextUpdate, and never longer than this (ms).
    public var maxAgeMillis: Int64
    /// A failed fetch (or an unusable answer) is retried no sooner than this (ms); until then the failure is the answer.
    public var failureRetryMillis: Int64
    /// A good answer is refreshed in the background once this fraction of its lifetime is left.
    public var refreshFraction: Double
    /// Certificates whose answers are kept (least recently used evicted).
    public var capacity: Int

    public init(
        mode: Mode, maxAgeMillis: Int64 = 24 * 3_600_000, failureRetryMillis: Int64 = 5_000,
        refreshFraction: Double = 0.2, capacity: Int = 4_096
    ) {
        self.mode = mode
        self.maxAgeMillis = max(1_000, maxAgeMillis)
        self.failureRetryMillis = max(1, failureRetryMillis)
        self.refreshFraction = min(0.9, max(0.01, refreshFraction))
        self.capacity = max(1, capacity)
    }
}

/// OCSP answers per certificate (key: the request's CertID, i.e. issuer name and key hashes + serial), shared by all
/// threads: an answer is held until its nextUpdate (at most `maxAgeMillis`), a failure for `failureRetryMillis`;
/// bounded (LRU); concurrent misses for one certificate share one fetch (single flight). Foreground lookups never
/// fetch while an answer is still valid; a background refresh (`refresh: true`) fetches an answer whose refresh time
/// has come and keeps the old one if that fails.
public final class RevocationCache: Sendable {
    struct Entry: Sendable {
        var result: OCSPFetchResult
        var expires: Int64
        var refreshAt: Int64
        var lastUsed: UInt64
    }

    struct State {
        var entries: [[UInt8]: Entry] = [:]
        var inflight: [[UInt8]: Task<Entry, Never>] = [:]
        var clock: UInt64 = 0
        var hits = 0
        var misses = 0
        var fetches = 0
    }

    public let settings: RevocationSettings
    let fetch: OCSPFetch
    let now: @Sendable () -> Int64
    let observe: @Sendable (RevocationEvent) -> Void
    private let state = Mutex(State())

    public init(
        settings: RevocationSettings, fetch: @escaping OCSPFetch,
        now: @escaping @Sendable () -> Int64 = SignedDataVerifier.systemNowMillis,
        observe: @escaping @Sendable (RevocationEvent) -> Void = { _ in }
    ) {
        self.settings = settings
        self.fetch = fetch
        self.now = now
        self.observe = observe
    }

    public var hits: Int { state.withLock { $0.hits } }
    public var misses: Int { state.withLock { $0.misses } }
    /// Answers fetched from responders (successful or not).
    public var fetches: Int { state.withLock { $0.fetches } }
    public var count: Int { state.withLock { $0.entries.count } }

    /// The answer for one request (the policy's request; sent without its nonce) and until when it may be used.
    func answer(request: [UInt8], uri: String, refresh: Bool) async -> (OCSPFetchResult, expires: Int64) {
        let parsed: (certID: [UInt8], withoutNonce: [UInt8])
        do { parsed = try OCSPMessages.parseRequest(request) } catch {
            return (.failure(kind: "malformed_request", detail: "\(error)"), now())
        }
        let key = parsed.certID
        enum Step { case hit(Entry), wait(Task<Entry, Never>) }
        let t = now()
        let step: Step = state.withLock { s in
            s.clock &+= 1
            if let e = s.entries[key], t < e.expires, !(refresh && t >= e.refreshAt) {
                s.entries[key]?.lastUsed = s.clock
                s.hits += 1
                return .hit(e)
            }
            s.misses += 1
            if let task = s.inflight[key] { return .wait(task) }
            let previous = s.entries[key]
            // On the bridge's executor: a caller blocked in `SyncBridge.run` never waits for the cooperative pool.
            let task = Task(executorPreference: SyncBridge.executor) { await self.load(key: key, request: parsed.withoutNonce, uri: uri, previous: previous) }
            s.inflight[key] = task
            return .wait(task)
        }
        switch step {
        case .hit(let e):
            observe(.cacheHit)
            return (e.result, e.expires)
        case .wait(let task):
            observe(.cacheMiss)
            let e = await task.value
            return (e.result, e.expires)
        }
    }

    private func load(key: [UInt8], request: [UInt8], uri: String, previous: Entry?) async -> Entry {
        let result = await fetch(request, uri)
        let t = now()
        var entry = Entry(result: result, expires: t + settings.failureRetryMillis, refreshAt: t, lastUsed: 0)
        switch result {
        case .response(let bytes):
            if let summary = OCSPMessages.summary(ofResponse: bytes, certID: key), summary.status != .unknown,
                let next = summary.nextUpdateMillis, next > t
            {
                entry.expires = min(next, t + settings.maxAgeMillis)
                let lifetime = entry.expires - t
                entry.refreshAt = entry.expires - max(1, Int64(Double(lifetime) * settings.refreshFraction))
                observe(.fetched(status: summary.status == .good ? "good" : "revoked"))
            } else {
                let status = OCSPMessages.summary(ofResponse: bytes, certID: key)?.status == .unknown ? "unknown" : "unusable"
                observe(.fetched(status: status))
            }
        case .failure(let kind, let detail):
            observe(.fetchFailed(kind: kind, detail: detail))
            // A refresh that failed keeps the answer that is still valid; it is tried again later.
            if let previous, t < previous.expires {
                entry = previous
                entry.refreshAt = min(previous.expires, t + settings.failureRetryMillis)
            }
        }
        state.withLock { s in
            s.fetches += 1
            s.clock &+= 1
            entry.lastUsed = s.clock
            if s.entries[key] == nil && s.entries.count >= settings.capacity {
                if let oldest = s.entries.min(by: { $0.value.lastUsed < $1.value.lastUsed })?.key {
                    s.entries.removeValue(forKey: oldest)
                }
            }
            s.entries[key] = entry
            s.inflight[key] = nil
        }
        return entry
    }

    /// Shortens the life of answers the policy refused (bad signature, wrong responder, stale): they are fetched
    /// again after `failureRetryMillis` rather than served until their nextUpdate.
    func demote(_ requests: [[UInt8]]) {
        let t = now()
        let keys = requests.compactMap { try? OCSPMessages.parseRequest($0).certID }
        state.withLock { s in
            for k in keys where s.entries[k] != nil {
                s.entries[k]!.expires = min(s.entries[k]!.expires, t + settings.failureRetryMillis)
                s.entries[k]!.refreshAt = min(s.entries[k]!.refreshAt, t)
            }
        }
    }

    /// Drops every answer (counters are kept).
    public func removeAll() { state.withLock { $0.entries.removeAll() } }
}
