#include "engine/mpi_communicator.h"

#include "common/error.h"
#include "engine/bootstrap.h"
#include "engine/identity.h"
#include "transport/mpi/mpi_store.h"
#include "transport/mpi/mpi_transport.h"

namespace rr {

std::unique_ptr<Communicator> create_mpi_communicator(MPI_Comm comm, const Options& options) {
  if (options.timeout_seconds <= 0) throw InvalidArgument("timeout must be > 0 seconds");
  const Deadline deadline = Deadline::after(options.timeout_seconds);
  auto channel = MpiChannel::open(comm, deadline, /*watch_liveness=*/true, options.socket_addr);
  auto store = make_mpi_store(channel);
  const NetworkFactory mpi = [&] { return std::make_unique<MpiTransport>(channel); };
  const std::string prefix = identity_prefix(agree_on_identity(
      *store, channel->rank(), channel->size(), "the MPI communicator", deadline));
  Placement placement;
  auto transport = connect_links(*store, prefix, channel->rank(), channel->size(), options, mpi,
                                 &placement, "the MPI communicator", deadline);
  std::unique_ptr<Transport> p2p;
  if (options.point_to_point && channel->size() > 1) {
    // A communicator of their own, so point-to-point messages never match
    // the collectives' (MPI_Comm_idup again: collective, like this call).
    auto p2p_channel = MpiChannel::open(comm, deadline);
    const NetworkFactory mpi_p2p = [&] { return std::make_unique<MpiTransport>(p2p_channel); };
    p2p = connect_links_among(*store, prefix + "p2p/", channel->rank(), channel->size(), options,
                              mpi_p2p, placement.local_ranks, deadline);
  }
  return std::make_unique<Communicator>(std::move(store), std::move(transport), options, placement,
                                        prefix, std::move(p2p));
}

}  // namespace rr
