#include "engine/mpi_communicator.h"

#include "common/error.h"
#include "engine/bootstrap.h"
#include "rendezvous/mpi_store.h"
#include "transport/mpi/mpi_transport.h"

namespace rr {

std::unique_ptr<Communicator> create_mpi_communicator(MPI_Comm comm, const Options& options) {
  if (options.timeout_seconds <= 0) throw InvalidArgument("timeout must be > 0 seconds");
  const Deadline deadline = Deadline::after(options.timeout_seconds);
  auto channel = MpiChannel::open(comm, deadline);
  auto store = make_mpi_store(channel);
  const NetworkFactory mpi = [&] { return std::make_unique<MpiTransport>(channel); };
  Placement placement;
  auto transport = connect_links(*store, "rr/", channel->rank(), channel->size(), options, mpi,
                                 &placement, "the MPI communicator", deadline);
  return std::make_unique<Communicator>(std::move(store), std::move(transport), options, placement,
                                        "rr/");
}

}  // namespace rr
