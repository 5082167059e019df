#include "algorithms/hierarchy.h"

#include <map>

namespace rr {

Hierarchy make_hierarchy(const std::vector<std::string>& host_of, int rank) {
  // Hosts in the order of their lowest rank; each host's ranks ascending.
  std::vector<std::vector<int>> hosts;
  std::map<std::string, size_t> index;
  for (int r = 0; r < static_cast<int>(host_of.size()); ++r) {
    auto [it, fresh] = index.emplace(host_of[static_cast<size_t>(r)], hosts.size());
    if (fresh) hosts.emplace_back();
    hosts[it->second].push_back(r);
  }
  Hierarchy h;
  if (hosts.empty()) return h;
  for (const auto& ranks : hosts) {
    if (ranks.size() != hosts.front().size()) return h;
  }
  for (size_t host = 0; host < hosts.size(); ++host) {
    for (size_t local = 0; local < hosts[host].size(); ++local) {
      if (hosts[host][local] != rank) continue;
      h.host_ranks = hosts[host];
      h.local_index = static_cast<int>(local);
      h.host_index = static_cast<int>(host);
      for (const auto& ranks : hosts) h.peers.push_back(ranks[local]);
      return h;
    }
  }
  return h;
}

}  // namespace rr
