// The engine with every rank a thread of one process, for ThreadSanitizer
// (which cannot watch an uninstrumented Python): N ranks meet at a TCP store
// on loopback, over TCP, shared memory, or both on emulated hosts, and run
// every collective, blocking and queued, checked against the expected sums;
// then one rank's call is refused while the others run into a failure.
// Last, communicator churn: each rank makes, uses once and closes many
// communicators in a row, over shared memory and over TCP, all meeting in one
// reused store (a directory, as a reused store_dir; and one store object, as
// a torch store that outlives process groups), which is where a stale segment
// used to be mapped and touched (SIGBUS).
//
//   bash bench/sanitize/run_tsan.sh      # builds with -fsanitize=thread, runs it
//   rr_ranks_in_threads [ranks] [port] [churn cycles, default 50]
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "engine/bootstrap.h"
#include "engine/communicator.h"
#include "rendezvous/store.h"

namespace {

std::atomic<int> failures{0};

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    ++failures;
  }
}

void rank_main(int rank, int size, int port, const std::string& transport, bool two_hosts) {
  rr::Options options;
  options.timeout_seconds = 60;
  options.transport = transport;
  options.token = "tsan-token";
  if (two_hosts) options.host_id = rank < size / 2 ? "host-a" : "host-b";
  auto comm = rr::create_tcp_communicator(rank, size, "127.0.0.1", port, "", options);
  for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{300000}}) {
    std::vector<float> x(count, static_cast<float>(rank + 1)), y(count);
    rr::CollectiveArgs a;
    a.kind = rr::CollectiveKind::kAllReduce;
    a.send = x.data();
    a.recv = y.data();
    a.count = count;
    a.dtype = rr::DataType::kFloat32;
    a.op = rr::ReduceOp::kSum;
    comm->run(a, nullptr);
    const float want = static_cast<float>(size * (size + 1) / 2);
    expect(y[0] == want && y[count - 1] == want, "all_reduce sum");
    // Queued on the worker thread, then waited for: the other path.
    std::vector<float> z(count);
    a.recv = z.data();
    auto w1 = comm->submit(a);
    rr::CollectiveArgs b = a;
    b.kind = rr::CollectiveKind::kBroadcast;
    b.send = x.data();
    b.recv = x.data();
    b.root = size - 1;
    auto w2 = comm->submit(b);
    while (!w1->wait(0.1)) {
    }
    while (!w2->wait(0.1)) {
    }
    expect(z[count / 2] == want, "queued all_reduce");
    expect(x[0] == static_cast<float>(size), "queued broadcast");
    rr::CollectiveArgs g = a;
    g.kind = rr::CollectiveKind::kAllGather;
    std::vector<float> all(count * static_cast<size_t>(size));
    std::vector<float> mine(count, static_cast<float>(rank));
    g.send = mine.data();
    g.recv = all.data();
    comm->run(g, nullptr);
    for (int r = 0; r < size; ++r) {
      expect(all[static_cast<size_t>(r) * count] == static_cast<float>(r), "all_gather");
    }
  }
  rr::CollectiveArgs barrier;
  comm->run(barrier, nullptr);
  // A refused call on the last rank, which then leaves: the others fail, naming it.
  std::vector<float> x(10, 1.0f), y(10);
  rr::CollectiveArgs a;
  a.kind = rr::CollectiveKind::kAllReduce;
  a.send = x.data();
  a.recv = y.data();
  a.count = 10;
  a.dtype = rr::DataType::kFloat32;
  if (rank == size - 1) {
    comm->note_refused_call("all_reduce", "ValueError: a test's refusal");
    comm->close();
    return;
  }
  try {
    comm->run(a, nullptr);
    expect(false, "a call with a rank gone completed");
  } catch (const rr::PeerError& e) {
    expect(e.peer() == size - 1, std::string("culprit: ") + e.what());
  }
  comm->close();
}

// Each communicator's handle on one store that outlives them all, as every
// process group made on a torch.distributed store shares it.
class SharedStore : public rr::Store {
 public:
  explicit SharedStore(std::shared_ptr<rr::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override { store_->set(key, value); }
  std::optional<std::string> try_get(const std::string& key) override {
    return store_->try_get(key);
  }
  std::string set_if_absent(const std::string& key, const std::string& value) override {
    return store_->set_if_absent(key, value);
  }

 private:
  std::shared_ptr<rr::Store> store_;
};

// `cycles` communicators in a row, each meeting in `store_dir` (or in `shared`
// when it is set), running one all_reduce of a new size, checked in full, and
// closed.
void churn_main(int rank, int size, const std::string& transport, const std::string& store_dir,
                const std::shared_ptr<rr::Store>& shared, int cycles) {
  rr::Options options;
  options.timeout_seconds = 60;
  options.transport = transport;
  options.token = "tsan-token";
  const float want = static_cast<float>(size * (size + 1) / 2);
  for (int i = 0; i < cycles; ++i) {
    std::unique_ptr<rr::Communicator> comm =
        shared ? rr::create_store_communicator(std::make_unique<SharedStore>(shared), rank, size,
                                               "127.0.0.1", "a shared store object", options)
               : rr::create_tcp_communicator(rank, size, "", 0, store_dir, options);
    const size_t count = 1000 + static_cast<size_t>(i);
    std::vector<float> x(count, static_cast<float>(rank + 1)), y(count, -1.0f);
    rr::CollectiveArgs a;
    a.kind = rr::CollectiveKind::kAllReduce;
    a.send = x.data();
    a.recv = y.data();
    a.count = count;
    a.dtype = rr::DataType::kFloat32;
    a.op = rr::ReduceOp::kSum;
    comm->run(a, nullptr);
    size_t bad = 0;
    for (float v : y) bad += v != want;
    expect(bad == 0, transport + " churn cycle " + std::to_string(i) + ": " + std::to_string(bad) +
                         " wrong elements");
    comm->close();
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int size = argc > 1 ? std::atoi(argv[1]) : 4;
  int port = argc > 2 ? std::atoi(argv[2]) : 29731;
  const int cycles = argc > 3 ? std::atoi(argv[3]) : 50;
  for (const auto& [transport, two_hosts] :
       std::vector<std::pair<std::string, bool>>{{"tcp", false}, {"shm", false}, {"auto", true}}) {
    std::vector<std::thread> ranks;
    for (int r = 0; r < size; ++r) {
      ranks.emplace_back([=] {
        try {
          rank_main(r, size, port, transport, two_hosts);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank %d (%s): %s\n", r, transport.c_str(), e.what());
          ++failures;
        }
      });
    }
    for (auto& t : ranks) t.join();
    std::printf("%s%s: %d ranks done\n", transport.c_str(), two_hosts ? " (2 hosts)" : "", size);
    ++port;
  }
  for (const std::string transport : {"shm", "tcp"}) {
    for (const bool one_object : {false, true}) {
      char dir[] = "/tmp/rr-tsan-churn-XXXXXX";
      if (!one_object && ::mkdtemp(dir) == nullptr) {
        std::perror("mkdtemp");
        return 1;
      }
      const auto shared = one_object ? std::shared_ptr<rr::Store>(rr::make_local_store()) : nullptr;
      const auto start = std::chrono::steady_clock::now();
      std::vector<std::thread> ranks;
      for (int r = 0; r < size; ++r) {
        ranks.emplace_back([&, r] {
          try {
            churn_main(r, size, transport, dir, shared, cycles);
          } catch (const std::exception& e) {
            std::fprintf(stderr, "rank %d (%s churn): %s\n", r, transport.c_str(), e.what());
            ++failures;
          }
        });
      }
      for (auto& t : ranks) t.join();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf(
          "%s churn, one %s: %d communicators made, used and closed per rank, %d ranks, "
          "%.1f s\n",
          transport.c_str(), one_object ? "store object" : "store directory", cycles, size,
          seconds);
      if (!one_object) std::filesystem::remove_all(dir);
    }
  }
  std::printf("%s\n", failures == 0 ? "OK" : "FAILED");
  return failures == 0 ? 0 : 1;
}
