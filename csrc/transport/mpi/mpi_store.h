// A store for ranks that share an MPI communicator. MPI already did the
// bootstrap, so the store only carries what the communicator publishes after
// it: failure reports. Each rank keeps its own copy of the values; set()
// sends a value to every other rank over the channel's control tag, and reads
// first take in whatever has arrived. So set_if_absent() agrees on "the first
// failure" as far as each rank has heard of it, not by a global consensus:
// enough to name the rank that failed first, which is all it is used for.
// Because the communicator calls set_if_absent() for failure reports only, a
// call also marks the channel failed, so that the transport's abort() tells
// the peers instead of treating it as a normal close.
#pragma once

#include <memory>

#include "rendezvous/store.h"
#include "transport/mpi/mpi_channel.h"

namespace rr {

std::unique_ptr<Store> make_mpi_store(std::shared_ptr<MpiChannel> channel);

}  // namespace rr
