import AppStoreVerification
import Foundation
import Testing

@Suite struct JSONParserTests {
    @Test func parsesEveryValueKind() throws {
        let v = try JSONValue.parse(#" {"a":1,"b":-2.5e3,"c":"x\"y\u00e9\ud83d\ude00","d":[true,false,null],"e":{},"f":[] ,"g":9223372036854775807} "#)
        #expect(v["a"] == .integer(1))
        #expect(v["b"] == .number(-2500))
        #expect(v["c"] == .string("x\"yé😀"))
        #expect(v["d"] == .array([.bool(true), .bool(false), .null]))
        #expect(v["e"] == .object([:]))
        #expect(v["g"] == .integer(Int64.max))
        #expect(try JSONValue.parse("9223372036854775808") == .number(9223372036854775808))
    }

    @Test(arguments: [
        "", "{", "{\"a\":}", "{\"a\" 1}", "[1,]", "{\"a\":1,}", "01", "1.", "-", "tru", "\"abc", "\"\u{1}\"",
        "{\"a\":1}x", "\"\\x\"", "\"\\ud800\"", "{a:1}", "NaN",
    ])
    func rejectsInvalidJSON(_ text: String) {
        #expect(throws: JSONParseError.self) { try JSONValue.parse(text) }
    }

    @Test("named members by index, with the byte ranges of their values exactly as they appear; other members dropped")
    func namedMembersAndTheirRanges() throws {
        let text = #"{"x": {"b" : [1, 2], "a":"\u00e9"} ,"n":{"x":1},"y":null, "z" : 3}"#
        let bytes = Array(text.utf8)
        let names = JSONMemberNames(["x", "z", "missing", "y"])
        let members = try #require(try JSONValue.parseObjectMembers(bytes: bytes, names: names))
        #expect(members.values == [try JSONValue.parse(#"{"b":[1,2],"a":"é"}"#), .integer(3), nil, .null])
        let slices = members.ranges.map { $0.map { String(decoding: bytes[$0], as: UTF8.self) } }
        #expect(slices == [#"{"b" : [1, 2], "a":"\u00e9"}"#, "3", nil, "null"])
        // Not an object at the top: nil; errors are the parser's own.
        #expect(try JSONValue.parseObjectMembers(bytes: Array(" [1] ".utf8), names: names) == nil)
        #expect(throws: JSONParseError.self) { try JSONValue.parseObjectMembers(bytes: Array("[1".utf8), names: names) }
        #expect(throws: JSONParseError.self) { try JSONValue.parseObjectMembers(bytes: Array(#"{"x":1,"x":2}"#.utf8), names: names) }
        #expect(throws: JSONParseError.self) { try JSONValue.parseObjectMembers(bytes: Array(#"{"q":1,"q":2}"#.utf8), names: names) }
    }

    @Test("reading named members accepts and refuses exactly what parsing does (same errors, same offsets) and finds the same values; a skipped object is checked as parsed")
    func namedMembersAgreeWithParsing() throws {
        let inner = [
            #"{}"#, #"{"a":1}"#, #"{"a":{"b":[1,{"c":"d"}]},"e":"é\n\u00e9"}"#, #" { "a" : [ ] , "b" : { } } "#,
            #"{"a":1,"a":2}"#, #"{"a":1,"\u0061":2}"#, #"{"K":1,"\u212a":2}"#, #"{"é":1,"e\u0301":2}"#,
            #"{"a":[1,2}"#, #"{"a":"x\q"}"#, #"{"a":"\ud800"}"#, #"{"a":01}"#, #"{"a" 1}"#, #"{"a":1,}"#, #"{1:2}"#,
            #"{"a":tru}"#, #"{"a":"abcdefghijklmnop\u0000qrs"}"#, #"{"a":"x"#, "{\"a\":\"\u{1}\"}",
            String(repeating: #"{"a":"#, count: 70) + "1" + String(repeating: "}", count: 70), #"{"a":[[[[]]]],"b":-1.5e-3}"#,
            #"{"long key with spaces and more":"a value that is longer than eight bytes","x":true}"#, "[1]", "\"s\"", "7",
        ]
        // Objects past the parser's few keys compared one by one (`SeenKeys.linearLimit`), where keys are kept in sets.
        let many = (0..<40).map { #""k\#($0)":\#($0)"# }.joined(separator: ",")
        let large = [#"{\#(many)}"#, #"{\#(many),"K":1,"\u212a":2}"#, #"{\#(many),"\u0061x":1,"ax":2}"#,
                     #"{\#(many),"é":1,"e\u0301":2}"#, #"{\#(many),"k39":0}"#, #"{"k0":0,\#(many)}"#]
        var texts: [String] = []
        for document in inner + large {
            texts += [#"{"x":\#(document),"y":2}"#, #"{"y":[],"x":\#(document)}"#, #"{"x":\#(document)"#,
                      #"{"q":\#(document),"x":1}"#, #"{"\u0078":\#(document)}"#]
        }
        // Keys: a name written with an escape, duplicates of a name or of another key (also canonically equal ones),
        // and documents that are not objects or not JSON at all.
        texts += [
            #"{"x":1,"\u0078":2}"#, #"{"K":1,"\u212a":2}"#, #"{"\u212a":1,"K":2}"#, #"{"q":1,"q":2}"#, #"{"é":1,"e\u0301":2}"#,
            #"{"x":1}x"#, #"  {"x":1}  "#, #"{}"#, #"{"x":1,}"#, " [1] ", #""x""#, "", "{", "nul", #"{"x":"\ud800"}"#,
            #"{"xé":1,"xe\u0301":2}"#, #"{"y":"ab\"c","zz":3}"#,
        ]
        let plainNames = ["x", "y", "K", "zz", "absent"]
        for text in texts {
            let bytes = Array(text.utf8)
            let parsed = Result { () throws(JSONParseError) in try JSONValue.parse(bytes: bytes, maxDepth: 64) }
            for skipping: Set<String> in [[], ["x"]] {
                let names = JSONMemberNames(plainNames, skippingObjectsOf: skipping)
                let read = Result { () throws(JSONParseError) in
                    try JSONValue.parseObjectMembers(bytes: bytes, maxDepth: 64, names: names)
                }
                switch (parsed, read) {
                case (.failure(let a), .failure(let b)):
                    #expect(a == b, "\(text)")
                case (.success(.object(let object)), .success(let members?)):
                    for (index, name) in names.names.enumerated() {
                        let range = members.ranges[index]
                        #expect(range.flatMap { try? JSONValue.parse(bytes: bytes[$0], maxDepth: 64) } == object[name],
                                "\(text): the range of \(name)")
                        if skipping.contains(name), case .object? = object[name] {
                            #expect(members.values[index] == JSONValue.null, "\(text): \(name) skipped")
                        } else {
                            #expect(members.values[index] == object[name], "\(text): \(name)")
                        }
                    }
                case (.success(let value), .success(nil)):
                    if case .object = value { Issue.record("an object read as none: \(text)") }
                default:
                    Issue.record("reading named members changed the verdict for \(text): \(parsed) against \(read)")
                }
            }
        }
    }

    @Test("members of an object's text one by one, in order")
    func membersOfAnObjectText() throws {
        var seen: [(String, JSONValue)] = []
        try JSONValue.forEachMember(ofObject: #" {"b":1, "a":{"c":[true]},"é":"x\ty"} "#) { seen.append(($0, $1)) }
        #expect(seen.map(\.0) == ["b", "a", "é"])
        #expect(seen.map(\.1) == [.integer(1), .object(["c": .array([.bool(true)])]), .string("x\ty")])
        try JSONValue.forEachMember(ofObject: "{}") { _, _ in Issue.record("no member expected") }
        #expect(throws: JSONParseError.self) { try JSONValue.forEachMember(ofObject: "[1]") { _, _ in } }
        #expect(throws: JSONParseError.self) { try JSONValue.forEachMember(ofObject: #"{"a":1} x"#) { _, _ in } }
        #expect(throws: JSONParseError.self) { try JSONValue.forEachMember(ofObject: #"{"a":1"#) { _, _ in } }
    }

    @Test func rejectsDuplicateKeys() {
        do {
            _ = try JSONValue.parse(#"{"bundleId":"a","bundleId":"b"}"#)
            Issue.record("duplicate keys accepted")
        } catch {
            #expect(error.message.contains("duplicate"))
            #expect(error.offset == 16)
        }
    }

    @Test func boundsTheDepth() throws {
        let deep = String(repeating: "[", count: 40) + String(repeating: "]", count: 40)
        #expect(throws: JSONParseError.self) { try JSONValue.parse(deep) }
        _ = try JSONValue.parse(deep, maxDepth: 64)
    }

    @Test func rejectsInvalidUTF8() {
        #expect(throws: JSONParseError.self) { try JSONValue.parse(bytes: [0x22, 0xC3, 0x28, 0x22]) }
    }

    @Test func serializationRoundTrips() throws {
        let text = #"{"a":[1,2.5,"x\ny",null,true],"b":{"c":"é"},"d":-7}"#
        let v = try JSONValue.parse(text)
        #expect(v.serialized() == text)
        #expect(try JSONValue.parse(v.serialized()) == v)
    }

    @Test("strings are escaped wherever the characters to escape stand: first, last, alone, side by side")
    func escapesStringsAtEveryPosition() throws {
        let cases: [(String, String)] = [
            ("", #""""#), ("plain é😀", #""plain é😀""#), ("\"", #""\"""#), ("a\\", #""a\\""#),
            ("\nab\tc\r", #""\nab\tc\r""#), ("\u{1}\u{1f}x\u{0}", #""\u0001\u001fx\u0000""#),
            ("\"\"\\", #""\"\"\\""#), ("/<>", #""/<>""#),
        ]
        for (string, json) in cases {
            var out: [UInt8] = []
            JSONValue.writeString(string, into: &out)
            #expect(String(decoding: out, as: UTF8.self) == json)
            #expect(try JSONValue.parse(json) == .string(string))
        }
    }

    @Test func writesMembersInTheRequestedOrder() throws {
        let v = try JSONValue.parse(#"{"type":"x","bid":1,"a":{"zz":true,"b":null,"ccc":[{"yy":1,"x":2}]},"bundleId":"c","ab":0}"#)
        // jsonb's order: shorter keys first, then byte order, at every depth.
        #expect(String(decoding: v.serializedBytes(keyOrder: .jsonb), as: UTF8.self)
            == #"{"a":{"b":null,"zz":true,"ccc":[{"x":2,"yy":1}]},"ab":0,"bid":1,"type":"x","bundleId":"c"}"#)
        #expect(String(decoding: v.serializedBytes(keyOrder: .bytes), as: UTF8.self) == v.serialized())
        #expect(try JSONValue.parse(String(decoding: v.serializedBytes(keyOrder: .unordered), as: UTF8.self)) == v)
    }
}

@Suite struct Base64Tests {
    @Test func roundTripsAndIsStrict() {
        for n in 0..<40 {
            let bytes = (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 97 &+ 13) }
            #expect(Base64.decodeURL(Base64.encodeURL(bytes)) == bytes)
            #expect(Base64.decodeStandard(Base64.encodeStandard(bytes)) == bytes)
        }
        #expect(Base64.decodeURL("QQ") == [0x41])
        #expect(Base64.decodeURL("QR") == nil, "non-canonical trailing bits")
        #expect(Base64.decodeURL("QQ==") == nil, "no padding in base64url")
        #expect(Base64.decodeURL("Q") == nil)
        #expect(Base64.decodeURL("a+b/") == nil)
        #expect(Base64.decodeStandard("QQ") == nil, "padding required")
        #expect(Base64.decodeStandard("QQ==") == [0x41])
        #expect(Base64.decodeStandard("Q=Q=") == nil)
        #expect(Base64.decodeURL("-_-_") == [0xFB, 0xFF, 0xBF])
    }
}
