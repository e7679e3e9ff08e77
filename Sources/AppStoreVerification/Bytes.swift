// Helpers to run typed-throwing code over contiguous bytes without copying when possible.

@inline(__always)
func withContiguousBytes<C: Collection, R, E: Error>(
    _ c: C, _ body: (UnsafeBufferPointer<UInt8>) throws(E) -> R
) throws(E) -> R where C.Element == UInt8 {
    let r: Result<R, E>? = c.withContiguousStorageIfAvailable { buf in
        Result { () throws(E) -> R in try body(buf) }
    }
    if let r { return try r.get() }
    let copy = Array(c)
    let r2: Result<R, E> = copy.withUnsafeBufferPointer { buf in Result { () throws(E) -> R in try body(buf) } }
    return try r2.get()
}

@inline(__always)
func withUTF8Bytes<R, E: Error>(_ s: String, _ body: (UnsafeBufferPointer<UInt8>) throws(E) -> R) throws(E) -> R {
    var s = s
    let r: Result<R, E> = s.withUTF8 { buf in Result { () throws(E) -> R in try body(buf) } }
    return try r.get()
}
