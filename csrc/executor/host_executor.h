// The executor for host memory: segments go to the transport as they are,
// and received segments are reduced by the CPU kernels straight out of the
// transport's view of them (no copy of our own in between).
//
// Each step completes before step() returns, its sends included: the next
// step may then overwrite any memory this one read. Inside a step, receives
// run a few segments ahead of the one being reduced, so a reduction overlaps
// the arrival of the next segments.
#pragma once

#include <vector>

#include "executor/executor.h"
#include "reduce/cpu_kernels.h"

namespace rr {

class HostExecutor final : public Executor {
 public:
  // `storage` is the communicator's scratch, reused from call to call.
  HostExecutor(const ExecutorSetup& setup, std::vector<char>& storage);

  char* scratch() override { return scratch_; }
  void step(const StepPlan& plan) override;
  void exchange(const std::vector<StepPlan>& plans) override;
  // Out of place: sends straight from `send` and reduces straight out of
  // the transport's views of the peers' vectors, with no copy into scratch.
  bool direct_reduce(int rank, int size, const void* send, void* recv, size_t count) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void reduce(void* out, const void* a, const void* b, size_t n) override;
  void divide(void* data, size_t n, int divisor) override;
  void finish() override {}
  CodecOps* codec_ops() override;
  void exchange_while(const std::vector<StepPlan>& plans,
                      const std::function<void()>& meanwhile) override;
  void poke() override;

 private:
  ExecutorSetup setup_;
  Transport& transport_;
  ReduceFn reduce_;
  ReduceFn stream_sum_;  // sums with streaming stores, or null (cpu_stream_sum_fn)
  size_t elem_;
  size_t segment_;
  char* scratch_;
  std::vector<RequestPtr> sends_;  // reused between steps
  std::vector<RequestPtr> recvs_;

  // Posts every segment of every plan (exchange); wait_posted() waits for them.
  void post(const std::vector<StepPlan>& plans);
  void wait_posted();
};

}  // namespace rr
