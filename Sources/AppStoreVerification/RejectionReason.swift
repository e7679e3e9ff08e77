// TEMPORARY lead placeholder until the verify branch lands (it defines the full set).
public struct RejectionReason: RawRepresentable, Hashable, Sendable, Codable {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }
}
