import Foundation

/// Runs blocking test code (a child process waited for, a network answer awaited synchronously, seconds of CPU) on a
/// thread of its own and awaits it. Swift Testing runs every test, synchronous ones included, on the cooperative pool,
/// which has one thread per core: on a 2-core machine two blocking tests starve every async test of the process (their
/// consumers then saw nothing before their deadlines).
public func offPool<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    let result: Result<T, any Error> = await withCheckedContinuation { c in
        Thread.detachNewThread { c.resume(returning: Result { try body() }) }
    }
    return try result.get()
}
