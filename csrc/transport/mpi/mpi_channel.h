// The MPI communicator that ringreduce owns, shared by the MPI transport and
// the MPI store.
//
// It is a duplicate of the caller's communicator, so our messages can never
// match the caller's receives, and its error handler returns codes instead of
// aborting the job. Two tags are used on it: kDataTag for the ring's payload
// (the transport) and kControlTag for out-of-band control messages: store
// values (failure reports) and notices (timing out, abort). A control message starts with
// this channel's instance number, agreed at creation, so a message left over
// from an earlier communicator that MPI recycled the context of is ignored.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/liveness.h"

namespace rr {

class MpiChannel {
 public:
  static constexpr int kDataTag = 7201;
  static constexpr int kControlTag = 7202;

  // Duplicates `comm`. Collective over `comm`: every rank must call it, and
  // the wait for the others is bounded by `deadline` (TimeoutError).
  // With `watch_liveness`, also connects a Liveness mesh (common/liveness.h)
  // so that a rank whose process ends is known within moments; without it (or
  // if the ranks cannot reach each other's sockets) dead ranks are found by
  // timeouts, as MPI alone allows. The mesh's sockets are advertised at
  // `socket_addr` (Options::socket_addr); empty: the address of the default
  // route's interface.
  static std::shared_ptr<MpiChannel> open(MPI_Comm comm, const Deadline& deadline,
                                          bool watch_liveness = false,
                                          const std::string& socket_addr = {});
  ~MpiChannel();
  MpiChannel(const MpiChannel&) = delete;
  MpiChannel& operator=(const MpiChannel&) = delete;

  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Serializes our MPI calls when the library was initialized below
  // MPI_THREAD_MULTIPLE (each communicator has its own worker thread); a
  // no-op lock otherwise.
  std::unique_lock<std::recursive_mutex> guard();

  // Sends key=value to every other rank; they see it after their next poll()
  // (a rank keeps the first value it sees for a key).
  void publish(const std::string& key, const std::string& value);
  // Notices a rank sends every other rank about itself.
  enum class Notice : char {
    kTimingOut = 'T',  // a wait of ours passed its deadline; we fail shortly
    kAbort = 'A',      // we gave up on the communicator
  };
  void announce(Notice notice);
  // Receives every control message that has arrived. Never blocks for long.
  void poll();

  // This rank's copy of the values: its own and those the last poll() received.
  std::optional<std::string> value(const std::string& key);
  void put(const std::string& key, const std::string& value);
  // Stores `value` unless the key is known; returns the key's value afterwards.
  std::string put_if_absent(const std::string& key, const std::string& value, bool* inserted);
  // True once `peer` announced `notice`, as seen by the last poll().
  bool announced(int peer, Notice notice);

  // After a failure, messages may still be in flight on this communicator.
  // Freeing it would let MPI hand its context to a later communicator, where
  // those messages could match, so a failed channel is deliberately never
  // freed (one communicator handle leaks per failure).
  void mark_failed() { failed_ = true; }
  bool failed() const { return failed_; }

  // Whose processes are known to have ended; null when not watched.
  const Liveness* liveness() const { return liveness_.get(); }
  // Says goodbye on the liveness connections and closes them: the
  // communicator is closing, and a peer still waiting on us learns it now.
  void leave() { liveness_.reset(); }

  // Raises rr::Error for a failed MPI call.
  static void check(int code, const char* what);

 private:
  struct Message {
    std::vector<char> bytes;
    MPI_Request request;
  };

  MpiChannel() = default;
  // Tests `request` until it completes or `deadline` passes (false). Sleeps
  // between tests: only bootstrap and teardown use it. Locks per test, so
  // other communicators keep progressing while we wait for slow ranks.
  bool test_until(MPI_Request& request, const Deadline& deadline);
  void send_control(char kind, const std::string& payload);
  void watch_liveness(const Deadline& deadline, const std::string& socket_addr);
  void reap_outgoing(bool final);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  uint64_t instance_ = 0;
  bool serialize_ = false;
  std::atomic<bool> failed_{false};

  std::mutex state_mu_;  // guards the fields below
  std::map<std::string, std::string> values_;
  std::vector<bool> timing_out_;                    // by rank
  std::vector<bool> aborted_;                       // by rank
  std::vector<std::unique_ptr<Message>> outgoing_;  // control sends in flight
  std::unique_ptr<Liveness> liveness_;
};

}  // namespace rr
