/// Why a benchmark could not produce its figure (a setup step failed, the system under test did not finish, an input
/// was out of range). Named as ArgumentParser's error so that the messages read the same from `fleet bench`.
struct ValidationError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
