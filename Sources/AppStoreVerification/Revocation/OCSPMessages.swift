import SwiftASN1

/// The few facts the revocation cache reads from OCSP messages (RFC 6960) itself: which certificate a request asks
/// about (its CertID, the cache key), the request without its nonce, and a response's status and nextUpdate (how long
/// to keep it). Every security check of a response (signature, responder authorisation, thisUpdate/nextUpdate at the
/// validation time, the CertID match) is swift-certificates' `OCSPVerifierPolicy`'s; nothing here trusts a response.
enum OCSPMessages {
    struct Malformed: Error, CustomStringConvertible {
        let description: String
        init(_ d: String) { description = d }
    }

    /// A request's CertID (DER: hash algorithm, issuer name hash, issuer key hash, serial) and the same request
    /// re-encoded without `requestExtensions`. Apple's responder serves pre-signed answers without a nonce, so the
    /// fleet never asks for one: an answer can then be cached and served to every later check of the certificate
    /// (`OCSPVerifierPolicy` accepts a response without a nonce; it rejects one whose nonce differs).
    static func parseRequest(_ der: [UInt8]) throws -> (certID: [UInt8], withoutNonce: [UInt8]) {
        let root = try DER.parse(der)
        guard root.identifier == .sequence, case .constructed(let top) = root.content,
            let tbs = top.first(where: { _ in true }), tbs.identifier == .sequence, case .constructed(let tbsItems) = tbs.content
        else { throw Malformed("OCSP request is not a SEQUENCE { TBSRequest }") }
        var kept: [ASN1Node] = []
        var certID: [UInt8]?
        for item in tbsItems {
            if item.identifier.tagClass == .contextSpecific && item.identifier.tagNumber == 2 { continue }  // extensions
            if item.identifier == .sequence, case .constructed(let list) = item.content {
                guard let first = list.first(where: { _ in true }), case .constructed(let request) = first.content,
                    let id = request.first(where: { _ in true }), id.identifier == .sequence
                else { throw Malformed("OCSP request has no CertID") }
                certID = Array(id.encodedBytes)
            }
            kept.append(item)
        }
        guard let certID else { throw Malformed("OCSP request has no requestList") }
        var out = DER.Serializer()
        out.appendConstructedNode(identifier: .sequence) { s in
            s.appendConstructedNode(identifier: .sequence) { t in
                for node in kept { t.serializeRawBytes(node.encodedBytes) }
            }
        }
        return (certID, out.serializedBytes)
    }

    enum CertStatus: Equatable { case good, revoked, unknown }

    /// The status and nextUpdate (ms since the epoch) of the single response for `certID`, or nil when the response
    /// is not a successful basic OCSP response naming it (the cache then keeps it only briefly).
    static func summary(ofResponse der: [UInt8], certID: [UInt8]) -> (status: CertStatus, nextUpdateMillis: Int64?)? {
        guard let root = try? DER.parse(der), case .constructed(let top) = root.content else { return nil }
        var items = top.makeIterator()
        guard let status = items.next(), status.identifier == .enumerated, case .primitive(let sv) = status.content,
            sv == [0],  // successful
            let bytesWrapper = items.next(), case .constructed(let explicit) = bytesWrapper.content,
            let responseBytes = explicit.first(where: { _ in true }), case .constructed(let rb) = responseBytes.content
        else { return nil }
        var rbItems = rb.makeIterator()
        _ = rbItems.next()  // responseType (id-pkix-ocsp-basic)
        guard let octets = rbItems.next(), octets.identifier == .octetString, case .primitive(let basicDER) = octets.content,
            let basic = try? DER.parse(Array(basicDER)), case .constructed(let basicItems) = basic.content,
            let tbs = basicItems.first(where: { _ in true }), case .constructed(let data) = tbs.content,
            let responses = data.first(where: { $0.identifier == .sequence }), case .constructed(let list) = responses.content
        else { return nil }
        for single in list {
            guard case .constructed(let fields) = single.content else { continue }
            let parts = Array(fields)
            guard parts.count >= 3, parts[0].encodedBytes.elementsEqual(certID) else { continue }
            let st: CertStatus
            switch parts[1].identifier.tagNumber {
            case 0: st = .good
            case 1: st = .revoked
            default: st = .unknown
            }
            var next: Int64?
            for p in parts.dropFirst(3)
            where p.identifier.tagClass == .contextSpecific && p.identifier.tagNumber == 0 {
                if case .constructed(let inner) = p.content, let t = inner.first(where: { _ in true }),
                    let g = try? GeneralizedTime(derEncoded: t)
                {
                    next = millis(g)
                }
            }
            return (st, next)
        }
        return nil
    }

    /// A GeneralizedTime as ms since the epoch (UTC; proleptic Gregorian, days from civil).
    static func millis(_ g: GeneralizedTime) -> Int64 {
        var y = Int64(g.year)
        let m = Int64(g.month)
        y -= m <= 2 ? 1 : 0
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + Int64(g.day) - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        let days = era * 146_097 + doe - 719_468
        let secs = days * 86_400 + Int64(g.hours) * 3_600 + Int64(g.minutes) * 60 + Int64(g.seconds)
        return secs * 1000 + Int64((g.fractionalSeconds * 1000).rounded(.down))
    }
}
