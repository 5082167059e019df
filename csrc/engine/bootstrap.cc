#include "engine/bootstrap.h"


#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>

#include "common/error.h"
#include "common/host_id.h"
#include "engine/identity.h"
#include "security/auth.h"
#include "transport/routed.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace rr {

namespace {

// Rank r's host, the first wait on every other rank. Rank 0 publishes its own only
// once every rank is seated, so a rank that waits for it learns there, from rank 0,
// who never came (it keeps its store a moment after giving up): that rank is named,
// not rank 0.
std::string await_host(Store& store, const std::string& prefix, int r, int rank, int size,
                       const std::string& meeting, const Deadline& deadline) {
  const std::string key = prefix + "host/" + std::to_string(r);
  std::optional<Deadline> grace;  // a moment past the deadline, for rank 0's word
  PollBackoff backoff;
  while (true) {
    // Waits (or sleeps) a moment when the key is not there yet.
    if (auto host = store.look_for(key, store.peer_look(), backoff, grace ? *grace : deadline)) {
      return *host;
    }
    if (auto why = store.try_get(gave_up_key(prefix))) {
      const size_t cut = why->find('\n');
      const int missing = std::atoi(why->substr(0, cut).c_str());
      throw TimeoutError("rank " + std::to_string(rank) + " gave up with rank 0, which said: " +
                             (cut == std::string::npos ? *why : why->substr(cut + 1)),
                         missing);
    }
    if (deadline.expired()) {
      if (!grace) grace = Deadline::after(r == 0 ? 1.0 : 0.0);
      if (grace->expired()) throw did_not_join(r, rank, size, meeting, deadline);
    }
  }
}

}  // namespace

std::vector<int> ranks_on_this_host(Store& store, const std::string& prefix, int rank, int size,
                                    const std::string& host_id, const std::string& meeting,
                                    const Deadline& deadline) {
  const std::string mine = host_id.empty() ? host_identity() : host_id;
  store.set(prefix + "host/" + std::to_string(rank), mine);
  // Every other rank's host, those already there read together (one round trip,
  // not one a rank: the store's host would otherwise serve N reads for each of N
  // ranks); the first still missing waited for as await_host() does.
  std::vector<std::string> keys;
  std::vector<int> others;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    keys.push_back(prefix + "host/" + std::to_string(r));
    others.push_back(r);
  }
  const std::vector<std::string> hosts = store.get_all(keys, deadline, others, [&](size_t i) {
    return await_host(store, prefix, others[i], rank, size, meeting, deadline);
  });
  std::vector<int> local;
  for (size_t i = 0, r = 0; r < static_cast<size_t>(size); ++r) {
    if (static_cast<int>(r) == rank || hosts[i++] == mine) local.push_back(static_cast<int>(r));
  }
  return local;
}

std::unique_ptr<Transport> connect_links(Store& store, const std::string& prefix, int rank,
                                         int size, const Options& options,
                                         const NetworkFactory& network, Placement* placement,
                                         const std::string& meeting, const Deadline& deadline,
                                         const ShmReuse* reuse) {
  std::vector<int> local{rank};
  if (size > 1) {
    local = ranks_on_this_host(store, prefix, rank, size, options.host_id, meeting, deadline);
  }
  placement->local_size = static_cast<int>(local.size());
  placement->local_rank =
      static_cast<int>(std::find(local.begin(), local.end(), rank) - local.begin());
  placement->local_ranks = local;
  return connect_links_among(store, prefix, rank, size, options, network, local, deadline, reuse);
}

std::unique_ptr<Transport> connect_links_among(Store& store, const std::string& prefix, int rank,
                                               int size, const Options& options,
                                               const NetworkFactory& network,
                                               const std::vector<int>& local,
                                               const Deadline& deadline, const ShmReuse* reuse) {
  const std::string& kind = options.transport;
  if (kind != "auto" && kind != "shm") return network();
  const bool one_host = static_cast<int>(local.size()) == size;
  if (kind == "shm" && !one_host) {
    int elsewhere = 0;
    while (std::find(local.begin(), local.end(), elsewhere) != local.end()) ++elsewhere;
    throw InvalidArgument("transport='shm' needs every rank on one host, but rank " +
                          std::to_string(elsewhere) + " is on another host than rank " +
                          std::to_string(rank) + "; use transport='auto'");
  }
  if (!one_host && local.size() == 1) return network();  // nobody here to share memory with
  ShmSettings settings;
  settings.spin = std::chrono::microseconds(options.spin_us);
  settings.log = options.log_algorithm;  // spin or yield: connect decides, from every local rank
  // A slot holds a whole segment, up to a few MiB (a larger segment spans
  // several slots).
  settings.slot_bytes = options.shm_slot_bytes != 0
                            ? std::max<size_t>(64, options.shm_slot_bytes)
                            : std::clamp<size_t>(options.segment_bytes, 4 << 10, 4 << 20);
  settings.cma_min_bytes =
      options.shm_single_copy_bytes == 0 ? SIZE_MAX : options.shm_single_copy_bytes;
  settings.poison_released = options.fake_device;
  auto shm = ShmTransport::connect(store, prefix, rank, size, local, settings, deadline, reuse);
  if (one_host) return shm;
  std::vector<std::unique_ptr<Transport>> parts;
  parts.push_back(std::move(shm));
  parts.push_back(network());
  const std::string name = std::string("shm+") + parts.back()->name();
  return std::make_unique<RoutedTransport>(std::move(parts), name);
}

namespace {

void check_arguments(int rank, int size, const Options& options) {
  if (size < 1) throw InvalidArgument("world_size must be >= 1, got " + std::to_string(size));
  if (rank < 0 || rank >= size) {
    throw InvalidArgument("rank must be in [0, " + std::to_string(size) + "), got " +
                          std::to_string(rank));
  }
  if (options.timeout_seconds <= 0) throw InvalidArgument("timeout must be > 0 seconds");
}

}  // namespace

std::unique_ptr<Communicator> create_tcp_communicator(int rank, int size,
                                                      const std::string& master_addr,
                                                      int master_port, const std::string& store_dir,
                                                      const Options& options,
                                                      const Interrupt* interrupt,
                                                      const std::function<void(int)>& listening) {
  check_arguments(rank, size, options);
  const Deadline deadline = Deadline::after(options.timeout_seconds, interrupt);
  std::unique_ptr<Store> store;
  std::string advertise;
  std::string meeting;
  if (size == 1) {
    store = make_local_store();  // nobody to meet: no port, no files
  } else if (!store_dir.empty()) {
    store = make_file_store(store_dir);
    advertise = master_addr.empty() ? "127.0.0.1" : local_ip_towards(master_addr);
    meeting = "the file store in " + store_dir;
  } else {
    // Rank 0 waits up to 3 s for its port, should it be held for a moment.
    store = make_tcp_store(
        master_addr, master_port, rank == 0, deadline, options.timeout_seconds, options.token,
        [&](int port) {
          master_port = port;
          if (listening) listening(port);
        },
        3.0, options.tcp_keepalive_seconds);
    advertise = local_ip_towards(master_addr);
    meeting = "rank 0's rendezvous store at " + master_addr + ":" + std::to_string(master_port);
  }
  return create_communicator(std::move(store), rank, size, advertise, meeting, options, deadline);
}

namespace {

// create_communicator's work; `store` moves into the communicator at the end.
std::unique_ptr<Communicator> connect_communicator(std::unique_ptr<Store>& store, int rank,
                                                   int size, std::string advertise,
                                                   const std::string& meeting,
                                                   const Options& options, const Deadline& deadline,
                                                   const LinkReuse* reuse) {
  if (!options.socket_addr.empty()) advertise = options.socket_addr;
  if (advertise.empty()) advertise = local_ip_towards("192.0.2.1");  // the default route's
  // Every key of this communicator lives under an id its members agree on
  // first, so that communicators sharing a store never read each other's.
  const std::string prefix =
      identity_prefix(agree_on_identity(*store, rank, size, meeting, deadline));
  // Every rank has taken its seat, so every rank is connected to the store.
  if (rank == 0) store->seal();
  std::string link_token = options.token;
  if (link_token.empty() && size > 1) {
    // No job token: the data links still prove a secret, agreed through the
    // store, so that only processes that reached the store (a torch.distributed
    // store, a shared directory) can connect to a rank.
    char hex[33];
    const Nonce n = random_nonce();
    for (size_t i = 0; i < n.size(); ++i) std::snprintf(hex + 2 * i, 3, "%02x", n[i]);
    link_token = store->set_if_absent(prefix + "link_token", hex);
  }
  Store& rendezvous = *store;
  const int streams =
      options.tcp_streams > 0 ? options.tcp_streams : default_tcp_streams(advertise);
  // A shrink: what of the revoked communicator's links each transport takes over.
  std::optional<TcpReuse> tcp_reuse;
  std::optional<ShmReuse> shm_reuse;
  if (reuse != nullptr) {
    // The revoked communicator's TCP and shared-memory transports, wherever
    // they are among its parts.
    TcpTransport* tcp_parent = nullptr;
    ShmTransport* shm_parent = nullptr;
    std::vector<Transport*> parts;
    if (reuse->parent != nullptr) reuse->parent->parts(parts);
    for (Transport* part : parts) {
      if (auto* t = dynamic_cast<TcpTransport*>(part); t != nullptr && tcp_parent == nullptr) {
        tcp_parent = t;
      }
      if (auto* s = dynamic_cast<ShmTransport*>(part); s != nullptr && shm_parent == nullptr) {
        shm_parent = s;
      }
    }
    tcp_reuse = TcpReuse{tcp_parent, reuse->old_ranks};
    shm_reuse = ShmReuse{shm_parent, reuse->old_ranks};
  }
  const NetworkFactory tcp = [&] {
    return TcpTransport::connect_ring(rendezvous, prefix, rank, size, advertise,
                                      std::chrono::microseconds(options.spin_us), deadline,
                                      link_token, streams, options.tcp_keepalive_seconds,
                                      tcp_reuse ? &*tcp_reuse : nullptr);
  };
  Placement placement;
  auto transport = connect_links(*store, prefix, rank, size, options, tcp, &placement, meeting,
                                 deadline, shm_reuse ? &*shm_reuse : nullptr);
  std::unique_ptr<Transport> p2p;
  if (options.point_to_point && size > 1) {
    const std::string p2p_prefix = prefix + "p2p/";
    const NetworkFactory lazy = [&] {
      return TcpTransport::connect_lazy(rendezvous, p2p_prefix, rank, size, advertise,
                                        std::chrono::microseconds(options.spin_us), deadline,
                                        link_token, options.tcp_keepalive_seconds);
    };
    // Messages are rarer than collectives here: small slots keep the second set of
    // shared-memory inboxes small (a message larger than a slot spans several).
    Options p2p_options = options;
    if (p2p_options.shm_slot_bytes == 0) p2p_options.shm_slot_bytes = 64 << 10;
    p2p_options.log_algorithm = false;  // the collectives' links said how waits go
    p2p = connect_links_among(*store, p2p_prefix, rank, size, p2p_options, lazy,
                              placement.local_ranks, deadline);
  }
  return std::make_unique<Communicator>(std::move(store), std::move(transport), options, placement,
                                        prefix, std::move(p2p));
}

}  // namespace

std::unique_ptr<Communicator> create_communicator(std::unique_ptr<Store> store, int rank, int size,
                                                  std::string advertise, const std::string& meeting,
                                                  const Options& options, const Deadline& deadline,
                                                  const LinkReuse* reuse) {
  try {
    return connect_communicator(store, rank, size, std::move(advertise), meeting, options, deadline,
                                reuse);
  } catch (const Interrupted&) {
    throw;  // Ctrl-C: the caller asked to stop now
  } catch (...) {
    // Rank 0 hosts the store: if it fails here (bad settings that every rank
    // finds), the others may still be reading what they need to find it too.
    // Stay a moment before the store goes with this process.
    if (store && store->ends_with_attempt()) {
      std::this_thread::sleep_for(
          std::chrono::duration<double>(std::min(1.0, options.timeout_seconds / 2)));
    }
    throw;
  }
}

std::unique_ptr<Communicator> create_store_communicator(std::unique_ptr<Store> store, int rank,
                                                        int size, const std::string& advertise,
                                                        const std::string& meeting,
                                                        const Options& options,
                                                        const Interrupt* interrupt,
                                                        const LinkReuse* reuse) {
  check_arguments(rank, size, options);
  return create_communicator(std::move(store), rank, size, advertise, meeting, options,
                             Deadline::after(options.timeout_seconds, interrupt), reuse);
}

}  // namespace rr
