import Foundation

/// The whole machine's CPU time from `/proc/stat` (every core together), to tell how busy the machine was during a
/// benchmark phase: a phase whose machine had no idle time left measures the machine's capacity, not the code's
/// queueing.
struct MachineCPU: Sendable {
    /// Clock ticks spent idle (idle + iowait) and in total, since boot.
    var idle: UInt64
    var total: UInt64

    /// Now; nil off Linux or when `/proc/stat` cannot be read.
    static func sample() -> MachineCPU? {
        guard let text = try? String(contentsOfFile: "/proc/stat", encoding: .utf8),
              let line = text.split(separator: "\n").first, line.hasPrefix("cpu ") else { return nil }
        // cpu user nice system idle iowait irq softirq steal guest guest_nice (guest time is already in user/nice).
        let ticks = line.split(separator: " ").dropFirst().compactMap { UInt64($0) }
        guard ticks.count >= 8 else { return nil }
        return MachineCPU(idle: ticks[3] + ticks[4], total: ticks[0..<8].reduce(0, +))
    }

    /// CPU seconds the machine spent busy (every core together) between `from` and `to`; nil when either sample is
    /// missing or the busy ticks went backwards. Read from the busy ticks alone (`total - idle`, counters that only
    /// grow), so iowait going backwards, which the kernel allows, changes nothing.
    static func busySeconds(from: MachineCPU?, to: MachineCPU?) -> Double? {
        guard let from, let to, to.total - to.idle >= from.total - from.idle else { return nil }
        return Double((to.total - to.idle) - (from.total - from.idle)) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// The share of the machine left idle between `from` and `to`, in percent (one decimal); nil when either sample
    /// is missing or no time passed.
    static func idlePercent(from: MachineCPU?, to: MachineCPU?) -> Double? {
        guard let from, let to, to.total > from.total, to.idle >= from.idle else { return nil }
        return (Double(to.idle - from.idle) / Double(to.total - from.total) * 1000).rounded() / 10
    }
}
