#if canImport(Glibc)
import Glibc
#endif
import NIOPosix

/// One thread for the sink's work that is off a batch's critical path (decoding and preparing the next batch while
/// the current one is written, freeing the last one), at a lower scheduling priority than the sink's other threads.
///
/// Why: on a machine the sink shares with its PostgreSQL (the benchmarks, a small deployment), a batch's time is the
/// backend's, and the backend was runnable without a core ~8 % of the time while the sink prepared the next batch on
/// the other core (`bench sink`: backend state sampled every 0.5 ms, docs/performance.md). At nice +5 (CFS weight ~1/3
/// of a normal thread's) the preparation yields the core to the backend and to the connection's event loop when they
/// want it, and still gets the idle time it needs: it takes ~0.4 of a core at full speed. Where the database runs
/// elsewhere nothing competes and nothing changes.
final class BackgroundWork: Sendable {
    private let pool: NIOThreadPool
    /// The niceness of the thread relative to the process's (higher runs less when cores are contended).
    static let niceness: Int32 = 5

    init() {
        pool = NIOThreadPool(numberOfThreads: 1)
        pool.start()
        // The pool's only thread runs this first: it lowers its own priority. On Linux the nice value is per thread,
        // and PRIO_PROCESS with `who` 0 is the calling thread. Raising niceness needs no privilege; if it fails
        // anyway, the work runs at normal priority, as before.
        pool.submit { _ in
            #if os(Linux)
            let which = __priority_which_t(PRIO_PROCESS.rawValue)
            _ = setpriority(which, 0, getpriority(which, 0) + Self.niceness)
            #endif
        }
    }

    /// Runs `body` on the background thread.
    func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await pool.runIfActive(body)
    }

    /// Frees `value` on the background thread (a written batch: thousands of objects).
    func discard<T: Sendable>(_ value: T) {
        pool.submit { _ in withExtendedLifetime(value) {} }
    }

    /// Stops the thread once the work submitted is done.
    func shutdown() async {
        try? await pool.shutdownGracefully()
    }
}
