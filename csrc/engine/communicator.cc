#include "engine/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <set>
#include <sstream>

#include "common/error.h"
#include "executor/devices.h"
#include "transport/tcp/tcp_transport.h"

namespace rr {
namespace {

// A failure as published in the store: "kind\npeer\nrank\nmessage".
struct Report {
  std::string kind;  // "mismatch" | "timeout" | "peer" | "error"
  int peer = -1;
  int rank = -1;
  std::string message;

  std::string encode() const {
    return kind + "\n" + std::to_string(peer) + "\n" + std::to_string(rank) + "\n" + message;
  }
  static Report decode(const std::string& text) {
    Report r;
    std::istringstream in(text);
    std::string peer, rank;
    std::getline(in, r.kind);
    std::getline(in, peer);
    std::getline(in, rank);
    std::getline(in, r.message, '\0');
    r.peer = std::atoi(peer.c_str());
    r.rank = std::atoi(rank.c_str());
    return r;
  }
};

Report classify(std::exception_ptr error, int rank) {
  Report r;
  r.rank = rank;
  try {
    std::rethrow_exception(error);
  } catch (const MismatchError& e) {
    r = {"mismatch", e.peer(), rank, e.what()};
  } catch (const TimeoutError& e) {
    r = {"timeout", e.peer(), rank, e.what()};
  } catch (const PeerError& e) {
    r = {"peer", e.peer(), rank, e.what()};
  } catch (const std::exception& e) {
    r = {"error", -1, rank, e.what()};
  }
  return r;
}

bool is_timeout(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError&) {
    return true;
  } catch (...) {
    return false;
  }
}

// When a rank stalls, the ranks waiting on it time out, and so, a moment
// later, do the ranks waiting on those: the rank we waited on may itself be
// waiting. Each timed-out rank records whom it waited on; after a short grace
// for the others' records to arrive, every rank follows the chain of waits to
// its end, the wait on a rank that is not itself waiting. All ranks then
// report that one record, so they all name the same culprit.
Report end_of_wait_chain(Store& store, const std::string& prefix, const Report& mine,
                         double timeout) {
  const std::string first_key = prefix + "first_error";
  auto timeout_key = [&prefix](int rank) { return prefix + "timeout/" + std::to_string(rank); };
  store.set(timeout_key(mine.rank), mine.encode());
  const Deadline grace = Deadline::after(std::min(1.0, timeout / 2));
  while (!grace.expired() && !store.try_get(first_key)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Report end = mine;
  std::set<int> seen{mine.rank};
  try {
    while (end.peer >= 0 && seen.insert(end.peer).second) {
      std::optional<std::string> next = store.try_get(timeout_key(end.peer));
      if (!next) break;
      end = Report::decode(*next);
    }
  } catch (const std::exception&) {
    // The store went away mid-walk: the chain so far is still our best answer.
  }
  return end;
}

// The small-message threshold for this many ranks. The small path sends N/2
// times the ring's bytes, so its threshold shrinks as 2/N: RINGREDUCE_SMALL_BYTES
// (default 64 KiB) at 2 ranks, half that at 4. 0 turns the path off.
size_t small_message_bytes(int size) {
  const char* env = std::getenv("RINGREDUCE_SMALL_BYTES");
  const size_t base = env ? static_cast<size_t>(std::strtoull(env, nullptr, 10)) : size_t{64} << 10;
  return size > 1 ? base * 2 / static_cast<size_t>(size) : 0;
}

std::exception_ptr make_error(const std::string& kind, const std::string& message, int peer) {
  if (kind == "mismatch") return std::make_exception_ptr(MismatchError(message, peer));
  if (kind == "timeout") return std::make_exception_ptr(TimeoutError(message, peer));
  if (kind == "peer") return std::make_exception_ptr(PeerError(message, peer));
  return std::make_exception_ptr(Error(message));
}

}  // namespace

Communicator::Communicator(std::unique_ptr<Store> store, std::unique_ptr<Transport> transport,
                           double timeout_seconds, size_t segment_bytes, std::string store_prefix)
    : rank_(transport->rank()),
      size_(transport->size()),
      transport_name_(transport->name()),
      timeout_(timeout_seconds),
      // A segment is one message: at least a byte, and at most the 1 GiB
      // that every transport can carry (MPI counts are ints).
      segment_bytes_(std::clamp<size_t>(segment_bytes, 1, size_t{1} << 30)),
      small_bytes_(small_message_bytes(size_)),
      prefix_(std::move(store_prefix)),
      store_(std::move(store)),
      transport_(std::move(transport)) {
  worker_ = std::thread([this] { run(); });
}

Communicator::~Communicator() { close(); }

std::shared_ptr<Work> Communicator::submit(const CollectiveArgs& args) {
  // The caller's stream is marked now, on the caller's thread: the collective
  // waits for the work queued on it before the call, and for nothing after.
  std::shared_ptr<StreamMark> mark;
  if (args.device >= 0) mark = device(args.device).mark(args.stream);
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_ || closed_) {
    throw Error("rank " + std::to_string(rank_) + ": the communicator is closed");
  }
  if (!broken_.empty()) {
    throw Error("rank " + std::to_string(rank_) +
                ": the communicator failed earlier and runs no more collectives; create a new "
                "one with ringreduce.init(). The failure was: " +
                broken_);
  }
  ++submitted_;
  auto work =
      std::make_shared<Work>(describe_call(args) + " (call #" + std::to_string(submitted_) + ")");
  queue_.push_back({args, work, std::move(mark)});
  cv_.notify_all();
  return work;
}

Device& Communicator::device(int id) {
  std::lock_guard<std::mutex> lock(devices_mu_);
  std::unique_ptr<Device>& slot = devices_[id];
  if (!slot) slot = make_device(id);
  return *slot;
}

void Communicator::run() {
  std::vector<char> scratch;
  uint64_t seq = 0;
  while (true) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    ++seq;
    std::string broken;
    {
      std::lock_guard<std::mutex> lock(mu_);
      broken = broken_;
    }
    if (!broken.empty()) {
      item.work->finish(std::make_exception_ptr(
          Error("rank " + std::to_string(rank_) + ": " + item.work->description() +
                " was not run because an earlier collective failed: " + broken)));
      continue;
    }
    try {
      RingContext ctx{*transport_, timeout_, segment_bytes_, seq, scratch, small_bytes_};
      if (item.args.device >= 0) {
        ctx.device = &device(item.args.device);
        ctx.device_mark = item.mark.get();
      }
      run_collective(ctx, item.args);
      TransportStats ts = transport_->stats();
      {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.bytes_sent = ts.bytes_sent;
        stats_.bytes_received = ts.bytes_received;
        ++stats_.ops;
        if (choose_algorithm(ctx, item.args) == Algorithm::kSmall) ++stats_.small_message_ops;
      }
      item.work->finish();
    } catch (...) {
      item.work->finish(on_failure(std::current_exception(), item));
    }
  }
}

std::exception_ptr Communicator::on_failure(std::exception_ptr error, const Item& item) {
  Report mine = classify(error, rank_);
  const std::string where = "rank " + std::to_string(rank_) + ": " + item.work->description();
  mine.message = where + " failed: " + mine.message;

  // Publish before tearing down the connections: a neighbour that sees our
  // sockets close then finds the reason already in the store.
  Report first = mine;
  try {
    if (is_timeout(error)) first = end_of_wait_chain(*store_, prefix_, mine, timeout_);
  } catch (const std::exception&) {
    // The store is gone before we could record our wait: go by what we saw.
  }
  try {
    first = Report::decode(store_->set_if_absent(prefix_ + "first_error", first.encode()));
  } catch (const std::exception&) {
    // The store is gone (its host died): report what we know ourselves.
  }
  transport_->abort();
  if (store_->hosted_here()) {
    // Our process may end as soon as the error reaches Python, taking the
    // store with it: stay a moment so that the other ranks can read why.
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(1.0, timeout_ / 2)));
  }

  std::string kind = mine.kind;
  std::string message = mine.message;
  int peer = mine.peer;
  if (first.rank != rank_) {
    // Someone failed before us; our own failure is most likely the echo of
    // theirs, so lead with the original cause and its culprit.
    kind = first.kind;
    peer = first.peer;
    message = where + " failed because rank " + std::to_string(first.rank) +
              " failed first: " + first.message + " [seen here: " + mine.message + "]";
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = message;
  }
  return make_error(kind, message, peer);
}

void Communicator::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closing_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  transport_->abort();
  {
    // Pinned and device staging memory go back now, not when Python collects us.
    std::lock_guard<std::mutex> lock(devices_mu_);
    devices_.clear();
  }
  store_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
}

CommStats Communicator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::unique_ptr<Communicator> create_tcp_communicator(int rank, int size,
                                                      const std::string& master_addr,
                                                      int master_port, double timeout_seconds,
                                                      size_t segment_bytes,
                                                      const std::string& store_dir) {
  if (size < 1) throw InvalidArgument("world_size must be >= 1, got " + std::to_string(size));
  if (rank < 0 || rank >= size) {
    throw InvalidArgument("rank must be in [0, " + std::to_string(size) + "), got " +
                          std::to_string(rank));
  }
  if (timeout_seconds <= 0) throw InvalidArgument("timeout must be > 0 seconds");
  const Deadline deadline = Deadline::after(timeout_seconds);
  std::unique_ptr<Store> store;
  std::string advertise;
  if (size == 1) {
    store = make_local_store();  // nobody to meet: no port, no files
  } else if (!store_dir.empty()) {
    store = make_file_store(store_dir);
    advertise = master_addr.empty() ? "127.0.0.1" : local_ip_towards(master_addr);
  } else {
    store = make_tcp_store(master_addr, master_port, rank == 0, deadline, timeout_seconds);
    advertise = local_ip_towards(master_addr);
  }
  if (const char* host = std::getenv("RINGREDUCE_SOCKET_ADDR")) advertise = host;
  const std::string prefix = "rr/";
  auto transport = TcpTransport::connect_ring(*store, prefix, rank, size, advertise, deadline);
  return std::make_unique<Communicator>(std::move(store), std::move(transport), timeout_seconds,
                                        segment_bytes, prefix);
}

}  // namespace rr
