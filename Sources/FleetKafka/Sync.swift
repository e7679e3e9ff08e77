import Foundation
import Glibc

/// A mutex + condition variable protecting a value. Used where a thread must block (dedicated threads only).
final class ConditionLock<Value>: @unchecked Sendable {
    // Safety: `value` is only accessed with `mutex` held.
    private var mutex = pthread_mutex_t()
    private var cond = pthread_cond_t()
    private var value: Value

    init(_ value: Value) {
        self.value = value
        pthread_mutex_init(&mutex, nil)
        var attr = pthread_condattr_t()
        pthread_condattr_init(&attr)
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC)
        pthread_cond_init(&cond, &attr)
        pthread_condattr_destroy(&attr)
    }

    deinit {
        pthread_cond_destroy(&cond)
        pthread_mutex_destroy(&mutex)
    }

    func withLock<R>(_ body: (inout Value) throws -> R) rethrows -> R {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        return try body(&value)
    }

    /// Blocks (with the lock released) until `predicate` holds or `timeoutSeconds` elapsed; then runs `body` locked.
    func wait<R>(until predicate: (Value) -> Bool, timeoutSeconds: Double?, _ body: (inout Value, Bool) throws -> R) rethrows -> R {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        if let timeoutSeconds {
            var now = timespec()
            clock_gettime(CLOCK_MONOTONIC, &now)
            let total = Double(now.tv_sec) + Double(now.tv_nsec) / 1e9 + max(0, timeoutSeconds)
            var deadline = timespec(tv_sec: Int(total), tv_nsec: Int((total - Double(Int(total))) * 1e9))
            while !predicate(value) {
                if pthread_cond_timedwait(&cond, &mutex, &deadline) == ETIMEDOUT { break }
            }
        } else {
            while !predicate(value) { pthread_cond_wait(&cond, &mutex) }
        }
        return try body(&value, predicate(value))
    }

    func broadcast() {
        pthread_mutex_lock(&mutex)
        pthread_cond_broadcast(&cond)
        pthread_mutex_unlock(&mutex)
    }

    /// Broadcast while the caller already holds the lock inside `withLock`.
    func broadcastLocked() { pthread_cond_broadcast(&cond) }
}

/// Starts a dedicated OS thread (never the Swift cooperative pool) for blocking librdkafka calls.
func startThread(name: String, _ body: @escaping @Sendable () -> Void) {
    let thread = Thread { body() }
    thread.name = name
    thread.stackSize = 1 << 20
    thread.start()
}

/// Runs a blocking closure on its own thread and suspends the caller until it finishes.
func runBlocking<T: Sendable>(name: String, _ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { (continuation: CheckedContinuation<T, Never>) in
        startThread(name: name) { continuation.resume(returning: body()) }
    }
}

/// Resumes at most once: whichever of several racing parties comes first.
final class OneShot<T: Sendable>: Sendable {
    private let state = ConditionLock<(CheckedContinuation<T, Never>?, T?)>((nil, nil))
    init() {}

    func wait(timeout: Duration, onTimeout: T) async -> T {
        await withCheckedContinuation { (continuation: CheckedContinuation<T, Never>) in
            let ready: T? = state.withLock { s in
                if let v = s.1 { return v }
                s.0 = continuation
                return nil
            }
            if let ready { continuation.resume(returning: ready); return }
            Task.detached { [self] in
                try? await Task.sleep(for: timeout)
                self.fulfil(onTimeout)
            }
        }
    }

    func fulfil(_ value: T) {
        let c: CheckedContinuation<T, Never>? = state.withLock { s in
            guard s.1 == nil else { return nil }
            s.1 = value
            let c = s.0
            s.0 = nil
            return c
        }
        c?.resume(returning: value)
    }
}
