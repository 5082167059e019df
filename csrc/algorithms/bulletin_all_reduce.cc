#include "algorithms/bulletin_all_reduce.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "executor/device.h"
#include "reduce/cpu_kernels.h"

namespace rr {

void bulletin_all_reduce(RingContext& ctx, const CollectiveArgs& args, Algorithm algorithm) {
  struct Entry {
    CallHeader header;
    char data[kBulletinDataBytes];
  };
  static_assert(sizeof(Entry) == Bulletin::kEntryBytes, "one bulletin entry");
  Bulletin& bulletin = *ctx.transport.bulletin();
  const int size = ctx.transport.size();
  const int rank = ctx.transport.rank();
  const size_t bytes = args.count * dtype_size(args.dtype);
  const Deadline deadline = ctx.deadline();
  Entry mine;
  mine.header = make_call_header(ctx, args, algorithm);
  // Device arrays: the few bytes go through pinned staging, one copy each way.
  Device* device = args.device >= 0 && bytes > 0 ? ctx.device : nullptr;
  char* staged_out = nullptr;
  // After an error, as the device executor does: drain the lanes, so that no copy
  // still queued touches the staging memory once the call has failed.
  struct DrainOnError {
    Device* device;
    const Deadline& deadline;
    bool done = false;
    ~DrainOnError() {
      if (device == nullptr || done) return;
      try {
        device->finish(deadline);
      } catch (...) {
        // Already failing: the first error is the one to report.
      }
    }
  } drain{device, deadline};
  if (device != nullptr) {
    device->begin(*ctx.device_mark);  // after the caller's work on its stream
    const Staging staging = device->staging(1, kBulletinDataBytes, 0);
    device->copy(Lane::kToHost, staging.send_host, args.send, bytes);
    device->record(Lane::kToHost, 0);
    device->sync(0, deadline);
    std::memcpy(mine.data, staging.send_host, bytes);
    staged_out = staging.recv_host;
  } else {
    std::memcpy(mine.data, args.send, bytes);
  }
  bulletin.publish(ctx.seq, &mine, sizeof(CallHeader) + bytes, true, deadline);
  // Every rank's data, in rank order, in the communicator's scratch.
  // At least a byte: a call of no elements still copies (nothing) through a
  // pointer, which must not be null.
  const size_t gathered = std::max<size_t>(1, static_cast<size_t>(size) * bytes);
  if (ctx.scratch.size() < gathered) ctx.scratch.resize(gathered);
  char* slots = ctx.scratch.data();
  std::memcpy(slots + static_cast<size_t>(rank) * bytes, mine.data, bytes);
  for (int i = 1; i < size; ++i) {
    const int peer = (rank + size - i) % size;  // the left neighbour first: the ring's check
    Entry theirs;
    try {
      bulletin.read(peer, ctx.seq, &theirs, sizeof(CallHeader) + bytes, deadline);
    } catch (const TimeoutError&) {
      never_started(ctx, args, peer);
    }
    check_call_header(theirs.header, mine.header, peer, rank);
    std::memcpy(slots + static_cast<size_t>(peer) * bytes, theirs.data, bytes);
  }
  const ReduceFn reduce = cpu_reduce_fn(args.dtype, args.op);
  char* out = staged_out != nullptr ? staged_out : static_cast<char*>(args.recv);
  reduce(out, slots, slots + bytes, args.count);
  for (int r = 2; r < size; ++r) reduce(out, out, slots + static_cast<size_t>(r) * bytes, args.count);
  if (args.op == ReduceOp::kAvg) divide_by(args.dtype, out, args.count, size);
  if (device != nullptr) {
    device->copy(Lane::kToDevice, args.recv, staged_out, bytes);
    device->finish(deadline);  // the caller's memory is final when the call returns
    drain.done = true;
  }
}

}  // namespace rr
