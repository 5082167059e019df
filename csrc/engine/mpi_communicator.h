// Builds a communicator over an existing MPI communicator: MPI already knows
// every rank, so there is no rendezvous. The transport and the store share a
// private duplicate of `comm` (see transport/mpi/mpi_channel.h).
#pragma once

#include <mpi.h>

#include <memory>

#include "engine/communicator.h"
#include "engine/options.h"

namespace rr {

// Collective over `comm`: every rank of it must call this, and waits for the
// others are bounded by options.timeout_seconds. MPI must be initialized with
// at least MPI_THREAD_SERIALIZED, since collectives may run on the
// communicator's worker thread. options.transport "auto" puts ranks of one
// host on shared memory and the rest on MPI ("shm+mpi").
std::unique_ptr<Communicator> create_mpi_communicator(MPI_Comm comm, const Options& options);

}  // namespace rr
