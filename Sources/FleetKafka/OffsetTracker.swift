/// Per-partition at-least-once bookkeeping: which handed-out offsets are finished, and the next offset that may be
/// stored (offset + 1 of the last finished message of the contiguous finished prefix), whatever order work
/// completes in.
struct OffsetTracker: Sendable {
    /// Offsets handed to the application, ascending; `pending[head...]` are not yet part of the stored prefix.
    private(set) var pending: [Int64] = []
    private var head = 0
    private var done: Set<Int64> = []
    /// Highest offset that was stored (offset + 1 semantics), or nil.
    private(set) var stored: Int64?

    var outstanding: Int { pending.count - head }

    /// Records that `offset` was handed out. Offsets are normally ascending; a rewind (a re-fetch after an offset
    /// reset or seek) restarts the bookkeeping from there, since everything after it will be delivered again.
    mutating func handOut(_ offset: Int64) {
        if let last = pending.last, offset <= last {
            pending.removeAll(keepingCapacity: true)
            head = 0
            done.removeAll(keepingCapacity: true)
        }
        pending.append(offset)
    }

    mutating func handOut(_ offsets: some Sequence<Int64>) {
        for o in offsets { handOut(o) }
    }

    /// Marks `offset` finished. Returns the new offset to store (last finished contiguous offset + 1) if the prefix
    /// advanced, nil otherwise (an unknown or already finished offset changes nothing).
    mutating func complete(_ offset: Int64) -> Int64? {
        guard head < pending.count, offset >= pending[head], offset <= pending[pending.count - 1] else { return nil }
        // In-order completion, the usual case: the head itself, nothing finished out of order behind it.
        if offset == pending[head], done.isEmpty {
            head += 1
            compact()
            stored = offset + 1
            return offset + 1
        }
        // Binary search: only offsets that were actually handed out count.
        var lo = head, hi = pending.count - 1
        var found = false
        while lo <= hi {
            let mid = (lo + hi) / 2
            if pending[mid] == offset { found = true; break }
            if pending[mid] < offset { lo = mid + 1 } else { hi = mid - 1 }
        }
        guard found else { return nil }
        done.insert(offset)
        var advanced: Int64?
        while head < pending.count, done.remove(pending[head]) != nil {
            advanced = pending[head] + 1
            head += 1
        }
        compact()
        if let advanced { stored = advanced }
        return advanced
    }

    /// Marks a run of offsets finished (`complete` for each). Returns the last new offset to store, if any advanced.
    mutating func complete(_ offsets: some Sequence<Int64>) -> Int64? {
        var advanced: Int64?
        for o in offsets { if let a = complete(o) { advanced = a } }
        return advanced
    }

    private mutating func compact() {
        if head == pending.count {
            pending.removeAll(keepingCapacity: true)
            head = 0
        } else if head > 4096, head * 2 > pending.count {
            pending.removeFirst(head)
            head = 0
        }
    }
}
