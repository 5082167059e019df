// The engine with every rank a thread of one process, for ThreadSanitizer
// (which cannot watch an uninstrumented Python): N ranks meet at a TCP store
// on loopback, over TCP, shared memory, or both on emulated hosts, and run
// every collective, blocking and queued, checked against the expected sums;
// then one rank's call is refused while the others run into a failure.
//
//   bash bench/sanitize/run_tsan.sh      # builds with -fsanitize=thread, runs it
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "engine/bootstrap.h"
#include "engine/communicator.h"

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

}  // namespace

int main(int argc, char** argv) {
  const int size = argc > 1 ? std::atoi(argv[1]) : 4;
  int port = argc > 2 ? std::atoi(argv[2]) : 29731;
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
  std::printf("%s\n", failures == 0 ? "OK" : "FAILED");
  return failures == 0 ? 0 : 1;
}
