// Creating a communicator: meeting the other ranks through a store, learning
// which of them share this host, and connecting a transport to each: shared
// memory on the host, the network transport (TCP or MPI) to other hosts, as
// Options::transport asks.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/communicator.h"
#include "engine/options.h"
#include "rendezvous/store.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"

namespace rr {

// Makes the transport between hosts once every rank is ready to connect.
using NetworkFactory = std::function<std::unique_ptr<Transport>()>;

// A shrink's: the revoked communicator's transport (null where this rank has
// none to give: then nothing is taken over from it) and each new rank's rank
// in that communicator. Its TCP ring links and shared memory between survivors
// are taken over (tcp_transport.h, shm_transport.h); every rank passes one, or
// none does.
struct LinkReuse {
  Transport* parent = nullptr;
  std::vector<int> old_ranks;
};

// Every rank's host (Options::host_id or host_identity()), exchanged through
// the store: the ranks on ours, ascending, and our place among them.
// A rank that never joins is named in a TimeoutError saying where we waited
// for it (`meeting`).
std::vector<int> ranks_on_this_host(Store& store, const std::string& prefix, int rank, int size,
                                    const std::string& host_id, const std::string& meeting,
                                    const Deadline& deadline);

// Builds the communicator's transport: "shm" (every rank on this host, else
// InvalidArgument naming a rank elsewhere), the network transport alone
// ("tcp"/"mpi"), or "auto": shared memory between the ranks of each host and
// the network between hosts, named like "shm+tcp" (plain "shm" when one host
// has every rank, plain "tcp" on a rank alone on its host). Fills `placement`.
std::unique_ptr<Transport> connect_links(Store& store, const std::string& prefix, int rank,
                                         int size, const Options& options,
                                         const NetworkFactory& network, Placement* placement,
                                         const std::string& meeting, const Deadline& deadline,
                                         const ShmReuse* reuse = nullptr);

// The same for ranks whose hosts are known (`local`: the ranks on ours), under
// another prefix: the point-to-point links beside the collectives' ones.
std::unique_ptr<Transport> connect_links_among(Store& store, const std::string& prefix, int rank,
                                               int size, const Options& options,
                                               const NetworkFactory& network,
                                               const std::vector<int>& local,
                                               const Deadline& deadline,
                                               const ShmReuse* reuse = nullptr);

// A communicator whose ranks meet at a TCP store on master_addr:master_port
// hosted by rank 0 (or a file store in `store_dir` when it is not empty).
// Rank 0 may pass port 0: its store listens on a port the kernel picks and
// `listening` is told which, before rank 0 waits for the others.
std::unique_ptr<Communicator> create_tcp_communicator(
    int rank, int size, const std::string& master_addr, int master_port,
    const std::string& store_dir, const Options& options, const Interrupt* interrupt = nullptr,
    const std::function<void(int)>& listening = {});

// A communicator whose ranks meet through a store the caller made (a
// torch.distributed store, through the bindings): every key goes there, so no
// port of our own is needed to meet. Sockets advertise `advertise` (empty:
// the address of the default route's interface, or RINGREDUCE_SOCKET_ADDR).
// `reuse`: a shrink's (LinkReuse).
std::unique_ptr<Communicator> create_store_communicator(std::unique_ptr<Store> store, int rank,
                                                        int size, const std::string& advertise,
                                                        const std::string& meeting,
                                                        const Options& options,
                                                        const Interrupt* interrupt = nullptr,
                                                        const LinkReuse* reuse = nullptr);

// Both wait for the other ranks within options.timeout_seconds, asking
// `interrupt` (if any) while they wait: Ctrl-C during a rendezvous.
// The common end of both: links and the communicator, once a store is there.
std::unique_ptr<Communicator> create_communicator(std::unique_ptr<Store> store, int rank, int size,
                                                  std::string advertise, const std::string& meeting,
                                                  const Options& options, const Deadline& deadline,
                                                  const LinkReuse* reuse = nullptr);

}  // namespace rr
