import EntitlementDomain
import EntitlementRules
import Logging
import NIOCore
import PostgresNIO

/// Rows in `COPY ... FROM STDIN` text format (tab-separated fields, `\N` for NULL, one line per row; backslash, tab,
/// newline and carriage return escaped), for the appends of a batch whose keys are assumed new. COPY inserts a batch
/// of rows with one heap call per page and no executor, planner or bound arrays: the part of an
/// `INSERT ... SELECT unnest(...)` that a plain COPY of the same rows does not pay.
struct CopyText {
    private(set) var bytes: [UInt8] = []
    private var rowStarted = false

    init(capacity: Int = 0) { bytes.reserveCapacity(capacity) }

    private mutating func separate() {
        if rowStarted { bytes.append(UInt8(ascii: "\t")) } else { rowStarted = true }
    }

    /// Ends the current row: the next field starts a new one.
    mutating func endRow() {
        bytes.append(UInt8(ascii: "\n"))
        rowStarted = false
    }

    mutating func null() {
        separate()
        bytes.append(UInt8(ascii: "\\")); bytes.append(UInt8(ascii: "N"))
    }

    mutating func text(_ value: String?) {
        guard var value else { return null() }
        separate()
        value.withUTF8 { Self.escape($0, into: &bytes) }
    }

    mutating func integer<T: BinaryInteger>(_ value: T?) {
        guard let value else { return null() }
        separate()
        bytes.append(contentsOf: String(value).utf8)
    }

    mutating func boolean(_ value: Bool?) {
        guard let value else { return null() }
        separate()
        bytes.append(UInt8(ascii: value ? "t" : "f"))
    }

    /// Apple milliseconds as a `timestamptz` literal, `YYYY-MM-DD HH:MM:SS.mmm+00`: the value `fleet_ms` computes,
    /// in the range where its floating-point conversion is exact (`CopyText.isWritable`).
    mutating func timestamp(_ ms: Int64?) {
        guard let ms else { return null() }
        separate()
        let (days, inDay) = ms.quotientAndRemainder(dividingBy: 86_400_000)
        let (day, rem) = inDay < 0 ? (days - 1, inDay + 86_400_000) : (days, inDay)
        let (y, m, d) = Self.civil(fromDays: day)
        let seconds = rem / 1000
        func digits(_ v: Int64, _ n: Int) {
            var scale: Int64 = 1
            for _ in 1..<n { scale *= 10 }
            while scale > 0 { bytes.append(UInt8(ascii: "0") + UInt8(v / scale % 10)); scale /= 10 }
        }
        digits(y, 4); bytes.append(UInt8(ascii: "-")); digits(m, 2); bytes.append(UInt8(ascii: "-")); digits(d, 2)
        bytes.append(UInt8(ascii: " "))
        digits(seconds / 3600, 2); bytes.append(UInt8(ascii: ":"))
        digits(seconds / 60 % 60, 2); bytes.append(UInt8(ascii: ":"))
        digits(seconds % 60, 2); bytes.append(UInt8(ascii: "."))
        digits(rem % 1000, 3)
        bytes.append(contentsOf: "+00".utf8)
    }

    /// Whether `timestamp` writes exactly what `fleet_ms` (`to_timestamp(ms / 1000.0)`) stores for these
    /// milliseconds: from 1970 to 2100 (checked against exact interval arithmetic in PostgreSQL 15 over millions of
    /// values; from ~2106 on, and before ~1857, the double's rounding moves some values by microseconds). A batch
    /// with a date outside it is inserted, so that a row never depends on the path that wrote it.
    static func isWritable(_ ms: Int64?) -> Bool {
        guard let ms else { return true }
        return ms >= 0 && ms < 4_102_444_800_000
    }

    /// Proleptic Gregorian (year, month, day) of a day count from 1970-01-01 (H. Hinnant's `civil_from_days`).
    static func civil(fromDays z0: Int64) -> (Int64, Int64, Int64) {
        let z = z0 + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        return (yoe + era * 400 + (m <= 2 ? 1 : 0), m, d)
    }

    static func escape(_ s: UnsafeBufferPointer<UInt8>, into bytes: inout [UInt8]) {
        // Most values need no escape: one scan, then one copy.
        if !s.contains(where: { $0 == UInt8(ascii: "\\") || $0 < 0x0E && ($0 == 0x09 || $0 == 0x0A || $0 == 0x0D) }) {
            bytes.append(contentsOf: s)
            return
        }
        for c in s {
            switch c {
            case UInt8(ascii: "\\"): bytes.append(c); bytes.append(c)
            case UInt8(ascii: "\t"): bytes.append(UInt8(ascii: "\\")); bytes.append(UInt8(ascii: "t"))
            case UInt8(ascii: "\n"): bytes.append(UInt8(ascii: "\\")); bytes.append(UInt8(ascii: "n"))
            case UInt8(ascii: "\r"): bytes.append(UInt8(ascii: "\\")); bytes.append(UInt8(ascii: "r"))
            default: bytes.append(c)
            }
        }
    }
}

/// A COPY of rows into one table, sent on the batch's connection. With `rowEnds`, the rows' last column is known only
/// inside the batch's transaction (the events' status): every other column is written before the transaction, row `i`
/// ending (before its newline) at `rowEnds[i]`, and `completed(last:)` supplies the last column, appended to each row
/// as the rows are sent.
struct CopyRows: Sendable {
    var table: String
    /// Every column, an awaited one last.
    var columns: [String]
    var bytes: [UInt8]
    var rowCount: Int
    var rowEnds: [Int]? = nil
    var last: [String]? = nil

    init(table: String, columns: [String], bytes: [UInt8], rowCount: Int, rowEnds: [Int]? = nil) {
        self.table = table
        self.columns = columns
        self.bytes = bytes
        self.rowCount = rowCount
        self.rowEnds = rowEnds
    }

    /// `last[i]`: the last column's text of row `i` (nothing to escape).
    func completed(last: [String]) -> CopyRows {
        precondition(rowEnds?.count == last.count, "one last column per row")
        var c = self
        c.last = last
        return c
    }

    func send(on connection: PostgresConnection, logger: Logger) async throws {
        precondition(rowEnds == nil || last != nil, "the last column is missing")
        try await connection.copyFrom(table: table, columns: columns, logger: logger) { writer in
            let chunk = 1 << 18
            guard let rowEnds, let last else {
                var start = 0
                while start < bytes.count {
                    let end = min(bytes.count, start + chunk)
                    try await writer.write(ByteBuffer(bytes: bytes[start..<end]))
                    start = end
                }
                return
            }
            var buffer = ByteBuffer()
            buffer.reserveCapacity(chunk + 4096)
            var start = 0
            for (i, end) in rowEnds.enumerated() {
                buffer.writeBytes(bytes[start..<end])
                buffer.writeInteger(UInt8(ascii: "\t"))
                buffer.writeString(last[i])
                buffer.writeInteger(UInt8(ascii: "\n"))
                start = end + 1
                if buffer.readableBytes >= chunk {
                    try await writer.write(buffer)
                    buffer.clear()
                }
            }
            if buffer.readableBytes > 0 { try await writer.write(buffer) }
        }
    }
}
