#if canImport(Glibc)
import Foundation
import Glibc
import Testing
@testable import FleetOperations

@Suite struct MemoryTuningTests {
    @Test func anOperatorsMallocSettingsWin() {
        #expect(MemoryTuning.keepBatchBlocksInHeap(environment: ["MALLOC_MMAP_THRESHOLD_": "131072"]) == false)
        #expect(MemoryTuning.keepBatchBlocksInHeap(environment: ["MALLOC_TRIM_THRESHOLD_": "131072"]) == false)
        #expect(MemoryTuning.keepBatchBlocksInHeap(environment: ["GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"]) == false)
        #expect(MemoryTuning.fixMmapThreshold(environment: ["MALLOC_MMAP_THRESHOLD_": "131072"]) == false)
    }

    /// RUSAGE_THREAD (<sys/resource.h> declares it for _GNU_SOURCE only): this thread's counts.
    private static let rusageThread = __rusage_who_t(1)

    /// The page faults this thread takes to write every page of a block of `bytes` allocated after one of the same
    /// size was freed.
    private func faultsOnReuse(_ bytes: Int) -> Int {
        func minorFaults() -> Int {
            var usage = rusage()
            getrusage(Self.rusageThread, &usage)
            return usage.ru_minflt
        }
        let first = malloc(bytes)!
        memset(first, 1, bytes)
        free(first)
        let before = minorFaults()
        let second = malloc(bytes)!
        memset(second, 2, bytes)
        let faults = minorFaults() - before
        free(second)
        return faults
    }

    /// The sink's settings keep a freed batch-sized block in the heap, so the next batch reuses its pages without
    /// faulting them in again; the worker's fixed 64 KiB threshold maps (and faults in) every such block anew.
    @Test func theSinksSettingsReuseABatchSizedBlockWithoutPageFaults() throws {
        let bytes = 8 << 20
        #expect(MemoryTuning.fixMmapThreshold(environment: [:]))
        let mapped = faultsOnReuse(bytes)
        #expect(MemoryTuning.keepBatchBlocksInHeap(environment: ["GLIBC_TUNABLES": "glibc.pthread.rseq=1"]))
        let kept = faultsOnReuse(bytes)
        #expect(kept < 64, "a reused 8 MiB block took \(kept) page faults")
        // With transparent huge pages on for every mapping, a fresh mapping faults in 2 MiB at a time.
        let hugePagesAlways = (try? String(contentsOfFile: "/sys/kernel/mm/transparent_hugepage/enabled", encoding: .utf8))?
            .contains("[always]") ?? false
        if !hugePagesAlways {
            #expect(mapped >= bytes / 4096 / 2, "a freshly mapped 8 MiB block took only \(mapped) page faults")
        }
    }
}
#endif
