// Where a rank sits among hosts, for the hierarchical all_reduce
// (hierarchical.cc): the ranks of its own host, and the ranks that hold the
// same place on every other host.
//
// Hosts are ordered by their lowest rank and the ranks of a host ascend, so
// every rank derives the same groups from the same map of hosts, whatever
// order the launcher numbered ranks in (rank r on host r % 2 works as well as
// hosts of consecutive ranks).
#pragma once

#include <string>
#include <vector>

namespace rr {

struct Hierarchy {
  std::vector<int> host_ranks;  // the ranks on this host, ascending: the local ring
  std::vector<int> peers;       // the rank at our local index on every host, in host order
  int local_index = 0;          // our place in host_ranks
  int host_index = 0;           // our host's place in peers

  int local_size() const { return static_cast<int>(host_ranks.size()); }
  int hosts() const { return static_cast<int>(peers.size()); }
  // Worth running: several hosts, several ranks on each.
  bool usable() const { return local_size() > 1 && hosts() > 1; }
};

// From the host of every rank (host_of[r]), the groups of `rank`. Empty
// groups (so !usable()) when the hosts hold different numbers of ranks: the
// per-local-index rings would not line up.
Hierarchy make_hierarchy(const std::vector<std::string>& host_of, int rank);

}  // namespace rr
