import AppStoreVerification
import ArgumentParser
import FleetOperations
import Foundation
import Logging

/// `fleet verify`: verify App Store JWS from files or stdin, one JSON verdict per input line.
struct Verify: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "verify",
        abstract: "Verify App Store signed data (JWS), one item per input line; prints one JSON verdict per line.",
        discussion: """
            Each input line is a bare JWS (notification signedPayload, signed transaction, renewal info or \
            AppTransaction), Apple's POST body {"signedPayload":"..."}, a base64 legacy app receipt, a \
            {"receipt-data":"..."} body, or a StoreKit 1 transactionReceipt (with --trusted-intermediate). Output, in order, one JSON object per line:
              {"verdict":"verified","kind":"notification|transaction|renewalInfo|appTransaction|appReceipt","payload":{...}}
              {"verdict":"rejected","reason":"CODE","detail":"..."}
              {"verdict":"retryable","reason":"REVOCATION_STATUS_UNAVAILABLE","detail":"..."} (--revocation-check hard)
            Exit status: 0 when every line was processed (whatever the verdicts), 2 on usage or configuration errors.
            Blank lines are skipped.
            """
    )

    @Option(name: .customLong("root-certificate"), help: "Trusted root certificate, DER or PEM (repeatable).")
    var rootCertificates: [String] = []

    @Option(name: .customLong("bundle-id"), help: "The app's bundle identifier.")
    var bundleId: String?

    @Option(name: .customLong("environment"), help: "Accepted environment: Production or Sandbox (repeatable).")
    var environments: [String] = []

    @Option(name: .customLong("app-apple-id"), help: "The app's Apple ID (required with Production).")
    var appAppleId: Int64?

    @Option(name: .customLong("validation-time"), help: "signed-date (default, offline) or now.")
    var validationTime: String = "signed-date"

    @Flag(
        name: .customLong("allow-unsigned-environments"),
        help: "Development only: accept Xcode/LocalTesting data, which is not signed by Apple.")
    var allowUnsignedEnvironments = false

    @OptionGroup var revocation: RevocationOptions

    @Option(
        name: .customLong("max-receipt-bytes"),
        help: "Size bound of a legacy App Store receipt, bytes (default 1048576; JWS keep 65536).")
    var maxReceiptBytes: Int = VerificationPolicy.defaultMaxReceiptBytes

    @Option(
        name: .customLong("trusted-intermediate"),
        help: "Extra trusted intermediate certificate, DER or PEM (repeatable): \"Apple iTunes Store Certification Authority\" verifies StoreKit 1 transaction receipts.")
    var trustedIntermediates: [String] = []

    @Argument(help: "Input files ('-' or none: stdin).")
    var inputs: [String] = []

    func fail(_ message: String) -> ExitCode {
        FileHandle.standardError.write(Data("fleet verify: \(message)\n".utf8))
        return ExitCode(2)
    }

    func run() throws {
        guard let bundleId, !bundleId.isEmpty else { throw fail("--bundle-id is required") }
        if rootCertificates.isEmpty { throw fail("at least one --root-certificate is required") }
        if environments.isEmpty { throw fail("at least one --environment is required (Production or Sandbox)") }
        var roots: [TrustedRoot] = []
        for path in rootCertificates {
            guard let data = FileManager.default.contents(atPath: path) else {
                throw fail("cannot read root certificate \(path)")
            }
            do { roots += try TrustedRoot.load(derOrPEM: Array(data)) } catch {
                throw fail("root certificate \(path): \(error.message)")
            }
        }
        var intermediates: [TrustedRoot] = []
        for path in trustedIntermediates {
            guard let data = FileManager.default.contents(atPath: path) else {
                throw fail("cannot read trusted intermediate \(path)")
            }
            do { intermediates += try TrustedRoot.load(derOrPEM: Array(data)) } catch {
                throw fail("trusted intermediate \(path): \(error.message)")
            }
        }
        var envs = Set<AppStoreVerification.Environment>()
        for e in environments {
            guard let env = AppStoreVerification.Environment(parsing: e) else {
                throw fail("unknown environment \(e) (use Production or Sandbox)")
            }
            envs.insert(env)
        }
        guard let vt = ValidationTime(rawValue: validationTime) else {
            throw fail("--validation-time must be signed-date or now, not \(validationTime)")
        }
        let policy: VerificationPolicy
        do {
            policy = try VerificationPolicy(
                roots: roots, bundleId: bundleId, appAppleId: appAppleId, environments: envs, validationTime: vt,
                allowUnsignedEnvironments: allowUnsignedEnvironments, maxReceiptBytes: maxReceiptBytes,
                trustedIntermediates: intermediates)
        } catch {
            throw fail(error.message)
        }
        // Open every input before writing anything, so an unreadable file is a clean usage error; then stream.
        var handles: [FileHandle] = []
        let paths = inputs.isEmpty ? ["-"] : inputs
        for path in paths {
            if path == "-" {
                handles.append(FileHandle.standardInput)
            } else {
                var isDirectory: ObjCBool = false
                guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), !isDirectory.boolValue,
                    let h = FileHandle(forReadingAtPath: path)
                else { throw fail("cannot read input \(path)") }
                handles.append(h)
            }
        }
        let checker: RevocationChecker?
        do {
            // Flags, then FLEET_REVOCATION_CHECK / FLEET_OCSP_TIMEOUT_MS / FLEET_OCSP_MAX_AGE_SECONDS.
            let env = ProcessInfo.processInfo.environment
            checker = try revocation.checker(
                lookup: { $1 ?? env[FleetSettings.environmentName(for: $0)] },
                logger: Logger(label: "fleet.verify.revocation") { StreamLogHandler.standardError(label: $0) })
        } catch {
            throw fail("\(error)")
        }
        let verifier = SignedDataVerifier(policy: policy, revocation: checker)
        for h in handles { Self.process(h, verifier) }
    }

    /// Verifies one input stream line by line, writing each verdict as soon as its chunk is processed.
    static func process(_ handle: FileHandle, _ verifier: SignedDataVerifier) {
        let stdout = FileHandle.standardOutput
        var pending: [UInt8] = []
        var out: [UInt8] = []
        func emit(_ line: ArraySlice<UInt8>) {
            if line.allSatisfy({ $0 == 0x20 || $0 == 0x0D || $0 == 0x09 }) { return }
            verdict(verifier, line).write(into: &out, sortedKeys: true)
            out.append(UInt8(ascii: "\n"))
        }
        while true {
            let chunk = handle.availableData
            if chunk.isEmpty { break }
            pending.append(contentsOf: chunk)
            var start = 0
            while let nl = pending[start...].firstIndex(of: UInt8(ascii: "\n")) {
                emit(pending[start..<nl])
                start = nl + 1
            }
            pending.removeFirst(start)
            if !out.isEmpty {
                stdout.write(Data(out))
                out.removeAll(keepingCapacity: true)
            }
        }
        emit(pending[...])
        if !out.isEmpty { stdout.write(Data(out)) }
    }

    static func verdict(_ verifier: SignedDataVerifier, _ line: ArraySlice<UInt8>) -> JSONValue {
        do {
            let item = try verifier.verify(line)
            return .object(["verdict": "verified", "kind": .string(item.kind), "payload": item.renderedJSON])
        } catch {
            var o: [String: JSONValue] = [
                "verdict": error.isRetryable ? "retryable" : "rejected", "reason": .string(error.reason.rawValue), "detail": .string(error.detail),
            ]
            if let field = error.field { o["field"] = .string(field) }
            return .object(o)
        }
    }
}
