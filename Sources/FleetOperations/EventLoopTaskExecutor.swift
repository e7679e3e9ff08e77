import NIOCore

/// A task executor that runs jobs on one NIO event loop: work that belongs to a connection (the sink's COPY, an
/// ingest connection's requests) runs on the thread that does the connection's I/O, instead of hopping between that
/// loop and the cooperative pool at every await.
public final class EventLoopTaskExecutor: TaskExecutor, Sendable {
    private let loop: any EventLoop

    public init(_ loop: any EventLoop) { self.loop = loop }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        loop.execute { job.runSynchronously(on: executor) }
    }
}
