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

    /// Set in the child process the test below starts: it then measures instead of starting a child.
    private static let probeVariable = "FLEET_MALLOC_PROBE"

    /// The sink's settings keep a freed batch-sized block in the heap, so the next batch reuses its pages without
    /// faulting them in again; the worker's fixed 64 KiB threshold maps (and faults in) every such block anew.
    ///
    /// Measured in a fresh process (this test binary, run again for this test alone): malloc serves a request from
    /// any free chunk big enough before it looks at the thresholds, and a test process that other tests have used
    /// may hold such chunks, so in-process the 64 KiB case could reuse pages too (it did once in CI: 0 faults).
    @Test func theSinksSettingsReuseABatchSizedBlockWithoutPageFaults() throws {
        if ProcessInfo.processInfo.environment[Self.probeVariable] == "1" {
            try measureInThisProcess()
            return
        }
        let child = Process()
        child.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        child.arguments = ["--testing-library", "swift-testing", "--filter", "MemoryTuningTests/theSinksSettingsReuseABatchSizedBlockWithoutPageFaults"]
        var environment = ProcessInfo.processInfo.environment
        for name in environment.keys where name.hasPrefix("MALLOC_") || name == "GLIBC_TUNABLES" { environment[name] = nil }
        environment[Self.probeVariable] = "1"
        child.environment = environment
        let output = Pipe()
        child.standardOutput = output
        child.standardError = output
        try child.run()
        let printed = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        child.waitUntilExit()
        #expect(child.terminationStatus == 0, "the measuring child failed:\n\(printed)")
        // The child ran the measurement (a filter matching nothing would pass too).
        #expect(printed.contains("malloc probe:"), "the child did not measure:\n\(printed)")
    }

    /// RUSAGE_THREAD (<sys/resource.h> declares it for _GNU_SOURCE only): this thread's counts.
    private static let rusageThread = __rusage_who_t(1)

    private static func minorFaults() -> Int {
        var usage = rusage()
        getrusage(rusageThread, &usage)
        return usage.ru_minflt
    }

    /// The page faults this thread takes to write every page of a block of `bytes` allocated after one of the same
    /// size was freed.
    private func faultsOnReuse(_ bytes: Int) -> Int {
        let first = malloc(bytes)!
        memset(first, 1, bytes)
        free(first)
        let before = Self.minorFaults()
        let second = malloc(bytes)!
        memset(second, 2, bytes)
        let faults = Self.minorFaults() - before
        free(second)
        return faults
    }

    private func measureInThisProcess() throws {
        let bytes = 8 << 20
        // Whether this kernel counts a thread's minor faults at all: write a fresh anonymous mapping.
        let fresh = mmap(nil, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        let mapping = try #require(fresh == MAP_FAILED ? nil : fresh)
        let before = Self.minorFaults()
        memset(mapping, 3, bytes)
        let freshFaults = Self.minorFaults() - before
        munmap(mapping, bytes)

        #expect(MemoryTuning.fixMmapThreshold(environment: [:]))
        let mapped = faultsOnReuse(bytes)
        #expect(MemoryTuning.keepBatchBlocksInHeap(environment: ["GLIBC_TUNABLES": "glibc.pthread.rseq=1"]))
        let kept = faultsOnReuse(bytes)
        print("malloc probe: fresh mapping \(freshFaults) faults, 64 KiB threshold \(mapped), sink's settings \(kept)")
        #expect(kept < 64, "a reused 8 MiB block took \(kept) page faults")
        // Transparent huge pages fault a fresh mapping in 2 MiB at a time; a kernel that counts no faults per thread
        // cannot show the difference either: the control then says nothing.
        if freshFaults >= bytes / 4096 / 2 {
            #expect(mapped >= bytes / 4096 / 2, "a freshly mapped 8 MiB block took only \(mapped) page faults")
        }
    }
}
#endif
