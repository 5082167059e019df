#include "engine/mpi_communicator.h"

#include "common/error.h"
#include "rendezvous/mpi_store.h"
#include "transport/mpi/mpi_transport.h"

namespace rr {

std::unique_ptr<Communicator> create_mpi_communicator(MPI_Comm comm, double timeout_seconds,
                                                      size_t segment_bytes) {
  if (timeout_seconds <= 0) throw InvalidArgument("timeout must be > 0 seconds");
  auto channel = MpiChannel::open(comm, Deadline::after(timeout_seconds));
  auto transport = std::make_unique<MpiTransport>(channel);
  return std::make_unique<Communicator>(make_mpi_store(channel), std::move(transport),
                                        timeout_seconds, segment_bytes, "rr/");
}

}  // namespace rr
