#include "transport/mpi/mpi_channel.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "common/error.h"
#include "transport/tcp/tcp_transport.h"

namespace rr {
namespace {

// Control messages stay far below every MPI's eager limit, so they complete
// without the sender calling MPI again (it may have stopped doing so).
constexpr size_t kMaxControlBytes = 2048;
// The liveness mesh holds one socket per peer: worth it up to this many ranks.
constexpr int kMaxLivenessRanks = 512;
constexpr size_t kLivenessAddressBytes = 64;
constexpr double kLivenessSetupSeconds = 10.0;

// Every ringreduce MPI call of the process, when MPI is not fully thread-safe.
std::recursive_mutex& global_mpi_mutex() {
  static std::recursive_mutex mu;
  return mu;
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

}  // namespace

void MpiChannel::check(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  throw Error(std::string(what) + " failed: " + std::string(text, static_cast<size_t>(len)));
}

bool MpiChannel::test_until(MPI_Request& request, const Deadline& deadline) {
  int sleep_us = 10;
  while (true) {
    int done = 0;
    {
      auto lock = guard();
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    }
    if (done) return true;
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(sleep_us * 2, 2000);
  }
}

std::shared_ptr<MpiChannel> MpiChannel::open(MPI_Comm comm, const Deadline& deadline,
                                             bool watch_liveness, const std::string& socket_addr) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    throw Error(std::string("MPI is ") + (finalized ? "already finalized" : "not initialized") +
                "; initialize it first (import mpi4py's MPI, or let ringreduce.init(\"mpi\") do "
                "it)");
  }
  int level = MPI_THREAD_SINGLE;
  check(MPI_Query_thread(&level), "MPI_Query_thread");
  // Collectives run on the communicator's worker thread, not the caller's.
  if (level < MPI_THREAD_SERIALIZED) {
    throw Error(std::string("MPI was initialized with ") + thread_level_name(level) +
                ", but ringreduce calls MPI from its own worker thread and needs at least "
                "MPI_THREAD_SERIALIZED (MPI_THREAD_MULTIPLE recommended). With mpi4py, set "
                "mpi4py.rc.thread_level = \"multiple\" before importing mpi4py.MPI.");
  }
  if (comm == MPI_COMM_NULL) throw InvalidArgument("the MPI communicator is MPI_COMM_NULL");

  std::shared_ptr<MpiChannel> channel(new MpiChannel());
  channel->serialize_ = level < MPI_THREAD_MULTIPLE;

  // Non-blocking collectives, so that a rank that never joins costs the
  // others a TimeoutError instead of a hang.
  const auto never_joined = [&](const char* step) {
    return TimeoutError(std::string("not every rank of the MPI communicator joined within ") +
                            format_seconds(deadline.seconds()) + " s (" + step +
                            "); creating a ringreduce communicator is collective",
                        -1);
  };
  MPI_Request request = MPI_REQUEST_NULL;
  {
    auto lock = channel->guard();
    check(MPI_Comm_idup(comm, &channel->comm_, &request), "MPI_Comm_idup");
  }
  if (!channel->test_until(request, deadline)) {
    // The new handle is not valid until the dup completes: never free it.
    channel->mark_failed();
    throw never_joined("MPI_Comm_idup");
  }
  {
    auto lock = channel->guard();
    check(MPI_Comm_set_errhandler(channel->comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(channel->comm_, &channel->rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(channel->comm_, &channel->size_), "MPI_Comm_size");
  }
  channel->timing_out_.assign(static_cast<size_t>(channel->size_), false);
  channel->aborted_.assign(static_cast<size_t>(channel->size_), false);

  uint64_t instance = 0;
  if (channel->rank_ == 0) {
    std::random_device entropy;
    instance = (static_cast<uint64_t>(entropy()) << 32) ^ entropy() ^
               static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  }
  {
    auto lock = channel->guard();
    check(MPI_Ibcast(&instance, 1, MPI_UINT64_T, 0, channel->comm_, &request), "MPI_Ibcast");
  }
  if (!channel->test_until(request, deadline)) {
    channel->mark_failed();
    throw never_joined("MPI_Ibcast");
  }
  channel->instance_ = instance;
  if (watch_liveness && channel->size_ > 1 && channel->size_ <= kMaxLivenessRanks) {
    channel->watch_liveness(deadline, socket_addr);
  }
  return channel;
}

void MpiChannel::watch_liveness(const Deadline& deadline, const std::string& socket_addr) {
  const std::string advertise = socket_addr.empty() ? local_ip_towards("192.0.2.1") : socket_addr;
  // Every rank gets the same outcome: each says whether it is connected, and
  // the mesh is kept only if all are.
  const Liveness::Allgather allgather = [&](const std::string& mine) {
    std::vector<char> out(kLivenessAddressBytes, '\0');
    std::memcpy(out.data(), mine.data(), std::min(mine.size(), out.size() - 1));
    std::vector<char> all(out.size() * static_cast<size_t>(size_));
    MPI_Request request = MPI_REQUEST_NULL;
    {
      auto lock = guard();
      check(MPI_Iallgather(out.data(), static_cast<int>(out.size()), MPI_CHAR, all.data(),
                           static_cast<int>(out.size()), MPI_CHAR, comm_, &request),
            "MPI_Iallgather");
    }
    if (!test_until(request, deadline)) {
      mark_failed();
      throw TimeoutError("not every rank joined the liveness exchange", -1);
    }
    std::vector<std::string> texts;
    for (int r = 0; r < size_; ++r) texts.emplace_back(all.data() + r * out.size());
    return texts;
  };
  std::unique_ptr<Liveness> live;
  try {
    const Deadline setup = Deadline::after(std::min(deadline.seconds(), kLivenessSetupSeconds));
    live = Liveness::connect(rank_, size_, instance_, advertise, allgather, setup);
  } catch (const TimeoutError&) {
    if (failed_) throw;
  } catch (const Error&) {
  }
  int ok = live ? 1 : 0, all_ok = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  {
    auto lock = guard();
    check(MPI_Iallreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm_, &request), "MPI_Iallreduce");
  }
  if (!test_until(request, deadline)) {
    mark_failed();
    throw TimeoutError("not every rank joined the liveness exchange", -1);
  }
  if (all_ok) {
    liveness_ = std::move(live);
  } else if (rank_ == 0) {
    std::fprintf(stderr,
                 "ringreduce: the MPI ranks could not reach each other's sockets at %s (set "
                 "RINGREDUCE_SOCKET_ADDR?); a rank that dies is found at the timeout\n",
                 advertise.c_str());
  }
}

MpiChannel::~MpiChannel() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || comm_ == MPI_COMM_NULL) return;
  auto lock = guard();
  try {
    reap_outgoing(true);
  } catch (const std::exception&) {
    failed_ = true;
  }
  if (!failed_) MPI_Comm_free(&comm_);
}

std::unique_lock<std::recursive_mutex> MpiChannel::guard() {
  if (!serialize_) return {};
  return std::unique_lock<std::recursive_mutex>(global_mpi_mutex());
}

void MpiChannel::send_control(char kind, const std::string& payload) {
  auto lock = guard();
  reap_outgoing(false);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    auto out = std::make_unique<Message>();
    out->bytes.resize(sizeof instance_ + 1);
    std::memcpy(out->bytes.data(), &instance_, sizeof instance_);
    out->bytes[sizeof instance_] = kind;
    out->bytes.insert(out->bytes.end(), payload.begin(), payload.end());
    if (out->bytes.size() > kMaxControlBytes) out->bytes.resize(kMaxControlBytes);
    check(MPI_Isend(out->bytes.data(), static_cast<int>(out->bytes.size()), MPI_BYTE, peer,
                    kControlTag, comm_, &out->request),
          "MPI_Isend (control)");
    outgoing_.push_back(std::move(out));
  }
}

void MpiChannel::publish(const std::string& key, const std::string& value) {
  std::string payload = key;
  payload.push_back('\0');
  payload += value;
  send_control('V', payload);
}

void MpiChannel::announce(Notice notice) { send_control(static_cast<char>(notice), ""); }

void MpiChannel::poll() {
  auto lock = guard();
  reap_outgoing(false);
  while (true) {
    int flag = 0;
    MPI_Message message;
    MPI_Status status;
    check(MPI_Improbe(MPI_ANY_SOURCE, kControlTag, comm_, &flag, &message, &status),
          "MPI_Improbe (control)");
    if (!flag) return;
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    auto buffer = std::make_unique<Message>();
    buffer->bytes.resize(static_cast<size_t>(count));
    check(MPI_Imrecv(buffer->bytes.data(), count, MPI_BYTE, &message, &buffer->request),
          "MPI_Imrecv (control)");
    if (!test_until(buffer->request, Deadline::after(5.0))) {
      // A matched receive cannot be cancelled: keep its buffer alive for good.
      (void)buffer.release();
      continue;
    }
    const std::vector<char>& bytes = buffer->bytes;
    uint64_t instance = 0;
    if (bytes.size() <= sizeof instance) continue;
    std::memcpy(&instance, bytes.data(), sizeof instance);
    if (instance != instance_) continue;  // left over from an earlier communicator
    const char kind = bytes[sizeof instance];
    const std::string payload(bytes.begin() + sizeof instance + 1, bytes.end());
    std::lock_guard<std::mutex> state(state_mu_);
    const auto source = static_cast<size_t>(status.MPI_SOURCE);
    if (kind == static_cast<char>(Notice::kAbort) && source < aborted_.size()) {
      aborted_[source] = true;
    } else if (kind == static_cast<char>(Notice::kTimingOut) && source < timing_out_.size()) {
      timing_out_[source] = true;
    } else if (kind == 'V') {
      const size_t split = payload.find('\0');
      if (split != std::string::npos) {
        values_.emplace(payload.substr(0, split), payload.substr(split + 1));
      }
    }
  }
}

std::optional<std::string> MpiChannel::value(const std::string& key) {
  std::lock_guard<std::mutex> state(state_mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

void MpiChannel::put(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> state(state_mu_);
  values_[key] = value;
}

std::string MpiChannel::put_if_absent(const std::string& key, const std::string& value,
                                      bool* inserted) {
  std::lock_guard<std::mutex> state(state_mu_);
  auto [it, fresh] = values_.emplace(key, value);
  *inserted = fresh;
  return it->second;
}

bool MpiChannel::announced(int peer, Notice notice) {
  std::lock_guard<std::mutex> state(state_mu_);
  if (peer < 0 || peer >= size_) return false;
  const auto& seen = notice == Notice::kAbort ? aborted_ : timing_out_;
  return seen[static_cast<size_t>(peer)];
}

void MpiChannel::reap_outgoing(bool final) {
  const Deadline deadline = Deadline::after(final ? 0.2 : 0.0);
  for (auto& out : outgoing_) {
    int done = 0;
    check(MPI_Test(&out->request, &done, MPI_STATUS_IGNORE), "MPI_Test (control)");
    if (done) {
      out.reset();
    } else if (final && !test_until(out->request, deadline)) {
      // A receiver that stopped calling MPI may never take it. Freeing the
      // request lets MPI finish or drop the send; the bytes must outlive it.
      MPI_Request_free(&out->request);
      (void)out.release();
    } else if (final) {
      out.reset();
    }
  }
  outgoing_.erase(std::remove(outgoing_.begin(), outgoing_.end(), nullptr), outgoing_.end());
}

}  // namespace rr
