// The communicator: owns a transport and the rendezvous store, and runs
// collectives one at a time, in the order they were issued.
//
// A blocking call on an idle communicator runs on the caller's thread: no
// hand-off to another thread, whose wake-up costs more than a small
// collective. Async calls, and calls issued while others are queued, run on
// the communicator's worker thread in issue order, so an async call makes
// progress while the caller computes, and calls complete in issue order.
//
// After the first failure the communicator is broken: the failure is
// reported to the store (engine/failure_report.h), the transport is torn
// down so peers fail fast, and every later call is refused with the original
// error.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/collective.h"
#include "engine/failure_report.h"
#include "engine/options.h"
#include "engine/p2p.h"
#include "engine/work.h"
#include "executor/device.h"
#include "executor/device_window.h"
#include "rendezvous/store.h"
#include "transport/counting.h"
#include "transport/shm/shm_window.h"
#include "transport/transport.h"

namespace rr {

// A codec's compressed collectives on one communicator.
struct CodecCounters {
  uint64_t calls = 0;
  uint64_t wire_bytes = 0;  // sent by this rank, call headers included
  double seconds = 0;       // of codec work: encodes, decodes, conversions
  uint64_t pieces = 0;      // the calls' pieces (algorithms/one_hop.h), added up
  // The quality canary (compression/canary.py's CodecStats): checks made,
  // the last one's error and bias, the worst error, whether the codec fell
  // back (its later calls run exact), and the calls run exact since.
  uint64_t canary_checks = 0;
  double compression_error = 0;
  double worst_error = 0;
  double bias = 0;
  bool fell_back = false;
  uint64_t fallbacks = 0;
};

struct CommStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t ops = 0;
  // all_reduce calls by algorithm (indexed by Algorithm)
  uint64_t all_reduce_by_algorithm[kAlgorithms] = {};
  // Of the collectives' bytes, those to and from ranks on other hosts.
  uint64_t bytes_sent_between_hosts = 0;
  uint64_t bytes_received_between_hosts = 0;
  // The TCP ring links (to the right neighbour, from the left) this
  // communicator took over from the one it shrank from, and connected anew.
  int tcp_links_reused = 0;
  int tcp_links_connected = 0;
  // Local peers whose shared memory it took over (a shrink).
  int shm_peers_reused = 0;
  // Of the bytes staged device calls received, those copied onto the device
  // straight out of the shared-memory transport's inboxes, with no host copy
  // (executor/device_executor.h: landing in place).
  uint64_t staged_in_place_bytes = 0;
  // Compressed collectives, by codec name (Compression::name).
  std::map<std::string, CodecCounters> codecs;
};

// Where this rank sits among the ranks of its host.
struct Placement {
  int local_rank = 0;
  int local_size = 1;
  std::vector<int> local_ranks;  // the ranks on this host, ascending
};

class Communicator {
 public:
  // `p2p`: the links for send/recv (may be null: then they are refused).
  Communicator(std::unique_ptr<Store> store, std::unique_ptr<Transport> transport,
               const Options& options, Placement placement, std::string store_prefix,
               std::unique_ptr<Transport> p2p = nullptr);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return placement_.local_rank; }
  int local_size() const { return placement_.local_size; }
  const char* transport_name() const { return transport_name_; }
  double timeout() const { return options_.timeout_seconds; }
  bool fake_device() const { return options_.fake_device; }

  // Queues a collective for the worker thread. The buffers must stay valid
  // until the Work finishes. Throws at once if the communicator is closed or
  // broken, or if the buffers are on a CUDA device (args.device) that cannot
  // be used.
  std::shared_ptr<Work> submit(const CollectiveArgs& args);

  // Runs a collective to completion: on the calling thread when nothing is
  // queued or running, else after the queued ones. `interrupt` (may be null)
  // is asked while it waits, and may abandon the call.
  void run(const CollectiveArgs& args, const Interrupt* interrupt);

  // Waits at most `seconds` (negative: until it ends) for a collective that
  // submit() queued; true when it has finished (its error rethrown). While
  // the worker has not taken it yet, this thread runs it, and the host calls
  // queued before it, itself: the caller waits anyway, and a hand-off to the
  // worker and back costs two wake-ups (tens of microseconds on a busy
  // machine, as much as the collective). `interrupt` as for run().
  bool wait(const std::shared_ptr<Work>& work, double seconds, const Interrupt* interrupt);

  // Point-to-point messages (engine/p2p.h), beside the collectives and in
  // no order with them. src < 0: from any rank.
  std::shared_ptr<Work> send(const void* data, size_t bytes, int dst, int64_t tag);
  std::shared_ptr<Work> recv(void* data, size_t bytes, int src, int64_t tag);

  // Finishes the queued work, then closes every connection. Idempotent, and
  // safe to call from several threads at once (the others wait for the first).
  void close();

  // The caller stopped waiting for this communicator's work (Ctrl-C in
  // Work.wait()). The collective the worker runs, or else the next one it
  // takes, fails as interrupted on the worker's own thread, which publishes
  // the interruption so that the peers raise PeerError naming this rank, and
  // the communicator is broken from then on. Point-to-point operations in
  // flight fail as interrupted too, and its links are torn down so that the
  // peers waiting on them fail naming this rank.
  void interrupt();

  // Stops this rank's work now, from any thread (torchft's abort): queued
  // collectives fail at once, the running one at its next look at the flag
  // (milliseconds), point-to-point operations likewise, and the links are
  // torn down so that the peers raise PeerError naming this rank. Nothing is
  // waited for; the communicator refuses later calls and can still be
  // closed. Idempotent.
  void abort();

  // This rank refused a collective before issuing it (bad arguments: the
  // caller raised ValueError/TypeError), while the other ranks may be in it.
  // Records why, under the number the call would have had, so that a peer
  // whose call then fails on account of this rank (it leaves, calls something
  // else, or never comes) names this rank and this reason. Nothing else
  // changes: a corrected retry of the call pairs up as usual.
  void note_refused_call(const std::string& call, const std::string& reason);

  CommStats stats() const;

  // A window of `bytes` (> 0) that every rank of the communicator maps
  // (transport/shm/shm_window.h), for all_reduce to read in place: collective,
  // the k-th call making window k on every rank, each of its own size. Null,
  // with nothing exchanged, where the ranks do not all share this host. Throws
  // Error naming the rank that could not make or map one (on every rank).
  std::shared_ptr<SharedWindow> allocate_window(size_t bytes, const Interrupt* interrupt);
  // The same in the memory of CUDA device `device` (executor/device_window.h),
  // zeroed: every rank of the host maps it through the Device. Where the
  // ranks do not all share this host (or on one rank) it is this rank's
  // memory alone, exchanged with nobody and not a window of the collectives.
  std::shared_ptr<DeviceWindow> allocate_device_window(size_t bytes, int device,
                                                       const Interrupt* interrupt);

  // After a failure (or abort()), once no call runs: the transport whose
  // parked links (TCP) and memory (shared) a shrink of this communicator may
  // take over; else null. Valid until close().
  Transport* revoked_transport();
  // Once a shrink has taken over what it could of revoked_transport(): closes
  // the rest (links to the dead, memory not taken over) now rather than at
  // close(), which the program may never call. No-op unless revoked and idle.
  void release_links();

  // Values beside the collectives, in this communicator's part of the
  // rendezvous store (under "user/"): what a layer above needs every rank to
  // know before anything can fail (the standby stores' addresses). fetch
  // waits up to `seconds` for the key.
  void publish(const std::string& key, const std::string& value);
  std::string fetch(const std::string& key, double seconds);
  // The keys set already, read together (None for the others): one round trip.
  std::vector<std::optional<std::string>> try_fetch_many(const std::vector<std::string>& keys);
  // The communicator's identity: the prefix of its keys, the same on every rank.
  const std::string& id() const { return prefix_; }
  // Why the communicator runs no more collectives (its first failure, or
  // abort()), or "" while it is usable.
  std::string failure() const;

  // Which of the program's threads issues the calls that follow (any 64-bit
  // tag; 0, the default, means none). Each call's header carries the tag it
  // was issued with and its neighbour compares it with its own, so calls
  // that two threads issue in a different order on different ranks raise
  // MismatchError ("issued by another thread") instead of combining one
  // thread's data with another's. The caller keeps it set while it issues.
  void set_issuer(uint64_t tag);

 private:
  // The point-to-point links; an error if the communicator is broken or has none.
  PointToPoint& point_to_point();

  // What each rank tells the others while making window `id`: how to map its
  // memory, or why it has none.
  struct WindowRecord {
    uint64_t id;
    uint64_t bytes;
    Device::SharedHandle handle;  // device windows: the Device's handle
    int64_t device;               // device windows: the owner's CUDA device; host: -1
    int64_t segment[5];           // host windows': their segment; device windows': their flags
    char error[128];
  };
  // All ranks' records (an all_gather). Throws Error naming the first rank
  // whose record carries another window's id, or an error, on every rank;
  // with `error_of`, an error is handed there instead ("rank R: why").
  std::vector<WindowRecord> exchange_window_records(const WindowRecord& mine,
                                                    const Interrupt* interrupt,
                                                    std::string* error_of = nullptr);
  // Makes window `id` with `create`, which fills in our record, and maps
  // every peer's with `map`; then every rank knows that all could, or all
  // raise naming the rank that could not. With `unmapped`, a rank that could
  // not map a peer's is no error: every rank learns why there instead.
  void share_window(uint64_t id, const std::function<void(WindowRecord&)>& create,
                    const std::function<void(int, const WindowRecord&)>& map,
                    const Interrupt* interrupt, std::string* unmapped = nullptr);

  struct Item {
    CollectiveArgs args;
    std::shared_ptr<Work> work;
    std::shared_ptr<StreamMark> mark;  // the caller's stream at submit, for device buffers
    uint64_t seq = 0;
    uint64_t issuer = 0;  // set_issuer's tag at submit
    // run() waits for it: its waits may spin, the caller's thread has nothing
    // else to do. A submitted call overlaps the caller's work: polite waits.
    bool eager = false;
  };

  // The Device serving CUDA device `id`, made on first use.
  Device& device(int id) { return *device_ptr(id); }
  std::shared_ptr<Device> device_ptr(int id);
  void refuse_if_unusable() const;  // mu_ held
  std::string describe(const CollectiveArgs& args, uint64_t seq) const;
  void worker();
  // Runs a queued item (taken off the queue, busy_ set by the caller) and
  // finishes its Work; `interrupt` is asked while it runs.
  void run_item(Item& item, const std::string& broken, const Interrupt* interrupt);
  std::shared_ptr<Work> enqueue(const CollectiveArgs& args, bool eager);
  // Runs one collective (the caller has made it the only one running). `eager`:
  // someone is blocked on it, so the transport's waits may spin (set_eager).
  void execute(const CollectiveArgs& args, const StreamMark* mark, uint64_t seq, uint64_t issuer,
               const Interrupt* interrupt, bool eager);
  std::exception_ptr on_failure(std::exception_ptr error, const std::string& description,
                                uint64_t seq);
  std::string refusal_key(int rank, uint64_t seq) const;
  // On close: publishes this rank's refusal of the call the others are in as
  // the communicator's first failure, when it leaves without another call;
  // true when it did (the others are in that call: close() aborts the links).
  bool publish_refusal_on_leaving();
  // `error`, led by the reason its culprit refused call `seq`, if it did.
  std::exception_ptr with_refusal(std::exception_ptr error, uint64_t seq);

  int rank_;
  int size_;
  const char* transport_name_;
  Options options_;
  Placement placement_;
  size_t small_bytes_;      // all_reduce up to this size skips the ring, at this world size
  bool reaches_all_;        // the transport reaches every peer, not only ring neighbours
  AlgorithmPolicy policy_;  // Options::algorithm
  Hierarchy hierarchy_;     // this rank's groups among hosts (usable() when they are)
  CountingTransport* counting_ = nullptr;  // transport_, when ranks span hosts
  std::string prefix_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<PointToPoint> p2p_;
  std::vector<char> scratch_;  // host scratch of the running collective
  WindowRegistry windows_;     // allocate_window's, for the collectives to find

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool busy_ = false;  // a collective is running (on the worker or inline)
  bool closing_ = false;
  bool closed_ = false;
  std::string broken_;          // the first error's message, once broken
  uint64_t issued_ = 0;         // collectives issued so far: the next one's number minus one
  uint64_t issuer_ = 0;         // set_issuer's tag: goes with every call issued until changed
  uint64_t refused_seq_ = 0;    // the number of the last call this rank refused (0: none)
  std::string refused_reason_;  // and why
  CommStats stats_;
  std::mutex devices_mu_;  // apart from mu_: making a Device can take a while
  // Shared: a device window keeps its Device after close().
  std::map<int, std::shared_ptr<Device>> devices_;
  // interrupt()'s flag, asked by the worker's waits through worker_interrupt_.
  std::atomic<bool> interrupted_{false};
  std::atomic<bool> aborted_{false};  // interrupted_ by abort(), not by Ctrl-C
  FlagInterrupt worker_interrupt_{interrupted_};
  std::thread worker_;
};

}  // namespace rr
