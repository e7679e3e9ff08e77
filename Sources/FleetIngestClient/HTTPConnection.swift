#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// An HTTP/1.1 response as read off the wire.
public struct HTTPResult: Sendable {
    public var status: Int
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]

    public func header(_ name: String) -> String? {
        headers.first { $0.name.lowercased() == name.lowercased() }?.value
    }
    public var text: String { String(decoding: body, as: UTF8.self) }
}

public enum HTTPClientError: Error, CustomStringConvertible, Sendable {
    case connect(String)
    case io(String)
    /// The server closed the connection before a whole response arrived.
    case closed
    case malformed(String)

    public var description: String {
        switch self {
        case .connect(let s): return "cannot connect: \(s)"
        case .io(let s): return "I/O error: \(s)"
        case .closed: return "connection closed by the server before a complete response"
        case .malformed(let s): return "malformed response: \(s)"
        }
    }
}

/// One blocking keep-alive HTTP/1.1 connection to an IPv4 address (loopback clients of `fleet ingest`: demo traffic,
/// `fleet bench ingest`, tests that need exact control of the bytes sent). Not thread-safe: one per thread.
/// Reconnects on the next request after the server closed the connection.
public final class HTTPConnection {
    public let host: String
    public let port: Int
    private let timeoutSeconds: Int
    private var fd: Int32 = -1
    private var buffer: [UInt8] = []

    public init(host: String = "127.0.0.1", port: Int, timeoutSeconds: Int = 30) throws(HTTPClientError) {
        self.host = host
        self.port = port
        self.timeoutSeconds = timeoutSeconds
        try connect()
    }

    deinit { close() }

    public var isOpen: Bool { fd >= 0 }

    private func connect() throws(HTTPClientError) {
        #if canImport(Glibc) || canImport(Musl)
            let s = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #else
            let s = socket(AF_INET, SOCK_STREAM, 0)
        #endif
        guard s >= 0 else { throw .connect("socket() failed, errno \(errno)") }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        guard inet_pton(AF_INET, host, &addr.sin_addr) == 1 else {
            _ = systemClose(s)
            throw .connect("'\(host)' is not an IPv4 address")
        }
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(s, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard rc == 0 else {
            let e = errno
            _ = systemClose(s)
            throw .connect("\(host):\(port): errno \(e)")
        }
        var one: Int32 = 1
        setsockopt(s, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        var tv = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        fd = s
        buffer.removeAll(keepingCapacity: true)
    }

    public func close() {
        if fd >= 0 { _ = systemClose(fd) }
        fd = -1
    }

    /// Writes raw bytes (reconnecting first if needed). For tests that send malformed or partial requests.
    public func send(raw bytes: [UInt8]) throws(HTTPClientError) {
        if fd < 0 { try connect() }
        var sent = 0
        while sent < bytes.count {
            let n = bytes.withUnsafeBytes { p in
                Glibc.send(fd, p.baseAddress! + sent, bytes.count - sent, Int32(MSG_NOSIGNAL))
            }
            if n <= 0 {
                let e = errno
                close()
                throw .io("send: errno \(e)")
            }
            sent += n
        }
    }

    /// Sends one request and reads its response. Adds Host and Content-Length.
    public func request(_ method: String, _ path: String, headers: [(String, String)] = [], body: [UInt8] = []) throws(HTTPClientError) -> HTTPResult {
        var head = "\(method) \(path) HTTP/1.1\r\nHost: \(host):\(port)\r\n"
        for (k, v) in headers { head += "\(k): \(v)\r\n" }
        if !body.isEmpty || method == "POST" || method == "PUT" { head += "Content-Length: \(body.count)\r\n" }
        head += "\r\n"
        try send(raw: Array(head.utf8) + body)
        return try readResponse()
    }

    /// `POST` with `Content-Type: application/json`.
    public func postJSON(_ path: String, _ body: [UInt8], headers: [(String, String)] = []) throws(HTTPClientError) -> HTTPResult {
        try request("POST", path, headers: [("Content-Type", "application/json")] + headers, body: body)
    }

    /// Reads one response (Content-Length framed, or until the server closes). An interim 1xx answer is returned as
    /// a response of its own, without a body.
    public func readResponse() throws(HTTPClientError) -> HTTPResult {
        guard fd >= 0 else { throw .closed }
        var headerEnd: Int?
        while true {
            if let i = find(crlfcrlf, in: buffer) { headerEnd = i; break }
            guard try fill() else { close(); throw .closed }
        }
        let headText = String(decoding: buffer[..<headerEnd!], as: UTF8.self)
        buffer.removeFirst(headerEnd! + 4)
        var lines = headText.split(separator: "\r\n", omittingEmptySubsequences: false).map(String.init)
        let statusLine = lines.removeFirst()
        let parts = statusLine.split(separator: " ", maxSplits: 2)
        guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), let status = Int(parts[1]) else {
            close()
            throw .malformed("status line '\(statusLine)'")
        }
        var headers: [(name: String, value: String)] = []
        for line in lines where !line.isEmpty {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers.append((String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: " \t")))
        }
        var result = HTTPResult(status: status, headers: headers, body: [])
        // An interim answer (`100 Continue`) has no body; the final answer follows as the next response.
        if (100..<200).contains(status) && status != 101 { return result }
        if let lengthText = result.header("Content-Length") {
            guard let length = Int(lengthText) else { close(); throw .malformed("Content-Length '\(lengthText)'") }
            while buffer.count < length {
                guard try fill() else { close(); throw .closed }
            }
            result.body = Array(buffer[..<length])
            buffer.removeFirst(length)
        } else if result.header("Transfer-Encoding")?.lowercased() == "chunked" {
            result.body = try readChunked()
        } else {
            while try fill() {}
            result.body = buffer
            buffer = []
            close()
        }
        if result.header("Connection")?.lowercased() == "close" { close() }
        return result
    }

    private func readChunked() throws(HTTPClientError) -> [UInt8] {
        var out: [UInt8] = []
        while true {
            var lineEnd: Int?
            while true {
                if let i = find(crlf, in: buffer) { lineEnd = i; break }
                guard try fill() else { close(); throw .closed }
            }
            let sizeText = String(decoding: buffer[..<lineEnd!], as: UTF8.self).split(separator: ";").first ?? ""
            guard let size = Int(sizeText.trimmingCharacters(in: " "), radix: 16) else { close(); throw .malformed("chunk size") }
            buffer.removeFirst(lineEnd! + 2)
            while buffer.count < size + 2 {
                guard try fill() else { close(); throw .closed }
            }
            if size == 0 { buffer.removeFirst(2); return out }
            out += buffer[..<size]
            buffer.removeFirst(size + 2)
        }
    }

    /// Reads more bytes; false on EOF.
    private func fill() throws(HTTPClientError) -> Bool {
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if n == 0 { return false }
        if n < 0 {
            let e = errno
            if e == ECONNRESET { return false }
            close()
            throw .io(e == EAGAIN || e == EWOULDBLOCK ? "timed out waiting for the server" : "recv: errno \(e)")
        }
        buffer += chunk[..<n]
        return true
    }

    private let crlfcrlf: [UInt8] = [13, 10, 13, 10]
    private let crlf: [UInt8] = [13, 10]

    private func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        var i = 0
        while i <= haystack.count - needle.count {
            if haystack[i] == needle[0] {
                var j = 1
                while j < needle.count, haystack[i + j] == needle[j] { j += 1 }
                if j == needle.count { return i }
            }
            i += 1
        }
        return nil
    }
}

private func systemClose(_ fd: Int32) -> Int32 {
    #if canImport(Glibc)
        return Glibc.close(fd)
    #elseif canImport(Musl)
        return Musl.close(fd)
    #else
        return Darwin.close(fd)
    #endif
}

extension Substring {
    fileprivate func trimmingCharacters(in set: String) -> String {
        var s = self[...]
        while let f = s.first, set.contains(f) { s = s.dropFirst() }
        while let l = s.last, set.contains(l) { s = s.dropLast() }
        return String(s)
    }
}

extension String {
    fileprivate func trimmingCharacters(in set: String) -> String { self[...].trimmingCharacters(in: set) }
}
