// The libFuzzer entry points (built only by `make fuzz` / `make fuzz-short`, see Package.swift). One binary serves
// every target; FLEET_FUZZ_TARGET picks it (jws, base64, receipt, event, catalogue, config, ingest).
import FleetFuzzing
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

let selected: FuzzTarget = {
    // `make fuzz-seeds`: FLEET_FUZZ_GENERATE=<repository> writes new roots and seed corpora, then exits.
    if let repository = getenv("FLEET_FUZZ_GENERATE").map({ String(cString: $0) }) {
        do {
            let n = try SeedCorpus.write(toRepository: URL(fileURLWithPath: repository))
            printError("wrote \(n) seeds under \(repository)/Fuzz/corpus and the roots they chain to; rebuild")
            exit(0)
        } catch {
            printError("seed generation failed: \(error)")
            exit(1)
        }
    }
    // The differential corpus and the fleet's verdicts (Fuzz/differential/compare.py runs Apple's side).
    if let dir = getenv("FLEET_FUZZ_DIFFERENTIAL").map({ String(cString: $0) }) {
        do {
            let count = getenv("FLEET_DIFFERENTIAL_COUNT").flatMap { Int(String(cString: $0)) } ?? 3000
            try DifferentialCorpus(count: count).write(to: URL(fileURLWithPath: dir))
            exit(0)
        } catch {
            printError("differential corpus failed: \(error)")
            exit(1)
        }
    }
    let name = getenv("FLEET_FUZZ_TARGET").map { String(cString: $0) } ?? ""
    guard let target = FuzzTarget(rawValue: name) else {
        printError("set FLEET_FUZZ_TARGET to one of: \(FuzzTarget.allCases.map(\.rawValue).joined(separator: ", "))")
        exit(2)
    }
    return target
}()

@_cdecl("LLVMFuzzerInitialize")
public func fuzzerInitialize(
    _ argc: UnsafeMutablePointer<CInt>, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>
) -> CInt {
    // Each target's own -max_len (FuzzTarget.maxLength) unless the command line sets one.
    var args: [UnsafeMutablePointer<CChar>?] = (0..<Int(argc.pointee)).map { argv.pointee![$0] }
    if !args.contains(where: { $0.map { String(cString: $0).hasPrefix("-max_len=") } ?? false }) {
        args.append(strdup("-max_len=\(selected.maxLength)"))
    }
    args.append(nil)
    let copy = UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>.allocate(capacity: args.count)
    copy.initialize(from: args, count: args.count)
    argv.pointee = copy
    argc.pointee = CInt(args.count - 1)
    return 0
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzerTestOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    do {
        try selected.run(UnsafeBufferPointer(start: data, count: size))
    } catch {
        // An invariant failed: abort so that libFuzzer saves the input as a crash artifact.
        printError("\(error)")
        abort()
    }
    return 0
}

func printError(_ message: String) {
    var line = message + "\n"
    line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
}
