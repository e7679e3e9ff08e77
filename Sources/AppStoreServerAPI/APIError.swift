import Foundation

/// What went wrong talking to the App Store Server API. Never carries the token or the key.
public enum AppStoreServerAPIError: Error, CustomStringConvertible, Sendable, Equatable {
    /// 401: the token was refused: wrong key id, issuer id, bundle id or private key (or a clock far off).
    case unauthorized(keyId: String, issuerId: String, bundleId: String)
    /// Any other non-success HTTP status, with Apple's error code when the body had one.
    case api(status: Int, errorCode: Int?, errorMessage: String?, path: String)
    /// 429 or 5xx or a network failure that outlasted every retry.
    case retriesExhausted(attempts: Int, last: String, path: String)
    /// A 2xx whose body is not the documented shape.
    case malformedResponse(path: String, reason: String)
    case invalidRequest(String)

    /// Whether a later attempt could succeed (for callers that queue work, like the responder).
    public var isRetryable: Bool {
        switch self {
        case .retriesExhausted: return true
        case .api(let status, _, _, _): return status == 429 || status >= 500
        default: return false
        }
    }

    public var description: String {
        switch self {
        case .unauthorized(let keyId, let issuerId, let bundleId):
            return "App Store Server API refused the credentials (401): check the key id '\(keyId)', the issuer id '\(issuerId)', "
                + "the bundle id '\(bundleId)' and that the private key file is the .p8 of that key id"
        case .api(let status, let code, let message, let path):
            var s = "App Store Server API error \(status) on \(path)"
            if let code { s += ": errorCode \(code)" }
            if let message { s += " (\(message))" }
            return s
        case .retriesExhausted(let attempts, let last, let path):
            return "App Store Server API \(path) still failing after \(attempts) attempt(s): \(last)"
        case .malformedResponse(let path, let reason): return "unexpected response from App Store Server API \(path): \(reason)"
        case .invalidRequest(let reason): return "invalid App Store Server API request: \(reason)"
        }
    }

    // Apple's documented error codes used by the fleet.
    public static let transactionIdNotFound = 4040010
    public static let originalTransactionIdNotFound = 4040005
    public static let rateLimitExceeded = 4290000
    public static let invalidTransactionId = 4000006
    public static let testNotificationNotFound = 4040008
}

/// Retries: 429 waits `Retry-After` (or the backoff); 5xx and network errors back off exponentially with full
/// jitter, capped; other statuses are not retried.
public struct RetryPolicy: Sendable {
    public var maxAttempts: Int
    public var baseDelay: Duration
    public var maxDelay: Duration
    /// Longest `Retry-After` honoured; longer ones are capped to it.
    public var maxRetryAfter: Duration

    public init(maxAttempts: Int = 6, baseDelay: Duration = .milliseconds(500), maxDelay: Duration = .seconds(30),
                maxRetryAfter: Duration = .seconds(120)) {
        self.maxAttempts = max(1, maxAttempts)
        self.baseDelay = baseDelay
        self.maxDelay = maxDelay
        self.maxRetryAfter = maxRetryAfter
    }

    /// Full-jitter delay before attempt `attempt + 1` (attempt counts from 1).
    public func backoff(afterAttempt attempt: Int) -> Duration {
        let exp = min(attempt - 1, 20)
        let ceiling = min(maxDelay, baseDelay * (1 << exp))
        let ms = max(1, Int64(ceiling.components.seconds * 1000 + ceiling.components.attoseconds / 1_000_000_000_000_000))
        return .milliseconds(Int64.random(in: (ms / 2)...ms))
    }

    /// `Retry-After` as delta-seconds or an HTTP date.
    public func retryAfter(_ header: String?, now: Date = Date()) -> Duration? {
        guard let header = header?.trimmingCharacters(in: .whitespaces), !header.isEmpty else { return nil }
        if let seconds = Double(header), seconds >= 0 {
            return min(maxRetryAfter, .milliseconds(Int64(seconds * 1000)))
        }
        let f = DateFormatter()
        f.locale = Locale(identifier: "en_US_POSIX")
        f.timeZone = TimeZone(identifier: "GMT")
        f.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        guard let date = f.date(from: header) else { return nil }
        return min(maxRetryAfter, .milliseconds(max(0, Int64(date.timeIntervalSince(now) * 1000))))
    }
}
