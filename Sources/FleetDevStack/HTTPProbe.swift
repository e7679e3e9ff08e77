@_exported import FleetLoopback

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A minimal blocking HTTP/1.1 GET on loopback, for readiness probes and metrics scrapes between fleet processes
/// (demo orchestration, tests). Not a general HTTP client.
public enum HTTPProbe {
    public struct Response: Sendable {
        public var status: Int
        public var body: String
    }

    public static func get(host: String = "127.0.0.1", port: Int, path: String, timeoutSeconds: Int = 2) -> Response? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var tv = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(truncatingIfNeeded: port).bigEndian)
        addr.sin_addr.s_addr = inet_addr(host)
        let ok = withUnsafePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard ok == 0 else { return nil }
        let request = "GET \(path) HTTP/1.1\r\nHost: \(host)\r\nConnection: close\r\n\r\n"
        let sent = request.withCString { send(fd, $0, strlen($0), 0) }
        guard sent > 0 else { return nil }
        var data = [UInt8]()
        var buf = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = recv(fd, &buf, buf.count, 0)
            if n <= 0 { break }
            data.append(contentsOf: buf[0..<n])
        }
        let text = String(decoding: data, as: UTF8.self)
        guard text.hasPrefix("HTTP/1."), let status = Int(text.split(separator: " ").dropFirst().first ?? "") else { return nil }
        let body = text.components(separatedBy: "\r\n\r\n").dropFirst().joined(separator: "\r\n\r\n")
        return Response(status: status, body: body)
    }

    /// Sums the samples of one Prometheus metric by the value of one label (`nil` label: the total).
    public static func sumMetric(_ exposition: String, name: String, byLabel label: String? = nil) -> [String: Double] {
        var out: [String: Double] = [:]
        for line in exposition.split(separator: "\n") where line.hasPrefix(name) && !line.hasPrefix("#") {
            let rest = line.dropFirst(name.count)
            guard rest.first == "{" || rest.first == " " else { continue }
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { continue }
            var key = ""
            if let label, let r = line.range(of: "\(label)=\"") {
                let after = line[r.upperBound...]
                key = String(after.prefix { $0 != "\"" })
            }
            out[key, default: 0] += value
        }
        return out
    }
}
