import EntitlementDomain
import Foundation
import Synchronization

// The next batch: gathered, decoded and prepared while the current one is written (`SinkService.run`).
extension SinkService {
    /// Set once the batch being written is done: until then the next batch keeps gathering what arrives.
    /// Also tells whether the next batch is gathered and prepared (`gathered()`), so that the writer can begin it
    /// without waiting.
    final class WriteInProgress: Sendable {
        private let done = Mutex(false)
        private let nextReady = Mutex(false)
        func finish() { done.withLock { $0 = true } }
        var isDone: Bool { done.withLock { $0 } }
        func gathered() { nextReady.withLock { $0 = true } }
        var isGathered: Bool { nextReady.withLock { $0 } }
    }

    /// The next batch, gathered while the current one is written: it waits for the first records, then keeps adding
    /// what arrives (decoding each part as it comes) until the write is done or the batch holds a quarter of the
    /// batch size, and prepares its statements. Taking only what had arrived when the write began left a small batch
    /// in between: every record arriving during a write then waited for two more transactions instead of one
    /// (`bench pipeline` latency), and each small batch paid a transaction's fixed cost. The quarter bounds what is
    /// prepared after the write instead of during it: a first take that large is prepared at once, as before.
    /// Decoding and preparing run on `background` (`BackgroundWork`), off the cooperative pool.
    static func gather(
        from source: any EventBatchSource, limit: Int, applier: EventApplier, on background: BackgroundWork,
        while writing: WriteInProgress
    ) async throws -> ([SinkRecord], DecodedBatch) {
        var records = try await source.nextBatch(maxRecords: limit)
        let first = records
        var parts = [try await background.run { decodeRecords(first) }]
        let gatherLimit = max(1, limit / 4)
        while records.count < gatherLimit && !writing.isDone && !Task.isCancelled {
            guard let more = try await source.moreRecords(maxRecords: gatherLimit - records.count) else { break }
            if more.isEmpty {
                // Not a consumer wait: its poll thread expires waiters only every 100 ms when nothing arrives.
                try? await Task.sleep(for: .milliseconds(2))
                continue
            }
            records += more
            parts.append(try await background.run { decodeRecords(more) })
        }
        let decodedParts = parts
        return (records, try await background.run { DecodedBatch(decodedParts, applier: applier) })
    }

    public struct DecodeFailure: Error, Sendable {
        public var reason: SinkRejection
        public var detail: String
    }

    /// Records decoded: the events in order (`documents[i]`: the document texts of `accepted[i]`'s record), and those
    /// refused with their reason.
    typealias DecodedPart = (
        accepted: [(SinkRecord, EntitlementEvent)], documents: [EventDocumentTexts],
        refused: [(SinkRecord, SinkRejection, String)]
    )

    /// A batch decoded and prepared for the database (done while the previous batch is written).
    struct DecodedBatch: Sendable {
        var accepted: [(SinkRecord, EntitlementEvent)] = []
        var refused: [(SinkRecord, SinkRejection, String)] = []
        var prepared: PreparedBatch

        /// The parts in order, as one batch, its statements prepared.
        init(_ parts: [DecodedPart], applier: EventApplier) {
            var documents: [EventDocumentTexts] = []
            for part in parts {
                accepted += part.accepted
                documents += part.documents
                refused += part.refused
            }
            prepared = applier.prepare(accepted.map(\.1), documents: documents)
        }
    }

    static func decodeBatch(_ records: [SinkRecord], applier: EventApplier) -> DecodedBatch {
        DecodedBatch([decodeRecords(records)], applier: applier)
    }

    /// Decodes records in order, on one thread. The next batch is decoded while the current one is written, so
    /// decoding is off the critical path; spread over every core it took CPU from PostgreSQL when both share the
    /// machine (`fleet bench sink`, alternated: 15,573-15,795 events/s and 0.405-0.412 x COPY with one decoding
    /// thread, 12,659-15,005 and 0.332-0.381 x with two).
    static func decodeRecords(_ records: [SinkRecord]) -> DecodedPart {
        var accepted: [(SinkRecord, EntitlementEvent)] = []
        var documents: [EventDocumentTexts] = []
        var refused: [(SinkRecord, SinkRejection, String)] = []
        accepted.reserveCapacity(records.count)
        documents.reserveCapacity(records.count)
        for record in records {
            switch decode(record) {
            case .success(let decoded):
                accepted.append((record, decoded.event))
                documents.append(decoded.documents)
            case .failure(let failure): refused.append((record, failure.reason, failure.detail))
            }
        }
        return (accepted, documents, refused)
    }

    /// An event and the text of the documents it embeds, as its record carries them.
    public typealias DecodedEvent = (event: EntitlementEvent, documents: EventDocumentTexts)

    public static func decode(_ record: SinkRecord) -> Result<DecodedEvent, DecodeFailure> {
        // The domain's own decoder (the inverse of what the workers write), several times faster than JSONDecoder.
        // The embedded documents are checked but kept only as text: the sink stores that text, and reads the few
        // columns it needs from the transaction's text (`TransactionColumns(json:)`). Building and freeing the
        // documents' trees was about a fifth of the sink's own CPU time (`perf`, `bench sink`).
        EntitlementEvent.decodeForSink(record.value, keepingDocumentTexts: true, parsingDocuments: false).mapError { failure in
            DecodeFailure(reason: SinkRejection(rawValue: failure.reason) ?? .undecodable, detail: failure.detail)
        }
    }
}
