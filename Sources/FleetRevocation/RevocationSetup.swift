import AppStoreVerification
import Logging
import Metrics
import Synchronization

/// Builds the process's one revocation checker for `--revocation-check` (nil for `off`): the shared answer cache, the
/// HTTP fetcher, and the metrics and log lines of what happens.
///
/// Metrics: `fleet_ocsp_requests_total`, `fleet_ocsp_request_seconds`, `fleet_ocsp_failures_total{kind}` (fetcher),
/// `fleet_revocation_cache_hits_total`, `fleet_revocation_cache_misses_total`,
/// `fleet_revocation_answers_total{status}` (good / revoked / unknown / unusable, per fetched answer),
/// `fleet_revocation_verdicts_total{verdict}` (revoked / unchecked / unavailable, per input).
public enum RevocationSetup {
    public static func checker(
        settings: RevocationSettings, timeout: Duration = .seconds(5), maxConcurrentRequests: Int = 8,
        logger: Logger, now: @escaping @Sendable () -> Int64 = SignedDataVerifier.systemNowMillis
    ) -> RevocationChecker? {
        guard settings.mode != .off else { return nil }
        let fetcher = OCSPHTTPFetcher(timeout: timeout, maxConcurrentRequests: maxConcurrentRequests)
        let observer = RevocationObserver(logger: logger)
        let cache = RevocationCache(
            settings: settings, fetch: { request, uri in await fetcher.fetch(request: request, uri: uri) }, now: now,
            observe: { observer.record($0) })
        logger.info(
            "revocation checks on", metadata: ["mode": "\(settings.mode.rawValue)", "timeout": "\(timeout)"])
        return RevocationChecker(cache: cache)
    }
}

/// Turns `RevocationEvent`s into counters and (rate-limited where per input) log lines.
final class RevocationObserver: Sendable {
    let logger: Logger
    let hits = Counter(label: "fleet_revocation_cache_hits_total")
    let misses = Counter(label: "fleet_revocation_cache_misses_total")
    let lastUncheckedLog = Mutex<ContinuousClock.Instant?>(nil)

    init(logger: Logger) { self.logger = logger }

    func record(_ event: RevocationEvent) {
        switch event {
        case .cacheHit: hits.increment()
        case .cacheMiss: misses.increment()
        case .fetched(let status):
            Counter(label: "fleet_revocation_answers_total", dimensions: [("status", status)]).increment()
        case .fetchFailed(let kind, let detail):
            logger.warning("OCSP fetch failed", metadata: ["kind": "\(kind)", "detail": "\(detail)"])
        case .unchecked(let detail):
            verdict("unchecked")
            let due = lastUncheckedLog.withLock { last -> Bool in
                let now = ContinuousClock.now
                if let last, now - last < .seconds(10) { return false }
                last = now
                return true
            }
            if due {
                logger.warning(
                    "revocation status unavailable: input verified unchecked (--revocation-check soft)",
                    metadata: ["detail": "\(detail)"])
            }
        case .revoked(let detail):
            verdict("revoked")
            logger.notice("certificate revoked", metadata: ["detail": "\(detail)"])
        case .unavailable(let detail):
            verdict("unavailable")
            logger.warning(
                "revocation status unavailable: input left for a retry (--revocation-check hard)",
                metadata: ["detail": "\(detail)"])
        }
    }

    private func verdict(_ v: String) {
        Counter(label: "fleet_revocation_verdicts_total", dimensions: [("verdict", v)]).increment()
    }
}
