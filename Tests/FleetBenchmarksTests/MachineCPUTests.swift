@testable import FleetBenchmarks
import Foundation
import Testing

@Suite struct MachineCPUShares {
    @Test func idleShareIsTheIdleTicksOverAllTicksBetweenTwoSamples() {
        let from = MachineCPU(idle: 1_000, total: 5_000)
        #expect(MachineCPU.idlePercent(from: from, to: MachineCPU(idle: 1_050, total: 6_000)) == 5.0)
        #expect(MachineCPU.idlePercent(from: from, to: MachineCPU(idle: 1_333, total: 6_000)) == 33.3)
        #expect(MachineCPU.idlePercent(from: from, to: MachineCPU(idle: 2_000, total: 6_000)) == 100.0)
    }

    @Test func noShareWithoutTwoSamplesOrWithoutTimeBetweenThem() {
        let from = MachineCPU(idle: 1_000, total: 5_000)
        #expect(MachineCPU.idlePercent(from: nil, to: from) == nil)
        #expect(MachineCPU.idlePercent(from: from, to: nil) == nil)
        #expect(MachineCPU.idlePercent(from: from, to: from) == nil)
        #expect(MachineCPU.idlePercent(from: from, to: MachineCPU(idle: 900, total: 6_000)) == nil)
    }

    @Test func thisMachineIsSampledWhereProcStatExists() throws {
        guard FileManager.default.fileExists(atPath: "/proc/stat") else { return }
        let first = try #require(MachineCPU.sample())
        #expect(first.total > 0 && first.idle <= first.total)
        // Burn a little CPU so that at least a tick passes.
        var x: UInt64 = 1
        let until = Date().addingTimeInterval(0.1)
        while Date() < until { x = x &* 6364136223846793005 &+ 1 }
        let second = try #require(MachineCPU.sample())
        #expect(second.total >= first.total, "\(x)")
        if let share = MachineCPU.idlePercent(from: first, to: second) { #expect((0...100).contains(share)) }
    }

    @Test func aProcessRunQueueWaitIsReadWhereTheKernelKeepsIt() {
        guard FileManager.default.fileExists(atPath: "/proc/self/schedstat") else { return }
        let waited = processRunQueueSeconds(pid: getpid())
        #expect(waited != nil && waited! >= 0)
        #expect(processRunQueueSeconds(pid: Int32.max) == nil, "no such process")
    }

    @Test func busySecondsCountTheBusyTicksEvenWhenIowaitGoesBackwards() {
        let hz = Double(sysconf(Int32(_SC_CLK_TCK)))
        let from = MachineCPU(idle: 1_000, total: 5_000)
        #expect(MachineCPU.busySeconds(from: from, to: MachineCPU(idle: 1_050, total: 6_000)) == 950 / hz)
        // iowait (part of idle and of total) fell by 20 ticks while 300 busy ticks passed.
        #expect(MachineCPU.busySeconds(from: from, to: MachineCPU(idle: 980, total: 5_280)) == 300 / hz)
        #expect(MachineCPU.busySeconds(from: from, to: from) == 0)
        #expect(MachineCPU.busySeconds(from: nil, to: from) == nil)
        #expect(MachineCPU.busySeconds(from: from, to: MachineCPU(idle: 1_000, total: 4_000)) == nil)
    }
}
