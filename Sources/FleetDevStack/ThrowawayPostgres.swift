import Foundation
import Logging
import NIOCore
import PostgresNIO
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A throwaway PostgreSQL server for tests, `fleet bench sink` and `fleet demo`.
///
/// It runs `initdb` into a fresh temporary directory, starts `postgres` with `pg_ctl` on a free loopback port
/// (unix sockets inside the temporary directory), trust authentication and durability switched OFF
/// (`fsync=off`, `synchronous_commit=off`, `full_page_writes=off`): **the data is meant to be thrown away**, never use
/// this for anything you want to keep. `stop()` / `start()` restart the same data directory on the same port (used to
/// simulate a database outage); `destroy()` stops the server and deletes the directory.
///
/// PostgreSQL refuses to run as root: when the current user is root, every server binary runs as the `postgres`
/// system user through `runuser -u postgres --` and the temporary directory is handed over to that user.
public final class ThrowawayPostgres: Sendable {
    public enum Failure: Error, CustomStringConvertible {
        case binariesNotFound(searched: [String])
        case noPostgresUser
        case commandFailed(command: String, status: Int32, output: String)
        case io(String)

        public var description: String {
            switch self {
            case .binariesNotFound(let searched):
                return "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found; searched PATH and "
                    + searched.joined(separator: ", ")
                    + ". Install PostgreSQL (e.g. `apt-get install postgresql`) or put its bin directory on PATH."
            case .noPostgresUser:
                return "running as root but there is no `postgres` system user to run the PostgreSQL server as"
                    + " (PostgreSQL refuses to run as root)"
            case .commandFailed(let command, let status, let output):
                return "`\(command)` failed with exit status \(status): \(output)"
            case .io(let message):
                return message
            }
        }
    }

    /// The directory holding initdb, pg_ctl and postgres.
    public let binDirectory: String
    /// The temporary directory (data directory, socket directory, server log).
    public let directory: String
    /// The server's port. Chosen at creation; chosen again if the server could not bind it (another process took it
    /// between the check and PostgreSQL's bind).
    public var port: Int { portBox.withLock { $0 } }
    private let portBox: Mutex<Int>
    public let host = "127.0.0.1"
    public let superuser = "postgres"
    /// The database created at start-up.
    public let database: String

    private let runAsPostgresUser: Bool
    private let choosePort: @Sendable () -> Int
    private var dataDirectory: String { directory + "/data" }
    private var logFile: String { directory + "/server.log" }

    /// `postgres://postgres@127.0.0.1:PORT/DATABASE`
    public var url: String { url(database: database) }

    public func url(database: String) -> String {
        "postgres://\(superuser)@\(host):\(port)/\(database)"
    }

    /// The collation a database is created with. The cluster itself is `--no-locale` (C); production databases are
    /// usually created with the host's locale (`en_US.UTF-8` on most Debian, Ubuntu and managed servers), which
    /// compares every text key linguistically: benchmarks and tests can create theirs that way.
    public enum DatabaseLocale: Sendable, Equatable, CustomStringConvertible {
        /// An ICU locale (`icu:en-US`): available wherever PostgreSQL is built with ICU, whatever the OS has.
        case icu(String)
        /// An operating-system locale (`en_US.UTF-8`): must be installed where the server runs (or under the
        /// `LOCPATH` it inherits).
        case libc(String)

        /// `icu:NAME` or a libc locale name; letters, digits, `_`, `-`, `.` and `@` only.
        public init(parsing text: String) throws {
            let isICU = text.hasPrefix("icu:")
            let name = isICU ? String(text.dropFirst(4)) : text
            guard !name.isEmpty, name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "_-.@".contains($0)) }) else {
                throw Failure.io("invalid database locale \(text.debugDescription): use icu:NAME (e.g. icu:en-US) or a locale name (e.g. en_US.UTF-8)")
            }
            self = isICU ? .icu(name) : .libc(name)
        }

        public var description: String {
            switch self {
            case .icu(let name): "icu:\(name)"
            case .libc(let name): name
            }
        }

        /// The clauses of `CREATE DATABASE` (from template0: its collation is the one given).
        var createClauses: String {
            switch self {
            case .icu(let name): "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE '\(name)' LOCALE 'C'"
            case .libc(let name): "TEMPLATE template0 LC_COLLATE '\(name)' LC_CTYPE '\(name)'"
            }
        }
    }

    /// Creates the cluster, starts it and creates `database` (with `databaseLocale`'s collation; nil: the cluster's,
    /// C). `choosePort` picks each port to try (tests give it one that is taken).
    public init(
        database: String = "fleet", databaseLocale: DatabaseLocale? = nil, logger: Logger = Logger(label: "throwaway-postgres"),
        choosePort: @escaping @Sendable () -> Int = Loopback.freePort
    ) async throws {
        self.binDirectory = try Self.findBinaries()
        self.choosePort = choosePort
        self.runAsPostgresUser = getuid() == 0
        self.database = database
        // Below the kernel's ephemeral range, like every port the demo stack picks (`Loopback.freePort`): a port the
        // kernel hands out for bind(0) may also become the local port of an outgoing connection before PostgreSQL
        // binds it.
        self.portBox = Mutex(try Self.freePort(choosePort))
        var template = Array((NSTemporaryDirectory() + "/fleet-pg-XXXXXX").utf8CString)
        let made: String? = template.withUnsafeMutableBufferPointer { buffer in
            guard let base = buffer.baseAddress, mkdtemp(base) != nil else { return nil }
            return String(cString: base)
        }
        guard let made else { throw Failure.io("cannot create a temporary directory: errno \(errno)") }
        self.directory = made
        do {
            if runAsPostgresUser {
                guard let pw = getpwnam("postgres") else { throw Failure.noPostgresUser }
                if chown(made, pw.pointee.pw_uid, pw.pointee.pw_gid) != 0 {
                    throw Failure.io("cannot hand \(made) to the postgres user: errno \(errno)")
                }
            }
            try run(
                "initdb",
                ["-D", dataDirectory, "-U", superuser, "--auth=trust", "--encoding=UTF8", "--no-locale", "--no-sync"]
            )
            try startOnAFreePort()
            try await createDatabase(database, locale: databaseLocale, logger: logger)
        } catch {
            destroy()
            throw error
        }
    }

    private static func freePort(_ choosePort: () -> Int) throws -> Int {
        let port = choosePort()
        guard port > 0 else { throw Failure.io("no free loopback port for PostgreSQL") }
        return port
    }

    /// The first start: when PostgreSQL could not bind the port chosen for it, another port (3 tries). Any other
    /// failure carries the end of the server's log, which `destroy()` then deletes.
    private func startOnAFreePort() throws {
        var tries = 0
        while true {
            tries += 1
            do {
                return try start()
            } catch {
                let log = serverLog()
                let lostPort = log.contains("could not bind") || log.contains("already in use")
                if lostPort && tries < 3 {
                    let next = try Self.freePort(choosePort)
                    portBox.withLock { $0 = next }
                    continue
                }
                let tail = log.split(separator: "\n").suffix(8).joined(separator: "\n")
                throw Failure.io("\(error)\nserver log (last lines):\n\(tail)")
            }
        }
    }

    /// Starts (or restarts) the server on the same data directory and port; waits until it accepts connections.
    public func start() throws {
        let options = [
            "-p \(port)", "-k \(directory)", "-c listen_addresses=\(host)",
            "-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off",
            "-c max_connections=200", "-c shared_buffers=128MB", "-c wal_init_zero=off",
        ].joined(separator: " ") + (ProcessInfo.processInfo.environment["FLEET_POSTGRES_OPTIONS"].map { " " + $0 } ?? "")
        try run("pg_ctl", ["-D", dataDirectory, "-l", logFile, "-w", "-t", "60", "-o", options, "start"])
    }

    /// Turns TLS on with this server certificate and key (PEM) and restarts the server. Plain connections are still
    /// accepted (the tests compare both).
    public func enableTLS(certificatePEM: String, keyPEM: String) throws {
        let cert = directory + "/server.crt", key = directory + "/server.key"
        guard FileManager.default.createFile(atPath: cert, contents: Data(certificatePEM.utf8), attributes: [.posixPermissions: 0o644]),
              FileManager.default.createFile(atPath: key, contents: Data(keyPEM.utf8), attributes: [.posixPermissions: 0o600])
        else { throw Failure.io("cannot write the TLS files into \(directory)") }
        if runAsPostgresUser, let pw = getpwnam("postgres") {
            for file in [cert, key] where chown(file, pw.pointee.pw_uid, pw.pointee.pw_gid) != 0 {
                throw Failure.io("cannot hand \(file) to the postgres user: errno \(errno)")
            }
        }
        let conf = "\nssl = on\nssl_cert_file = '\(cert)'\nssl_key_file = '\(key)'\n"
        guard let handle = FileHandle(forWritingAtPath: dataDirectory + "/postgresql.conf") else {
            throw Failure.io("cannot open postgresql.conf")
        }
        handle.seekToEndOfFile()
        handle.write(Data(conf.utf8))
        handle.closeFile()
        try stop()
        try start()
    }

    /// Stops the server (fast shutdown: open connections are terminated).
    public func stop() throws {
        try run("pg_ctl", ["-D", dataDirectory, "-w", "-t", "60", "-m", "fast", "stop"])
    }

    /// Stops the server if it runs and deletes the temporary directory. Never throws.
    public func destroy() {
        if FileManager.default.fileExists(atPath: dataDirectory + "/postmaster.pid") {
            try? run("pg_ctl", ["-D", dataDirectory, "-w", "-t", "30", "-m", "immediate", "stop"])
        }
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Creates a database and returns its URL.
    @discardableResult
    public func createDatabase(
        _ name: String, locale: DatabaseLocale? = nil, logger: Logger = Logger(label: "throwaway-postgres")
    ) async throws -> String {
        guard !name.isEmpty, name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "_") }) else {
            throw Failure.io("invalid database name \(name.debugDescription): use letters, digits and _")
        }
        let config = PostgresConnection.Configuration(
            host: host, port: port, username: superuser, password: nil, database: "postgres", tls: .disable)
        let connection = try await PostgresConnection.connect(configuration: config, id: 0, logger: logger)
        do {
            try await connection.query(
                PostgresQuery(unsafeSQL: "CREATE DATABASE \"\(name)\" \(locale?.createClauses ?? "")"), logger: logger)
        } catch {
            try? await connection.close()
            throw error
        }
        try await connection.close()
        return url(database: name)
    }

    /// The server log (useful when a test fails).
    public func serverLog() -> String {
        (try? String(contentsOfFile: logFile, encoding: .utf8)) ?? ""
    }

    // MARK: - helpers

    static func findBinaries() throws -> String {
        var searched: [String] = []
        let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
        for dir in path.split(separator: ":").map(String.init) where !dir.isEmpty {
            if hasServerBinaries(dir) { return dir }
        }
        let root = "/usr/lib/postgresql"
        searched.append(root + "/*/bin")
        let versions = (try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []
        let sorted = versions.sorted { (Int($0) ?? 0, $0) > (Int($1) ?? 0, $1) }
        for version in sorted {
            let dir = "\(root)/\(version)/bin"
            if hasServerBinaries(dir) { return dir }
        }
        throw Failure.binariesNotFound(searched: searched)
    }

    private static func hasServerBinaries(_ dir: String) -> Bool {
        ["initdb", "pg_ctl", "postgres"].allSatisfy { FileManager.default.isExecutableFile(atPath: dir + "/" + $0) }
    }

    /// Runs a server binary (as the postgres user when root) with posix_spawn + waitpid. Foundation's `Process`
    /// is not used: on Linux it can miss the exit of concurrently launched children and wait forever.
    private func run(_ tool: String, _ arguments: [String]) throws {
        let executable = binDirectory + "/" + tool
        var argv: [String]
        if runAsPostgresUser {
            let runuser = FileManager.default.isExecutableFile(atPath: "/usr/sbin/runuser") ? "/usr/sbin/runuser" : "/sbin/runuser"
            argv = [runuser, "-u", "postgres", "--", executable] + arguments
        } else {
            argv = [executable] + arguments
        }
        let capture = directory + "/last-command.out"
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, capture, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        // Nothing else of this process is inherited: `pg_ctl start` leaves a long-lived server behind, and a server
        // holding copies of this process's sockets (the embedded cluster's broker connections in `fleet bench
        // chaos`) keeps them open after this process closes them, so their peers never see the close.
        // (glibc's posix_spawn_file_actions_addclosefrom_np is not visible to Swift: mark every descriptor
        // close-on-exec instead; harmless for this process, which never execs itself.)
        for name in (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? [] {
            guard let fd = Int32(name), fd > 2 else { continue }
            let flags = fcntl(fd, F_GETFD)
            if flags >= 0, flags & FD_CLOEXEC == 0 { _ = fcntl(fd, F_SETFD, flags | FD_CLOEXEC) }
        }
        var environment = ProcessInfo.processInfo.environment
        environment["LC_ALL"] = "C"
        let envp = environment.map { "\($0.key)=\($0.value)" }
        var pid: pid_t = 0
        let spawned: Int32 = withCStrings(argv) { cArgv in
            withCStrings(envp) { cEnv in posix_spawn(&pid, argv[0], &actions, nil, cArgv, cEnv) }
        }
        guard spawned == 0 else { throw Failure.io("cannot run \(argv[0]): errno \(spawned)") }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 {
            guard errno == EINTR else { throw Failure.io("waitpid failed: errno \(errno)") }
        }
        // WIFEXITED / WEXITSTATUS
        let exited = (status & 0x7f) == 0
        let code = exited ? (status >> 8) & 0xff : 128 + (status & 0x7f)
        if code != 0 {
            let text = (try? String(contentsOfFile: capture, encoding: .utf8)) ?? ""
            let log = String(serverLog().suffix(2000))
            throw Failure.commandFailed(
                command: ([tool] + arguments).joined(separator: " "), status: code,
                output: text + (log.isEmpty ? "" : "\nserver log:\n" + log)
            )
        }
    }
}

private func withCStrings<R>(_ strings: [String], _ body: ([UnsafeMutablePointer<CChar>?]) -> R) -> R {
    var pointers: [UnsafeMutablePointer<CChar>?] = strings.map { strdup($0) }
    pointers.append(nil)
    defer { for p in pointers { free(p) } }
    return body(pointers)
}
