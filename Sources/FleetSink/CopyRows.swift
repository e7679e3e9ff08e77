import EntitlementDomain
import EntitlementRules
import Logging
import NIOCore
import PostgresNIO

/// Rows in `COPY ... FROM STDIN (FORMAT binary)` (PostgreSQL's binary copy format: per row a 16-bit field count,
/// per field a 32-bit length, -1 for NULL, then the value in the type's binary wire form), for the appends of a batch
/// whose keys are assumed new. COPY inserts a batch of rows with one heap call per page and no executor, planner or
/// bound arrays: the part of an `INSERT ... SELECT unnest(...)` that a plain COPY of the same rows does not pay. The
/// binary form also spares the backend what text would cost it: finding each field's end and unescaping it (the
/// documents are kilobytes each), and parsing every `timestamptz` from its text (~0.5-0.7 us each here, ten or so
/// per event). A `jsonb` is still parsed from its text (binary format version 1).
///
/// Each method writes one field of the current row; the row's field count comes first and is written when its first
/// field is, from `columns` (a row with another number of fields is a programming error, caught in `endRow`).
struct CopyBinary: CopyFields {
    private(set) var bytes: [UInt8] = []
    /// The fields of a row: the table's columns written by this COPY.
    let columns: Int
    /// The rows ended so far.
    private(set) var rowCount = 0
    private var fieldsInRow = 0

    init(columns: Int, capacity: Int = 0) {
        precondition(columns > 0 && columns <= Int(Int16.max), "a row has 1...32767 fields")
        self.columns = columns
        bytes.reserveCapacity(capacity)
    }

    /// The stream's header (signature, flags, no extension area) and trailer.
    static let header: [UInt8] = Array("PGCOPY\n".utf8) + [0xFF, 0x0D, 0x0A, 0x00] + [0, 0, 0, 0] + [0, 0, 0, 0]
    static let trailer: [UInt8] = [0xFF, 0xFF]

    private mutating func field(length: Int) {
        if fieldsInRow == 0 { Self.append(Int16(columns), to: &bytes) }
        fieldsInRow += 1
        Self.append(Int32(length), to: &bytes)
    }

    /// Ends the current row: the next field starts a new one. `pending`: fields still to come, appended when the
    /// rows are sent (the events' status).
    mutating func endRow(pending: Int) {
        precondition(fieldsInRow + pending == columns, "a COPY row has \(fieldsInRow + pending) fields, the table \(columns)")
        fieldsInRow = 0
        rowCount += 1
    }

    mutating func null() { field(length: -1) }

    /// A `text` field.
    mutating func text(_ value: String?) {
        guard var value else { return null() }
        value.withUTF8 { utf8 in
            field(length: utf8.count)
            bytes.append(contentsOf: utf8)
        }
    }

    /// A `jsonb` field from its JSON text (binary format version 1: the text after a version byte).
    mutating func jsonb(_ value: String?) {
        guard var value else { return null() }
        value.withUTF8 { utf8 in
            field(length: utf8.count + 1)
            bytes.append(1)
            bytes.append(contentsOf: utf8)
        }
    }

    /// An `integer` field.
    mutating func int32(_ value: Int32?) {
        guard let value else { return null() }
        field(length: 4)
        Self.append(value, to: &bytes)
    }

    /// A `bigint` field.
    mutating func int64(_ value: Int64?) {
        guard let value else { return null() }
        field(length: 8)
        Self.append(value, to: &bytes)
    }

    mutating func boolean(_ value: Bool?) {
        guard let value else { return null() }
        field(length: 1)
        bytes.append(value ? 1 : 0)
    }

    /// Apple milliseconds as a `timestamptz`: microseconds since 2000-01-01 00:00 UTC, the value `fleet_ms` computes,
    /// in the range where its floating-point conversion is exact (`CopyBinary.isWritable`).
    mutating func timestamp(_ ms: Int64?) {
        guard let ms else { return null() }
        field(length: 8)
        Self.append((ms - Self.postgresEpochMilliseconds) * 1000, to: &bytes)
    }

    /// 2000-01-01 00:00:00 UTC in Unix milliseconds: PostgreSQL's timestamp epoch.
    static let postgresEpochMilliseconds: Int64 = 946_684_800_000

    /// Whether `timestamp` writes exactly what `fleet_ms` (`to_timestamp(ms / 1000.0)`) stores for these
    /// milliseconds: from 1970 to 2100 (checked against exact interval arithmetic in PostgreSQL 15 over millions of
    /// values; from ~2106 on, and before ~1857, the double's rounding moves some values by microseconds). A batch
    /// with a date outside it is inserted, so that a row never depends on the path that wrote it.
    static func isWritable(_ ms: Int64?) -> Bool {
        guard let ms else { return true }
        return ms >= 0 && ms < 4_102_444_800_000
    }

    /// One `text` field (length and value), for a column appended when the rows are sent.
    static func textField(_ value: String) -> [UInt8] {
        var bytes: [UInt8] = []
        append(Int32(value.utf8.count), to: &bytes)
        bytes.append(contentsOf: value.utf8)
        return bytes
    }

    static func append<T: FixedWidthInteger>(_ value: T, to bytes: inout [UInt8]) {
        withUnsafeBytes(of: value.bigEndian) { bytes.append(contentsOf: $0) }
    }

    var byteCount: Int { bytes.count }
}

/// The fields of COPY rows, one call per field in the table's column order: `CopyBinary` writes them, `CopySize`
/// counts their bytes.
protocol CopyFields {
    mutating func null()
    mutating func text(_ value: String?)
    mutating func jsonb(_ value: String?)
    mutating func int32(_ value: Int32?)
    mutating func int64(_ value: Int64?)
    mutating func boolean(_ value: Bool?)
    mutating func timestamp(_ ms: Int64?)
    mutating func endRow(pending: Int)
    /// The bytes of the rows written so far.
    var byteCount: Int { get }
}

extension CopyFields {
    mutating func endRow() { endRow(pending: 0) }
}

/// Counts what `CopyBinary` would write for the same calls, writing nothing: a batch's rows are written twice, by one
/// generic function per table, first into a `CopySize` and then into a `CopyBinary` of exactly that capacity. A
/// batch's rows once took a guessed 4 KB, 2 KB and 1 KB per notification, version and event where they use ~0.8,
/// ~0.7 and ~0.4 KB (`fleet bench sink`): ~5 KB of every event's memory was reserved and never written, in each of
/// the batches the sink holds at once.
struct CopySize: CopyFields {
    private(set) var byteCount = 0
    private var inRow = false

    private mutating func field(length: Int) {
        if !inRow { byteCount += 2 }
        inRow = true
        byteCount += 4 + max(0, length)
    }

    mutating func null() { field(length: -1) }
    mutating func text(_ value: String?) { field(length: value.map { $0.utf8.count } ?? -1) }
    mutating func jsonb(_ value: String?) { field(length: value.map { $0.utf8.count + 1 } ?? -1) }
    mutating func int32(_ value: Int32?) { field(length: value == nil ? -1 : 4) }
    mutating func int64(_ value: Int64?) { field(length: value == nil ? -1 : 8) }
    mutating func boolean(_ value: Bool?) { field(length: value == nil ? -1 : 1) }
    mutating func timestamp(_ ms: Int64?) { field(length: ms == nil ? -1 : 8) }
    mutating func endRow(pending: Int) { inRow = false }
}

/// A COPY of rows into one table in binary format, sent on the batch's connection. With `rowEnds`, the rows' last
/// column is known only inside the batch's transaction (the events' status, from the fold): every
/// other column is written before the transaction, row `i` ending at `rowEnds[i]`, and `completed` supplies the last
/// column, appended to each row as the rows are sent.
struct CopyRows: Sendable {
    var table: String
    /// Every column, an awaited one last.
    var columns: [String]
    /// The rows (`CopyBinary.bytes`), without the stream's header and trailer.
    var bytes: [UInt8]
    var rowCount: Int
    var rowEnds: [Int]? = nil
    /// The last field of each row, encoded (length and value).
    var last: [[UInt8]]? = nil

    init(table: String, columns: [String], rows: CopyBinary, rowEnds: [Int]? = nil) {
        precondition(rows.columns == columns.count, "one field per column")
        precondition(rowEnds == nil || rowEnds?.count == rows.rowCount, "one end per row")
        self.table = table
        self.columns = columns
        self.bytes = rows.bytes
        self.rowCount = rows.rowCount
        self.rowEnds = rowEnds
    }

    /// `last[i]`: the last column (`text`) of row `i`.
    func completed(last: [String]) -> CopyRows {
        precondition(rowEnds?.count == last.count, "one last column per row")
        var fields: [String: [UInt8]] = [:]
        var c = self
        c.last = last.map { text in
            if let field = fields[text] { return field }
            let field = CopyBinary.textField(text)
            fields[text] = field
            return field
        }
        return c
    }

    /// The whole COPY stream (header, rows with their last column, trailer) in one buffer: `GuardedConnection` sends it
    /// in one write, so that the write never waits for backpressure (see there why that matters).
    func buffer() -> ByteBuffer {
        precondition(rowEnds == nil || last != nil, "the last column is missing")
        var size = CopyBinary.header.count + bytes.count + CopyBinary.trailer.count
        if rowEnds != nil, let last {
            size += last.reduce(0) { $0 + $1.count }
        }
        var buffer = ByteBuffer()
        buffer.reserveCapacity(size)
        buffer.writeBytes(CopyBinary.header)
        if let rowEnds, let last {
            var start = 0
            for (i, end) in rowEnds.enumerated() {
                buffer.writeBytes(bytes[start..<end])
                buffer.writeBytes(last[i])
                start = end
            }
        } else {
            buffer.writeBytes(bytes)
        }
        buffer.writeBytes(CopyBinary.trailer)
        assert(buffer.readableBytes == size)
        return buffer
    }

    /// `copyFrom`'s table argument for this COPY (`binaryCopyTarget`).
    var copyTarget: String { Self.binaryCopyTarget(table: table, columns: columns) }

    /// What to pass as `copyFrom`'s table for `COPY table (columns) FROM STDIN WITH (FORMAT binary)`. postgres-nio
    /// 1.33 offers only the text format: its `copyFrom` builds `COPY "<table>" FROM STDIN WITH (FORMAT text)` with
    /// the table name inserted as given between double quotes (as its documentation says), so the binary statement's
    /// own column list and options go there and the library's options end up in a comment. `table` and `columns` are
    /// the sink's constants; anything but lowercase identifiers is refused here. `CopyTests` runs every COPY against
    /// PostgreSQL, so a postgres-nio that builds the statement otherwise fails the tests, not a batch in production.
    static func binaryCopyTarget(table: String, columns: [String]) -> String {
        func identifier(_ s: String) -> Bool {
            !s.isEmpty && s.utf8.allSatisfy { ($0 >= UInt8(ascii: "a") && $0 <= UInt8(ascii: "z")) || $0 == UInt8(ascii: "_") }
        }
        precondition(identifier(table) && !columns.isEmpty && columns.allSatisfy(identifier), "COPY takes the sink's own identifiers")
        return table + "\" (" + columns.map { "\"\($0)\"" }.joined(separator: ", ") + ") FROM STDIN WITH (FORMAT binary) --"
    }
}
