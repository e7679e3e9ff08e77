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
    /// threshold, the rate unchanged. `fleet sink` too (its batches' COPY rows and arrays are such blocks): `fleet bench
    /// sink`, 4 alternated pairs, peak RSS 160-168 MB against 175-178 MB, the rate unchanged. Nothing is changed when `MALLOC_MMAP_THRESHOLD_` is set (the operator's
    /// choice wins) or off glibc.
    public static func fixMmapThreshold(bytes: Int32 = 64 * 1024, environment: [String: String]) {
        #if canImport(Glibc)
        guard environment["MALLOC_MMAP_THRESHOLD_"] == nil,
              let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "mallopt") else { return }
        // <malloc.h> is not part of Swift's Glibc module: `mallopt(M_MMAP_THRESHOLD, bytes)` through its symbol.
        typealias MallOpt = @convention(c) (Int32, Int32) -> Int32
        let mMmapThreshold: Int32 = -3
        _ = unsafeBitCast(symbol, to: MallOpt.self)(mMmapThreshold, bytes)
        #endif
    }
}
