// The communicator: owns a transport and the rendezvous store, and runs the
// collectives submitted to it one after another on its own worker thread.
//
// Because one thread runs every collective in submission order, calls on one
// communicator complete in the order they were issued, and an async call makes
// progress while the caller computes. After the first failure the
// communicator is broken: the failure is reported to the store (so other ranks
// can name the rank that failed first), the transport is torn down so peers
// fail fast, and every later call is refused with the original error.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "algorithms/collective.h"
#include "engine/work.h"
#include "executor/device.h"
#include "rendezvous/store.h"
#include "transport/transport.h"

namespace rr {

struct CommStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t ops = 0;
  uint64_t small_message_ops = 0;  // all_reduce calls that took the small-message path
};

class Communicator {
 public:
  Communicator(std::unique_ptr<Store> store, std::unique_ptr<Transport> transport,
               double timeout_seconds, size_t segment_bytes, std::string store_prefix);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const char* transport_name() const { return transport_name_; }
  double timeout() const { return timeout_; }

  // Queues a collective. The buffers must stay valid until the Work finishes.
  // Throws at once if the communicator is closed or broken, or if the buffers
  // are on a CUDA device (args.device) that cannot be used.
  std::shared_ptr<Work> submit(const CollectiveArgs& args);

  // Finishes the queued work, then closes every connection. Idempotent.
  void close();

  CommStats stats() const;

 private:
  struct Item {
    CollectiveArgs args;
    std::shared_ptr<Work> work;
    std::shared_ptr<StreamMark> mark;  // the caller's stream at submit, for device buffers
  };

  // The Device serving CUDA device `id`, made on first use.
  Device& device(int id);
  void run();
  std::exception_ptr on_failure(std::exception_ptr error, const Item& item);

  int rank_;
  int size_;
  const char* transport_name_;
  double timeout_;
  size_t segment_bytes_;
  size_t small_bytes_;  // RINGREDUCE_SMALL_BYTES: all_reduce up to this size skips the ring
  std::string prefix_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Transport> transport_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool closing_ = false;
  bool closed_ = false;
  std::string broken_;  // the first error's message, once broken
  uint64_t submitted_ = 0;
  CommStats stats_;
  std::mutex devices_mu_;  // apart from mu_: making a Device can take a while
  std::map<int, std::unique_ptr<Device>> devices_;
  std::thread worker_;
};

// Builds a TCP communicator: a TCP store on master_addr:master_port hosted by
// rank 0 (or a file store in `store_dir` when it is not empty), then the ring
// connections.
std::unique_ptr<Communicator> create_tcp_communicator(int rank, int size,
                                                      const std::string& master_addr,
                                                      int master_port, double timeout_seconds,
                                                      size_t segment_bytes,
                                                      const std::string& store_dir);

}  // namespace rr
