import AppStoreVerification
import Foundation

/// Validates JSON against the subset of JSON Schema used by `config/entitlement-event.schema.json`:
/// type (name or list), required, properties, additionalProperties: false, enum, const, pattern, minimum, maximum,
/// minLength. Unknown keywords are refused so that the schema cannot silently outgrow this validator.
struct SchemaValidator {
    let schema: JSONValue
    static let supported: Set<String> = ["$schema", "$id", "title", "description", "type", "required", "properties",
                                         "additionalProperties", "enum", "const", "pattern", "minimum", "maximum", "minLength"]

    init(path: String) throws {
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        schema = try JSONValue.parse(bytes: Array(data))
    }

    func errors(_ value: JSONValue) -> [String] {
        var out: [String] = []
        check(value, schema, path: "$", into: &out)
        return out
    }

    private func typeName(_ v: JSONValue) -> [String] {
        switch v {
        case .null: return ["null"]
        case .bool: return ["boolean"]
        case .integer: return ["integer", "number"]
        case .number(let d): return d == d.rounded() ? ["integer", "number"] : ["number"]
        case .string: return ["string"]
        case .array: return ["array"]
        case .object: return ["object"]
        }
    }

    private func check(_ v: JSONValue, _ s: JSONValue, path: String, into out: inout [String]) {
        guard case .object(let rules) = s else { return }
        for k in rules.keys where !Self.supported.contains(k) { out.append("\(path): schema keyword \(k) unsupported by the test validator") }
        if let t = rules["type"] {
            let allowed: [String] = t.stringValue.map { [$0] } ?? (t.arrayValue?.compactMap(\.stringValue) ?? [])
            if Set(allowed).isDisjoint(with: typeName(v)) { out.append("\(path): type \(typeName(v)) not in \(allowed)"); return }
        }
        if let c = rules["const"], c != v { out.append("\(path): expected const \(c)") }
        if let e = rules["enum"]?.arrayValue, !e.contains(v) { out.append("\(path): \(v) not in enum") }
        if let p = rules["pattern"]?.stringValue, let s = v.stringValue, s.range(of: p, options: .regularExpression) == nil {
            out.append("\(path): '\(s)' does not match \(p)")
        }
        if let m = rules["minLength"]?.int64Value, let s = v.stringValue, s.count < m { out.append("\(path): shorter than \(m)") }
        if let m = rules["minimum"]?.int64Value, let i = v.int64Value, i < m { out.append("\(path): \(i) < \(m)") }
        if let m = rules["maximum"]?.int64Value, let i = v.int64Value, i > m { out.append("\(path): \(i) > \(m)") }
        if case .object(let o) = v {
            for r in rules["required"]?.arrayValue?.compactMap(\.stringValue) ?? [] where o[r] == nil {
                out.append("\(path): missing required \(r)")
            }
            let props = rules["properties"]?.objectValue ?? [:]
            for (k, child) in o {
                if let ps = props[k] { check(child, ps, path: "\(path).\(k)", into: &out) }
                else if rules["additionalProperties"] == .bool(false) { out.append("\(path): unexpected property \(k)") }
            }
        }
    }
}
