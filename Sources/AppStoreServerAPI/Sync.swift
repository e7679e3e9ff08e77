import Synchronization

/// A value behind a `Mutex`, usable from a final class.
final class LockedValue<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>
    init(_ value: Value) { mutex = Mutex(value) }
    func withLock<R: Sendable>(_ body: (inout Value) -> R) -> R { mutex.withLock { body(&$0) } }
}

/// Bounds how many requests are in flight at once (waiters resume in order).
final class ConcurrencyLimit: Sendable {
    private struct State {
        var available: Int
        var waiters: [CheckedContinuation<Void, Never>] = []
    }
    private let state: Mutex<State>

    init(_ limit: Int) { state = Mutex(State(available: max(1, limit))) }

    func acquire() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let now = state.withLock { s -> Bool in
                if s.available > 0 { s.available -= 1; return true }
                s.waiters.append(c)
                return false
            }
            if now { c.resume() }
        }
    }

    func release() {
        let next = state.withLock { s -> CheckedContinuation<Void, Never>? in
            if s.waiters.isEmpty { s.available += 1; return nil }
            return s.waiters.removeFirst()
        }
        next?.resume()
    }
}
