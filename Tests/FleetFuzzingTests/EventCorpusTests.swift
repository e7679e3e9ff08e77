import AppStoreVerification
import EntitlementDomain
import Foundation
import Testing

@testable import FleetFuzzing

/// The event seeds (`Fuzz/corpus/event/valid-*`) are what the workers wrote for the valid JWS and receipt seeds when
/// the corpus was generated: mapping the same inputs again must give the same bytes (event ids, field order, the
/// embedded Apple payloads), whatever the mapper reads its input through.
@Suite struct EventCorpusTests {
    @Test func validInputsMapToTheCommittedEventsByteForByte() throws {
        let events = files(in: corpusRoot.appendingPathComponent("event"))
        var compared = 0
        for (name, bytes) in files(in: corpusRoot.appendingPathComponent("jws")) where name.hasPrefix("valid-") {
            let item = try VerifyTarget.shared.uncached.verify(bytes)
            let mapped = try EntitlementMapper().events(
                for: item, source: EventSource(topic: FleetTopics.raw, partition: 3, offset: 41, kind: item.itemKind),
                verifiedAt: FuzzRoots.now)
            for (i, event) in mapped.enumerated() {
                guard let committed = events.first(where: { $0.0 == "\(name)-\(i)" })?.1 else { continue }
                #expect(
                    String(decoding: event.jsonBytes(), as: UTF8.self) == String(decoding: committed, as: UTF8.self),
                    "event seed \(name)-\(i)")
                compared += 1
            }
        }
        #expect(compared >= 10)
    }
}
