#if canImport(Glibc)
import Glibc
#endif

/// glibc malloc settings for the long-running services.
public enum MemoryTuning {
    /// Serves allocations of `bytes` and more from their own mappings, returned to the system when freed, with that
    /// threshold fixed. glibc's default starts at 128 KiB but raises the threshold to the size of every mapped block
    /// freed (up to 32 MiB): after librdkafka's first large fetch buffers come and go, such blocks live in the heap
    /// arenas, where they fragment and the worker's peak RSS grows with them. Measured with `fleet bench worker`
    /// (20,000 notifications of 14.5 KB): peak RSS 138-157 MB with glibc's default, 131-137 MB with a fixed 64 KiB
    /// threshold, the rate unchanged. Nothing is changed when `MALLOC_MMAP_THRESHOLD_` is set (the operator's choice
    /// wins) or off glibc. Returns whether the setting was applied.
    @discardableResult
    public static func fixMmapThreshold(bytes: Int32 = 64 * 1024, environment: [String: String]) -> Bool {
        guard environment["MALLOC_MMAP_THRESHOLD_"] == nil else { return false }
        return mallopt([(mMmapThreshold, bytes)])
    }

    /// The sink's settings: blocks up to 32 MiB come from the heap arenas (a fixed threshold), and up to 128 MiB of
    /// free memory at the top of an arena is kept rather than handed back. The sink allocates several MB per batch
    /// (its COPY rows, bound arrays, librdkafka's fetch buffers) and frees them a batch later; with the worker's
    /// 64 KiB threshold every such block was a fresh mapping, so each of its pages faulted in, zeroed by the kernel,
    /// on first touch: ~35,000 page faults a second during `fleet bench sink`. With these settings ~35-575 a second,
    /// the sink process uses ~8 % less CPU, and on this 2-core machine, where the sink's preparation shares the cores
    /// with PostgreSQL's backend, the sink wrote ~2.5 % more events/s on average over 14 alternated pairs
    /// (docs/performance.md). Its peak RSS grew by 5-35 MB with one writer, still under the 200 MB target. Nothing is
    /// changed when `MALLOC_MMAP_THRESHOLD_` or `MALLOC_TRIM_THRESHOLD_` is set, or `GLIBC_TUNABLES` names a malloc
    /// setting (the operator's choice wins), or off glibc. Returns whether the settings were applied.
    @discardableResult
    public static func keepBatchBlocksInHeap(environment: [String: String]) -> Bool {
        guard environment["MALLOC_MMAP_THRESHOLD_"] == nil, environment["MALLOC_TRIM_THRESHOLD_"] == nil,
              !(environment["GLIBC_TUNABLES"] ?? "").contains("glibc.malloc.")
        else { return false }
        return mallopt([(mMmapThreshold, 32 << 20), (mTrimThreshold, 128 << 20)])
    }

    // <malloc.h> is not part of Swift's Glibc module: `mallopt` through its symbol, with its options' values.
    private static let mTrimThreshold: Int32 = -1
    private static let mMmapThreshold: Int32 = -3

    private static func mallopt(_ settings: [(option: Int32, value: Int32)]) -> Bool {
        #if canImport(Glibc)
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "mallopt") else { return false }
        typealias MallOpt = @convention(c) (Int32, Int32) -> Int32
        let call = unsafeBitCast(symbol, to: MallOpt.self)
        // mallopt returns 1 on success.
        return settings.allSatisfy { call($0.option, $0.value) == 1 }
        #else
        return false
        #endif
    }
}
