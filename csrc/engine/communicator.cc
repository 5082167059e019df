#include "engine/communicator.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "algorithms/one_hop.h"
#include "common/error.h"
#include "engine/choice.h"
#include "engine/dispatch.h"
#include "engine/failure_report.h"
#include "executor/devices.h"

namespace rr {
Communicator::Communicator(std::unique_ptr<Store> store, std::unique_ptr<Transport> transport,
                           const Options& options, Placement placement, std::string store_prefix,
                           std::unique_ptr<Transport> p2p)
    : rank_(transport->rank()),
      size_(transport->size()),
      transport_name_(transport->name()),
      options_(options),
      placement_(placement),
      small_bytes_(small_message_bytes(options.small_bytes, size_)),
      prefix_(std::move(store_prefix)),
      store_(std::move(store)),
      transport_(std::move(transport)) {
  // A segment is one message: at least a byte, and at most the 1 GiB that
  // every transport can carry (MPI counts are ints).
  options_.segment_bytes = std::clamp<size_t>(options_.segment_bytes, 1, size_t{1} << 30);
  const TransportStats set_up = transport_->stats();
  stats_.tcp_links_reused = set_up.tcp_links_reused;
  stats_.tcp_links_connected = set_up.tcp_links_connected;
  stats_.shm_peers_reused = set_up.shm_peers_reused;
  reaches_all_ = true;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_ && !transport_->reaches(peer)) reaches_all_ = false;
  }
  policy_ = parse_algorithm_policy(options_.algorithm);
  if (placement_.local_size < size_) {
    // Ranks on several hosts: count what crosses between them, and learn
    // every rank's host (published at rendezvous) for the hierarchical
    // all_reduce, which needs several ranks on each.
    std::vector<bool> remote(static_cast<size_t>(size_), true);
    for (int r : placement_.local_ranks) remote[static_cast<size_t>(r)] = false;
    auto counting = std::make_unique<CountingTransport>(std::move(transport_), std::move(remote));
    counting_ = counting.get();
    transport_ = std::move(counting);
    if (placement_.local_size > 1) {
      const Deadline deadline = Deadline::after(options_.timeout_seconds);
      std::vector<std::string> host_of(static_cast<size_t>(size_));
      for (int r = 0; r < size_; ++r) {
        host_of[static_cast<size_t>(r)] =
            store_->get(prefix_ + "host/" + std::to_string(r), deadline);
      }
      hierarchy_ = make_hierarchy(host_of, rank_);
      if (hierarchy_.usable()) {
        // Open the cross-host ring's links now (TCP connects others than the
        // ring neighbours on first use): a rank that dies before its first
        // hierarchical call is then a closed connection to its peers there,
        // a PeerError, not a silence that ends in TimeoutError.
        const int hosts = hierarchy_.hosts();
        const int right =
            hierarchy_.peers[static_cast<size_t>((hierarchy_.host_index + 1) % hosts)];
        const int left =
            hierarchy_.peers[static_cast<size_t>((hierarchy_.host_index + hosts - 1) % hosts)];
        char out = 0;
        char in = 0;
        RequestPtr sent = transport_->isend(right, &out, 1);
        RequestPtr received = transport_->irecv(left, &in, 1);
        transport_->wait(*received, deadline);
        transport_->wait(*sent, deadline);
        // Calls count their bytes from here.
        const TransportStats ts = transport_->stats();
        const TransportStats between = counting_->between_hosts();
        stats_.bytes_sent = ts.bytes_sent;
        stats_.bytes_received = ts.bytes_received;
        stats_.bytes_sent_between_hosts = between.bytes_sent;
        stats_.bytes_received_between_hosts = between.bytes_received;
      }
    }
  } else {
    // Every rank on this host: one host of all of them, which is what
    // RINGREDUCE_DEBUG=algorithm says when it explains the choice.
    hierarchy_.peers = {rank_};
    for (int r = 0; r < size_; ++r) hierarchy_.host_ranks.push_back(r);
    hierarchy_.local_index = rank_;
  }
  if (p2p) {
    p2p_ = std::make_unique<PointToPoint>(std::move(p2p), options_.timeout_seconds,
                                          options_.segment_bytes);
  }
  worker_ = std::thread([this] { worker(); });
}

PointToPoint& Communicator::point_to_point() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    refuse_if_unusable();
  }
  if (!p2p_) {
    throw Error("rank " + std::to_string(rank_) +
                ": this communicator has no point-to-point links (world of one, or made "
                "without them)");
  }
  return *p2p_;
}

std::shared_ptr<Work> Communicator::send(const void* data, size_t bytes, int dst, int64_t tag) {
  return point_to_point().send(data, bytes, dst, tag);
}

std::shared_ptr<Work> Communicator::recv(void* data, size_t bytes, int src, int64_t tag) {
  return point_to_point().recv(data, bytes, src, tag);
}

Communicator::~Communicator() { close(); }

void Communicator::interrupt() {
  interrupted_.store(true);
  if (p2p_) p2p_->interrupt();
}

void Communicator::abort() {
  const std::string why = "rank " + std::to_string(rank_) + ": abort() was called";
  std::deque<Item> queued;
  bool idle = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || aborted_.load()) return;
    aborted_.store(true);
    interrupted_.store(true);
    queued.swap(queue_);
    if (broken_.empty()) broken_ = why;
    idle = !busy_;
    cv_.notify_all();
  }
  for (auto& item : queued) {
    item.work->finish(std::make_exception_ptr(Error("rank " + std::to_string(rank_) + ": " +
                                                    item.work->description() +
                                                    " was not run: abort() was called")));
  }
  if (p2p_) p2p_->interrupt();
  // A running wait sleeps in its transport for a slice at most; cut it short.
  transport_->wake();
  // Nothing runs, and nothing will (broken_ refuses new calls): tear the
  // links down now so that the peers learn. A running collective does it
  // itself when it stops, after publishing why.
  if (idle) transport_->abort();
}

void Communicator::refuse_if_unusable() const {
  if (closing_ || closed_) {
    throw Error("rank " + std::to_string(rank_) + ": the communicator is closed");
  }
  if (!broken_.empty()) {
    throw Error("rank " + std::to_string(rank_) +
                ": the communicator failed earlier and runs no more collectives; create a new "
                "one with ringreduce.init() (or Communicator.shrink() on every survivor). The "
                "failure was: " +
                broken_);
  }
}

std::string Communicator::describe(const CollectiveArgs& args, uint64_t seq) const {
  return describe_call(args) + " (call #" + std::to_string(seq) + ")";
}

std::shared_ptr<Work> Communicator::submit(const CollectiveArgs& args) {
  return enqueue(args, false);
}

std::shared_ptr<Work> Communicator::enqueue(const CollectiveArgs& args, bool eager) {
  // The caller's stream is marked now, on the caller's thread: the collective
  // waits for the work queued on it before the call, and for nothing after.
  std::shared_ptr<StreamMark> mark;
  if (args.device >= 0) mark = device(args.device).mark(args.stream);
  std::lock_guard<std::mutex> lock(mu_);
  refuse_if_unusable();
  const uint64_t seq = ++issued_;
  auto work = std::make_shared<Work>(describe(args, seq));
  queue_.push_back({args, work, std::move(mark), seq, issuer_, eager});
  cv_.notify_all();
  return work;
}

void Communicator::run(const CollectiveArgs& args, const Interrupt* interrupt) {
  // Device collectives stay on the worker thread, which makes the device
  // current for itself; the caller's current device is the caller's.
  if (args.device < 0) {
    std::unique_lock<std::mutex> lock(mu_);
    refuse_if_unusable();
    if (queue_.empty() && !busy_) {
      busy_ = true;
      const uint64_t seq = ++issued_;
      const uint64_t issuer = issuer_;
      lock.unlock();
      std::exception_ptr error;
      // The caller's Ctrl-C, and abort() from another thread.
      const EitherInterrupt either(interrupt, worker_interrupt_);
      try {
        execute(args, nullptr, seq, issuer, &either, true);
      } catch (...) {
        error = on_failure(std::current_exception(), describe(args, seq), seq);
      }
      lock.lock();
      busy_ = false;
      // Wake the worker only when it has something to do (waking it for
      // nothing costs a context switch per call), or close() when it waits.
      if (!queue_.empty() || closing_) cv_.notify_all();
      if (error) std::rethrow_exception(error);
      return;
    }
  }
  // The caller blocks until it is done, so the worker may wait as eagerly as
  // the caller's own thread would (a device collective's staging pipeline
  // waits on the network once per segment).
  std::shared_ptr<Work> work = enqueue(args, true);
  // Behind other calls: wait for it, in slices, so that the caller can still
  // be interrupted.
  while (!work->wait(0.1)) {
    if (interrupt != nullptr) interrupt->check();
  }
}

std::shared_ptr<Device> Communicator::device_ptr(int id) {
  std::lock_guard<std::mutex> lock(devices_mu_);
  std::shared_ptr<Device>& slot = devices_[id];
  if (!slot) slot = options_.fake_device ? make_fake_device(id) : make_device(id);
  return slot;
}

void Communicator::set_issuer(uint64_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  issuer_ = tag;
}

void Communicator::execute(const CollectiveArgs& args, const StreamMark* mark, uint64_t seq,
                           uint64_t issuer, const Interrupt* interrupt, bool eager) {
  RingContext ctx{*transport_, options_.timeout_seconds, options_.segment_bytes, seq, scratch_,
                  small_bytes_};
  ctx.interrupt = interrupt;
  ctx.reaches_all = reaches_all_;
  ctx.hierarchy = &hierarchy_;
  ctx.policy = policy_;
  ctx.issuer = issuer;
  ctx.stream_store_bytes = options_.stream_store_bytes;
  ctx.windows = &windows_;
  // A compressed call whose codec fell back after a canary runs exact. Every
  // rank judged the same numbers at the same call, so all run it alike.
  CollectiveArgs fallen;
  const CollectiveArgs* call = &args;
  if (compressed_kind(args.kind)) {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = stats_.codecs.find(args.compression.name);
    if (found != stats_.codecs.end() && found->second.fell_back) {
      fallen = args;
      fallen.compression.exact = true;
      call = &fallen;
    }
  }
  // How the call runs, decided once: the dispatch, the log line and the stats read it.
  const Choice choice = choose(ctx, *call);
  if (options_.log_algorithm) {
    const std::string line = "ringreduce rank " + std::to_string(rank_) + ": " +
                             describe(*call, seq) + ": " + explain(choice, ctx, *call) + "\n";
    std::fputs(line.c_str(), stderr);
  }
  // When the caller waits for it latency counts; a queued collective overlaps
  // the caller's computation, which spinning would slow down.
  transport_->set_eager(eager);
  if (call->device >= 0) {
    ctx.device = &device(call->device);
    ctx.device_mark = mark;
    ctx.device_staging_bytes = options_.device_staging_bytes;
    ctx.device_land_in_place = options_.device_land_in_place;
  }
  // Only a compressed call counts its own wire bytes; the reading stays off
  // every other call's path.
  const bool compressed = compressed_kind(args.kind);
  const uint64_t sent_before = compressed ? transport_->stats().bytes_sent : 0;
  dispatch(ctx, *call, choice);
  const TransportStats ts = transport_->stats();
  std::lock_guard<std::mutex> lock(mu_);
  if (compressed) {
    CodecCounters& codec = stats_.codecs[args.compression.name];
    ++codec.calls;
    codec.wire_bytes += ts.bytes_sent - sent_before;
    codec.seconds += ctx.compressed.codec_seconds;
    codec.pieces += one_hop_pieces(*call, size_);
    if (call->compression.exact) ++codec.fallbacks;
    const CompressedReport& report = ctx.compressed;
    if (report.canary_ran) {
      ++codec.canary_checks;
      codec.compression_error = report.canary_error;
      codec.bias = report.canary_bias;
      codec.worst_error = codec.canary_checks == 1
                              ? report.canary_error
                              : std::max(codec.worst_error, report.canary_error);
      if (report.canary_error > args.compression.max_error) codec.fell_back = true;
    }
  }
  stats_.bytes_sent = ts.bytes_sent;
  stats_.bytes_received = ts.bytes_received;
  if (counting_ != nullptr) {
    const TransportStats between = counting_->between_hosts();
    stats_.bytes_sent_between_hosts = between.bytes_sent;
    stats_.bytes_received_between_hosts = between.bytes_received;
  }
  ++stats_.ops;
  stats_.staged_in_place_bytes += ctx.staged_in_place_bytes;
  if (args.kind == CollectiveKind::kAllReduce) {
    ++stats_.all_reduce_by_algorithm[static_cast<int>(choice.algorithm)];
  }
}

void Communicator::run_item(Item& item, const std::string& broken, const Interrupt* interrupt) {
  if (!broken.empty()) {
    item.work->finish(std::make_exception_ptr(
        Error("rank " + std::to_string(rank_) + ": " + item.work->description() +
              " was not run because an earlier collective failed: " + broken)));
    return;
  }
  try {
    execute(item.args, item.mark.get(), item.seq, item.issuer, interrupt, item.eager);
    item.work->finish();
  } catch (...) {
    item.work->finish(on_failure(std::current_exception(), item.work->description(), item.seq));
  }
}

void Communicator::worker() {
  while (true) {
    Item item;
    std::string broken;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return (closing_ && !busy_) || (!queue_.empty() && !busy_); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      broken = broken_;
    }
    run_item(item, broken, &worker_interrupt_);
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    cv_.notify_all();
  }
}

bool Communicator::wait(const std::shared_ptr<Work>& work, double seconds,
                        const Interrupt* interrupt) {
  // The caller's Ctrl-C, and abort() from another thread, as in run().
  const EitherInterrupt either(interrupt, worker_interrupt_);
  while (!work->done()) {
    Item item;
    std::string broken;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (busy_ || queue_.empty() || closing_) break;
      // Only while `work` is still queued, and host calls only: device
      // collectives stay on the worker, which makes the device current for
      // itself.
      auto mine = std::find_if(queue_.begin(), queue_.end(),
                               [&work](const Item& queued) { return queued.work == work; });
      if (mine == queue_.end() || queue_.front().args.device >= 0) break;
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      broken = broken_;
    }
    item.eager = true;  // someone is blocked on it now
    run_item(item, broken, &either);
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    if (!queue_.empty() || closing_) cv_.notify_all();
  }
  return work->wait(seconds);
}

std::exception_ptr Communicator::on_failure(std::exception_ptr error,
                                            const std::string& description, uint64_t seq) {
  // From here on a store host stopped on this machine is not waited for: it
  // is the likely culprit, and the report must name someone.
  HostStopCheck check(*store_);
  {
    // This rank refused this call's number earlier (bad arguments) and then
    // made another call, which met the others' call: the refusal is the
    // cause, and this rank is the one to blame, on every rank.
    std::lock_guard<std::mutex> lock(mu_);
    if (refused_seq_ == seq) {
      std::string cause;
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        cause = e.what();
      }
      error = std::make_exception_ptr(PeerError(
          refused_reason_ + "; rank " + std::to_string(rank_) + " then made another call, " +
              description + ", which met the others' call #" + std::to_string(seq) + ": " + cause,
          rank_));
    }
  }
  // If the rank to blame refused this very call (bad arguments there, see
  // note_refused_call), its reason is the news: it leads the message, in
  // what we publish and in what we raise.
  error = with_refusal(error, seq);
  FailureOutcome outcome = report_failure(*store_, prefix_, *transport_, rank_,
                                          options_.timeout_seconds, error, description);
  std::exception_ptr led = with_refusal(outcome.error, seq);
  if (led != outcome.error) {
    outcome.error = led;
    try {
      std::rethrow_exception(led);
    } catch (const std::exception& e) {
      outcome.message = e.what();
    }
  }
  if (aborted_.load()) {
    // abort() stopped it: the caller asked for this, it is not a Ctrl-C.
    outcome.message = "rank " + std::to_string(rank_) + ": abort() was called";
    outcome.error =
        std::make_exception_ptr(Error("rank " + std::to_string(rank_) + ": " + description +
                                      " was aborted: " + "abort() was called"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  broken_ = outcome.message;
  return outcome.error;
}

std::string Communicator::refusal_key(int rank, uint64_t seq) const {
  return prefix_ + "refused/" + std::to_string(rank) + "/" + std::to_string(seq);
}

void Communicator::note_refused_call(const std::string& call, const std::string& reason) {
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (size_ == 1 || closing_ || closed_ || !broken_.empty()) return;
    seq = issued_ + 1;  // the number the call would have had: the peers' current one
  }
  const std::string text = "rank " + std::to_string(rank_) + " refused its call #" +
                           std::to_string(seq) + ", " + call + ": " + reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    refused_seq_ = seq;
    refused_reason_ = text;
  }
  try {
    // set_if_absent: every client is sent a notice of it, which outlives the store.
    store_->set_if_absent(refusal_key(rank_, seq), text.substr(0, 4096));
  } catch (const std::exception&) {
    // No store to tell: the peers fail as they would have, without the reason.
  }
}

Transport* Communicator::revoked_transport() {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_.empty() || busy_ || closing_ || closed_) return nullptr;
  return transport_.get();
}

void Communicator::release_links() {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_.empty() || busy_ || closing_ || closed_) return;
  transport_->close();
}

std::string Communicator::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

void Communicator::publish(const std::string& key, const std::string& value) {
  store_->set(prefix_ + "user/" + key, value);
}

std::string Communicator::fetch(const std::string& key, double seconds) {
  return store_->get(prefix_ + "user/" + key, Deadline::after(seconds));
}

std::vector<std::optional<std::string>> Communicator::try_fetch_many(
    const std::vector<std::string>& keys) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& key : keys) full.push_back(prefix_ + "user/" + key);
  return store_->try_get_many(full);
}

std::exception_ptr Communicator::with_refusal(std::exception_ptr error, uint64_t seq) {
  int peer = -1;
  std::string kind, what, reason;
  MismatchFacts facts;
  try {
    std::rethrow_exception(error);
  } catch (const MismatchError& e) {
    peer = e.peer();
    kind = "mismatch";
    what = e.what();
    facts = e.facts();
  } catch (const TimeoutError& e) {
    peer = e.peer();
    kind = "timeout";
    what = e.what();
  } catch (const PeerError& e) {
    peer = e.peer();
    kind = "peer";
    what = e.what();
    reason = e.reason();
  } catch (...) {
  }
  if (peer < 0 || peer == rank_) return error;
  std::optional<std::string> refusal;
  try {
    refusal = store_->try_get(refusal_key(peer, seq));
  } catch (const std::exception&) {
  }
  if (!refusal || what.find(*refusal) != std::string::npos) return error;
  const std::string message =
      *refusal + "; so here, on rank " + std::to_string(rank_) + ": " + what;
  if (kind == "mismatch") return std::make_exception_ptr(MismatchError(message, peer, facts));
  if (kind == "timeout") return std::make_exception_ptr(TimeoutError(message, peer));
  return std::make_exception_ptr(PeerError(message, peer, reason));
}

bool Communicator::publish_refusal_on_leaving() {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The last thing this rank did was refuse the call the others are in (a
    // call it retried since has its number, and then the refusal is old news).
    if (broken_.empty() && refused_seq_ != 0 && refused_seq_ == issued_ + 1) {
      reason = refused_reason_;
    }
  }
  if (reason.empty()) return false;
  // It is why the others' call fails, whichever of their calls finds our links
  // closed first (the root of a broadcast may have finished its part and be in
  // its next call, whose number is not the refused one): published as the
  // first failure before the links close, so every report reads it.
  const FailureRecord record{
      "peer", rank_, rank_, reason + "; then rank " + std::to_string(rank_) + " left (close)", {}};
  try {
    store_->set_if_absent(prefix_ + "first_error", record.encode());
  } catch (const std::exception&) {
    // No store to tell: the peers fail as they would have, without the reason.
  }
  return true;
}

void Communicator::close() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) return;
    if (closing_ && std::this_thread::get_id() != worker_.get_id()) {
      // Another thread is closing: return once it has.
      cv_.wait(lock, [this] { return closed_; });
      return;
    }
    closing_ = true;
    cv_.notify_all();
    // A call running on another thread finishes first.
    cv_.wait(lock, [this] { return !busy_ || std::this_thread::get_id() == worker_.get_id(); });
  }
  if (worker_.joinable()) worker_.join();
  if (p2p_) p2p_->close();
  // After a failure the transport was aborted already. Leaving with a refused
  // call the others are in is a failure too: the links are aborted, which
  // tells every peer at once, where a normal end's goodbye would leave the
  // ones not waiting on us to wait out their deadline. Otherwise this is the
  // normal end.
  if (publish_refusal_on_leaving()) transport_->abort();
  transport_->close();
  {
    // Pinned and device staging memory go back now, not when Python collects us.
    std::lock_guard<std::mutex> lock(devices_mu_);
    devices_.clear();
  }
  // Device windows dropped here and closed by every peer since: freed now.
  DeviceWindow::sweep_retired();
  store_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

CommStats Communicator::stats() const {
  CommStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = stats_;
  }
  if (p2p_) {
    const TransportStats p = p2p_->stats();
    s.bytes_sent += p.bytes_sent;
    s.bytes_received += p.bytes_received;
  }
  return s;
}

namespace {

// A shared-memory segment's record as the words a WindowRecord carries.
void pack(const shm::SegmentRecord& rec, int64_t out[5]) {
  out[0] = rec.pid;
  out[1] = rec.fd;
  out[2] = static_cast<int64_t>(rec.inode);
  out[3] = static_cast<int64_t>(rec.bytes);
  out[4] = static_cast<int64_t>(rec.nonce);
}

shm::SegmentRecord unpack(const int64_t in[5]) {
  shm::SegmentRecord rec;
  rec.pid = static_cast<pid_t>(in[0]);
  rec.fd = static_cast<int>(in[1]);
  rec.inode = static_cast<uint64_t>(in[2]);
  rec.bytes = static_cast<uint64_t>(in[3]);
  rec.nonce = static_cast<uint64_t>(in[4]);
  return rec;
}

}  // namespace

std::vector<Communicator::WindowRecord> Communicator::exchange_window_records(
    const WindowRecord& mine, const Interrupt* interrupt, std::string* error_of) {
  static_assert(sizeof(WindowRecord) == 256, "exchanged as bytes");
  std::vector<WindowRecord> all(static_cast<size_t>(size_));
  CollectiveArgs a;
  a.kind = CollectiveKind::kAllGather;
  a.send = &mine;
  a.recv = all.data();
  a.count = sizeof(WindowRecord);
  a.dtype = DataType::kUInt8;
  run(a, interrupt);
  for (int r = 0; r < size_; ++r) {
    const WindowRecord& got = all[static_cast<size_t>(r)];
    const std::string error(got.error, strnlen(got.error, sizeof got.error));
    if (!error.empty() && error_of != nullptr) {
      if (error_of->empty()) *error_of = "rank " + std::to_string(r) + ": " + error;
    } else if (!error.empty()) {
      throw Error("comm.empty: rank " + std::to_string(r) + " could not make or map window " +
                  std::to_string(mine.id) + ": " + error);
    }
    if (got.id != mine.id) {
      throw Error("comm.empty: rank " + std::to_string(r) + " made window " +
                  std::to_string(got.id) + " where rank " + std::to_string(rank_) +
                  " made window " + std::to_string(mine.id) +
                  " (every rank must call it the same number of times)");
    }
    if ((got.device >= 0) != (mine.device >= 0)) {
      auto what = [](const WindowRecord& w) {
        return w.device >= 0 ? "device memory (cuda:" + std::to_string(w.device) + ")"
                             : std::string("host memory");
      };
      throw Error("comm.empty: rank " + std::to_string(r) + " made window " +
                  std::to_string(mine.id) + " in " + what(got) + " where rank " +
                  std::to_string(rank_) + " made it in " + what(mine) +
                  " (every rank must ask for the same kind of memory at the same call)");
    }
  }
  return all;
}

void Communicator::share_window(uint64_t id, const std::function<void(WindowRecord&)>& create,
                                const std::function<void(int, const WindowRecord&)>& map,
                                const Interrupt* interrupt, std::string* unmapped) {
  WindowRecord mine{};
  mine.id = id;
  mine.device = -1;  // host memory, unless create says which device
  auto failed = [&](const std::exception& e) {
    WindowRecord r{};
    r.id = id;
    r.device = mine.device;
    std::snprintf(r.error, sizeof r.error, "%s", e.what());
    return r;
  };
  try {
    create(mine);
  } catch (const std::exception& e) {
    mine = failed(e);
  }
  const std::vector<WindowRecord> all = exchange_window_records(mine, interrupt);
  WindowRecord attached{};
  attached.id = id;
  attached.device = mine.device;
  try {
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) map(r, all[static_cast<size_t>(r)]);
    }
  } catch (const std::exception& e) {
    attached = failed(e);
  }
  // Every rank mapped every other's, or all say who could not.
  exchange_window_records(attached, interrupt, unmapped);
}

std::shared_ptr<SharedWindow> Communicator::allocate_window(size_t bytes,
                                                            const Interrupt* interrupt) {
  if (bytes == 0) throw InvalidArgument("a window needs at least one byte");
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    refuse_if_unusable();
    // Every rank sees the same: whether all ranks share one host (the bulletin).
    if (size_ == 1 || transport_->bulletin() == nullptr) return nullptr;
    id = windows_.next_id();
  }
  std::shared_ptr<SharedWindow> window;
  share_window(
      id,
      [&](WindowRecord& mine) {
        window = SharedWindow::create(id, bytes, rank_, size_);
        pack(window->record(), mine.segment);
        mine.bytes = bytes;
      },
      [&](int r, const WindowRecord& got) { window->attach(r, unpack(got.segment)); }, interrupt);
  window->attached_by_all();
  windows_.add(window);
  return window;
}

std::shared_ptr<DeviceWindow> Communicator::allocate_device_window(size_t bytes, int device,
                                                                   const Interrupt* interrupt) {
  if (bytes == 0) throw InvalidArgument("a window needs at least one byte");
  if (device < 0)
    throw InvalidArgument("a device window needs a CUDA device, got " + std::to_string(device));
  uint64_t id = 0;
  bool shared;
  {
    std::lock_guard<std::mutex> lock(mu_);
    refuse_if_unusable();
    shared = size_ > 1 && transport_->bulletin() != nullptr;
    if (shared) id = windows_.next_id();
  }
  Device::SharedHandle handle{};
  if (!shared) {
    // Nobody to share with: this rank's memory only, never a collective's window.
    return std::make_shared<DeviceWindow>(0, device_ptr(device), device, bytes, rank_, size_,
                                          &handle, nullptr);
  }
  std::shared_ptr<DeviceWindow> window;
  std::shared_ptr<SharedWindow> control;  // the flags by which peers say they closed it
  std::string unmapped;
  bool exchanged = false;  // the peers have our handle, and may map our memory
  try {
    share_window(
        id,
        [&](WindowRecord& mine) {
          mine.device = device;  // first: a failure below still says which memory
          control = SharedWindow::create(id, DeviceWindow::control_bytes(size_), rank_, size_);
          pack(control->record(), mine.segment);
          window = std::make_shared<DeviceWindow>(id, device_ptr(device), device, bytes, rank_,
                                                  size_, &mine.handle, control);
          mine.bytes = bytes;
        },
        [&](int r, const WindowRecord& got) {
          exchanged = true;
          control->attach(r, unpack(got.segment));
          window->map(r, got.handle, got.bytes, static_cast<int>(got.device));
        },
        interrupt, &unmapped);
  } catch (...) {
    // Failed before any rank had our handle: nobody maps our memory.
    if (window && !exchanged) window->mapped_by_nobody();
    throw;
  }
  control->attached_by_all();
  if (!unmapped.empty()) {
    // Some rank's GPU cannot read another's memory (no peer access): on every
    // rank the window is the rank's own memory, which all_reduce stages
    // through the host, as it does where the ranks span hosts.
    window->unshare("device window " + std::to_string(id) + " is not shared: " + unmapped);
    return window;
  }
  windows_.add(window);
  return window;
}

}  // namespace rr
