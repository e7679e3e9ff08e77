import CRdKafka
import Foundation

/// A consumer's librdkafka handle: subscription, polling and message conversion, offset store and commit, pause,
/// close. The owner (`ConsumerCore`) keeps every state decision; this type only makes the C calls.
///
/// librdkafka handles are thread-safe; `destroy()` must be the last call (the owner guarantees it under its lock).
final class RDKafkaConsumerHandle: @unchecked Sendable {
    let rk: OpaquePointer
    /// The consumer queue (`rd_kafka_poll_set_consumer` forwarded the main queue into it): serving it also serves
    /// rebalance and error callbacks. Only the poll thread uses it.
    private var consumerQueue: OpaquePointer?
    private var names = TopicNames()
    private var rkmessages = [UnsafeMutablePointer<rd_kafka_message_t>?](repeating: nil, count: 999)

    init(properties: [(String, String)]) throws(KafkaError) {
        let conf = try makeConf(properties, callbacks: [.errors, .rebalance])
        rk = try makeHandle(RD_KAFKA_CONSUMER, conf: conf)
    }

    /// Routes the callbacks to `owner` and subscribes to `topics`; on failure the handle is destroyed.
    func subscribe(_ topics: [String], owner: any RDKafkaClientOwner) throws(KafkaError) {
        RDKafkaRegistry.shared.register(rk, owner)
        rd_kafka_poll_set_consumer(rk)
        let list = rd_kafka_topic_partition_list_new(Int32(topics.count))
        for t in topics { rd_kafka_topic_partition_list_add(list, t, RD_KAFKA_PARTITION_UA) }
        let err = rd_kafka_subscribe(rk, list)
        rd_kafka_topic_partition_list_destroy(list)
        if err != RD_KAFKA_RESP_ERR_NO_ERROR {
            RDKafkaRegistry.shared.unregister(rk)
            rd_kafka_destroy(rk)
            throw KafkaError(err, message: "subscribe to \(topics): \(String(cString: rd_kafka_err2str(err)))")
        }
        consumerQueue = rd_kafka_queue_get_consumer(rk)
    }

    /// What one poll round drained from librdkafka's queue, and how many entries it left there.
    struct PollRound {
        var messages = 0
        var payloadBytes = 0
        var queuedAfter = 0
    }

    /// Poll thread: waits up to `timeoutMilliseconds` for the first message, then takes whatever else is already queued
    /// in one call. Messages go to `batch`; errors to `onError` (end-of-partition markers are skipped).
    func poll(timeoutMilliseconds: Int32, into batch: inout [KafkaMessage], onError: (KafkaError) -> Void) -> PollRound {
        var round = PollRound()
        guard let rkm = rd_kafka_consumer_poll(rk, timeoutMilliseconds) else { return round }
        convert(rkm, into: &batch, round: &round, onError: onError)
        rd_kafka_message_destroy(rkm)
        let n = rkmessages.withUnsafeMutableBufferPointer { buf in
            rd_kafka_consume_batch_queue(consumerQueue, 0, buf.baseAddress, buf.count)
        }
        for i in 0..<max(0, n) {
            guard let rkm = rkmessages[i] else { continue }
            convert(rkm, into: &batch, round: &round, onError: onError)
            rd_kafka_message_destroy(rkm)
        }
        round.queuedAfter = consumerQueue.map { Int(rd_kafka_queue_length($0)) } ?? 0
        return round
    }

    private func convert(
        _ rkm: UnsafeMutablePointer<rd_kafka_message_t>, into batch: inout [KafkaMessage], round: inout PollRound,
        onError: (KafkaError) -> Void
    ) {
        let m = rkm.pointee
        if m.err != RD_KAFKA_RESP_ERR_NO_ERROR {
            if m.err == RD_KAFKA_RESP_ERR__PARTITION_EOF { return }
            if m.err == RD_KAFKA_RESP_ERR__FATAL {
                onError(fatalError(of: rk))
            } else {
                onError(KafkaError(m.err, message: rd_kafka_message_errstr(rkm).map { String(cString: $0) } ?? ""))
            }
            return
        }
        let topic: String
        if let rkt = m.rkt {
            let key = UInt(bitPattern: rkt)
            if key == names.lastKey { topic = names.lastName } else if let t = names.byKey[key] {
                topic = t
                names.lastKey = key
                names.lastName = t
            } else {
                topic = String(cString: rd_kafka_topic_name(rkt))
                names.byKey[key] = topic
            }
        } else { topic = "" }
        round.messages += 1
        round.payloadBytes += m.len
        let value: [UInt8] = m.payload.map { copyBytes($0, m.len) } ?? []
        let key: [UInt8]? = m.key.map { copyBytes($0, m.key_len) }
        var headers: [KafkaHeader] = []
        var hdrs: OpaquePointer?
        if rd_kafka_message_headers(rkm, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR, let hdrs {
            var idx = 0
            var name: UnsafePointer<CChar>?
            var val: UnsafeRawPointer?
            var size = 0
            while rd_kafka_header_get_all(hdrs, idx, &name, &val, &size) == RD_KAFKA_RESP_ERR_NO_ERROR {
                let v: [UInt8] = val.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) } ?? []
                headers.append(KafkaHeader(key: name.map { String(cString: $0) } ?? "", value: v))
                idx += 1
            }
        }
        var tstype = RD_KAFKA_TIMESTAMP_NOT_AVAILABLE
        let ts = rd_kafka_message_timestamp(rkm, &tstype)
        batch.append(KafkaMessage(topic: topic, partition: m.partition, offset: m.offset, key: key, value: value,
                                  headers: headers,
                                  timestampMilliseconds: tstype == RD_KAFKA_TIMESTAMP_NOT_AVAILABLE ? nil : ts))
    }

    /// Stores the next offsets to commit. Returns the per-partition failures (`KafkaErrorCode.state` for a partition
    /// no longer assigned) and the call's overall error, if any.
    func storeOffsets(_ next: [TopicPartition: Int64]) -> (failures: [TopicPartition: KafkaError], overall: KafkaError?) {
        guard let list = makePartitionList(next.keys, offsets: next) else { return ([:], nil) }
        defer { rd_kafka_topic_partition_list_destroy(list) }
        let err = rd_kafka_offsets_store(rk, list)
        var failures: [TopicPartition: KafkaError] = [:]
        for i in 0..<Int(list.pointee.cnt) {
            let e = list.pointee.elems[i]
            guard e.err != RD_KAFKA_RESP_ERR_NO_ERROR else { continue }
            failures[TopicPartition(topic: String(cString: e.topic), partition: e.partition)] = KafkaError(e.err)
        }
        return (failures, err == RD_KAFKA_RESP_ERR_NO_ERROR ? nil : KafkaError(err))
    }

    /// Synchronous commit of the stored offsets; nil on success or when nothing was stored since the last commit.
    func commitStored() -> KafkaError? {
        let err = rd_kafka_commit(rk, nil, 0)
        return err == RD_KAFKA_RESP_ERR_NO_ERROR || err == RD_KAFKA_RESP_ERR__NO_OFFSET ? nil : KafkaError(err)
    }

    func pause(_ tp: TopicPartition) -> KafkaError? {
        guard let list = makePartitionList([tp]) else { return nil }
        defer { rd_kafka_topic_partition_list_destroy(list) }
        let err = rd_kafka_pause_partitions(rk, list)
        return err == RD_KAFKA_RESP_ERR_NO_ERROR ? nil : KafkaError(err)
    }

    /// Asynchronous seek of each partition to the offset given (`rd_kafka_seek_partitions` with no timeout): the
    /// partition's version is bumped before this returns, so a poll after it never hands out a message fetched before
    /// it; librdkafka then fetches from that offset and wakes the partition's broker thread. Returns the partitions
    /// the seek was refused for (not assigned in librdkafka, say).
    func seek(_ positions: [TopicPartition: Int64]) -> [TopicPartition: KafkaError] {
        guard let list = makePartitionList(positions.keys, offsets: positions) else { return [:] }
        defer { rd_kafka_topic_partition_list_destroy(list) }
        if let error = rd_kafka_seek_partitions(rk, list, 0) {
            let failure = KafkaError(consuming: error)
            return Dictionary(uniqueKeysWithValues: positions.keys.map { ($0, failure) })
        }
        var failures: [TopicPartition: KafkaError] = [:]
        for i in 0..<Int(list.pointee.cnt) {
            let e = list.pointee.elems[i]
            guard e.err != RD_KAFKA_RESP_ERR_NO_ERROR, e.err != RD_KAFKA_RESP_ERR__IN_PROGRESS else { continue }
            failures[TopicPartition(topic: String(cString: e.topic), partition: e.partition)] = KafkaError(e.err)
        }
        return failures
    }

    /// The partition's watermarks as last fetched (no broker round trip), when known.
    func cachedWatermarks(_ tp: TopicPartition) -> (low: Int64, high: Int64)? {
        var low: Int64 = -1, high: Int64 = -1
        guard rd_kafka_get_watermark_offsets(rk, tp.topic, tp.partition, &low, &high) == RD_KAFKA_RESP_ERR_NO_ERROR else { return nil }
        return (low, high)
    }

    /// Low and high watermark from the partition's leader (a ListOffsets round trip, blocking up to the timeout).
    func queryWatermarks(_ tp: TopicPartition, timeoutMilliseconds: Int32) -> Result<(Int64, Int64), KafkaError> {
        var low: Int64 = -1
        var high: Int64 = -1
        let err = rd_kafka_query_watermark_offsets(rk, tp.topic, tp.partition, &low, &high, timeoutMilliseconds)
        guard err == RD_KAFKA_RESP_ERR_NO_ERROR else {
            return .failure(KafkaError(err, message: "watermark query for \(tp.topic)[\(tp.partition)]: \(String(cString: rd_kafka_err2str(err)))"))
        }
        return .success((low, high))
    }

    /// The group's committed offset for the partition, nil when none or on error.
    func committedOffset(_ tp: TopicPartition, timeoutMilliseconds: Int32) -> Int64? {
        guard let list = makePartitionList([tp]) else { return nil }
        defer { rd_kafka_topic_partition_list_destroy(list) }
        guard rd_kafka_committed(rk, list, timeoutMilliseconds) == RD_KAFKA_RESP_ERR_NO_ERROR else { return nil }
        let offset = list.pointee.elems[0].offset
        return offset >= 0 ? offset : nil
    }

    /// Tests only: pauses or resumes fetching inside librdkafka without the owner knowing.
    func setPausedForTesting(_ tp: TopicPartition, paused: Bool) {
        guard let list = makePartitionList([tp]) else { return }
        defer { rd_kafka_topic_partition_list_destroy(list) }
        _ = paused ? rd_kafka_pause_partitions(rk, list) : rd_kafka_resume_partitions(rk, list)
    }

    /// Tests only: replaces librdkafka's assignment without the rebalance callback (nil: unassign all).
    func assignForTesting(_ tp: TopicPartition?, offset: Int64) {
        guard let tp else { _ = rd_kafka_assign(rk, nil); return }
        guard let list = makePartitionList([tp], offsets: [tp: offset]) else { return }
        defer { rd_kafka_topic_partition_list_destroy(list) }
        _ = rd_kafka_assign(rk, list)
    }

    /// Poll thread, once: commits stored offsets, serves the final revoke (rebalance callback) and leaves the group.
    func close() -> KafkaError? {
        if let q = consumerQueue { rd_kafka_queue_destroy(q) }  // every queue handle must be gone before rd_kafka_destroy
        consumerQueue = nil
        let err = rd_kafka_consumer_close(rk)
        return err == RD_KAFKA_RESP_ERR_NO_ERROR ? nil : KafkaError(err)
    }

    /// Frees the handle; the last call.
    func destroy() {
        RDKafkaRegistry.shared.unregister(rk)
        rd_kafka_destroy(rk)
    }
}

/// Topic names by `rd_kafka_topic_t*` (stable for the handle's life), with the last one cached.
private struct TopicNames {
    var byKey: [UInt: String] = [:]
    var lastKey: UInt = 0
    var lastName = ""
}

/// One allocation + memcpy. `Array(UnsafeRawBufferPointer)` is specialised for bytes in this module; the
/// `unsafeUninitializedCapacity` initializer called the standard library's generic array allocation, which looked up
/// `_ContiguousArrayStorage<UInt8>`'s metadata in the runtime (a locked map) for every value and key: ~4 % of `fleet
/// bench kafka`'s consume passes, and 28 % slower for 1 KiB in a loop of its own.
@inline(__always)
private func copyBytes(_ pointer: UnsafeMutableRawPointer, _ count: Int) -> [UInt8] {
    Array(UnsafeRawBufferPointer(start: pointer, count: count))
}
