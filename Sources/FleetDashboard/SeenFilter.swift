/// "Have I seen this id before?" in bounded memory: the most recent `exactCapacity` ids are kept exactly (a set plus a
/// FIFO ring); ids pushed out of the ring go into a Bloom filter of fixed size.
///
/// Exact while at most `exactCapacity` distinct ids have been inserted. Beyond that, an id older than the ring is still
/// recognised (a Bloom filter has no false negatives), but a *new* id can be taken for a seen one with the filter's
/// false-positive probability (about 1% at `bloomBits = 10 x` the number of ids it holds, k = 7): such an event would be
/// counted as a duplicate. `approximate` says when that can have happened.
public struct SeenFilter: Sendable {
    public let exactCapacity: Int
    private var recent: Set<String> = []
    private var ring: [String?]
    private var head = 0
    private var bloom: [UInt64]
    private let bloomBits: Int
    /// Ids that went into the Bloom filter.
    public private(set) var filtered = 0

    public init(exactCapacity: Int = 250_000, bloomBits: Int = 1 << 25) {
        self.exactCapacity = max(1, exactCapacity)
        self.ring = Array(repeating: nil, count: max(1, exactCapacity))
        self.bloomBits = max(64, bloomBits)
        self.bloom = Array(repeating: 0, count: (max(64, bloomBits) + 63) / 64)
        recent.reserveCapacity(min(exactCapacity, 1 << 16))
    }

    public var exactCount: Int { recent.count }
    /// True once ids have left the exact window: a new id may then be mistaken for a seen one (rarely).
    public var approximate: Bool { filtered > 0 }

    public func contains(_ id: String) -> Bool {
        if recent.contains(id) { return true }
        guard filtered > 0 else { return false }
        return bloomContains(id)
    }

    /// Inserts `id`; returns false when it was (or looks) already seen.
    @discardableResult
    public mutating func insert(_ id: String) -> Bool {
        if contains(id) { return false }
        if let old = ring[head] {
            recent.remove(old)
            bloomInsert(old)
            filtered += 1
        }
        ring[head] = id
        head = (head + 1) % ring.count
        recent.insert(id)
        return true
    }

    private func hashes(_ id: String) -> (UInt64, UInt64) {
        // FNV-1a 64 and a second, differently seeded pass: stable across runs (Hasher is randomly seeded per process,
        // which would be fine too, but stable values make tests reproducible).
        var h1: UInt64 = 0xcbf2_9ce4_8422_2325
        var h2: UInt64 = 0x9e37_79b9_7f4a_7c15
        for b in id.utf8 {
            h1 = (h1 ^ UInt64(b)) &* 0x0000_0100_0000_01b3
            h2 = (h2 ^ UInt64(b)) &* 0xff51_afd7_ed55_8ccd
            h2 ^= h2 >> 29
        }
        return (h1, h2 | 1)
    }

    private mutating func bloomInsert(_ id: String) {
        let (a, b) = hashes(id)
        for i in 0..<7 {
            let bit = Int((a &+ UInt64(i) &* b) % UInt64(bloomBits))
            bloom[bit >> 6] |= 1 << UInt64(bit & 63)
        }
    }

    private func bloomContains(_ id: String) -> Bool {
        let (a, b) = hashes(id)
        for i in 0..<7 {
            let bit = Int((a &+ UInt64(i) &* b) % UInt64(bloomBits))
            if bloom[bit >> 6] & (1 << UInt64(bit & 63)) == 0 { return false }
        }
        return true
    }
}
