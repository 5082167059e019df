#include "engine/choice.h"

#include <cmath>
#include <cstdio>

#include "algorithms/bulletin_all_reduce.h"
#include "algorithms/window_all_reduce.h"

namespace rr {

const char* route_name(Route route) {
  switch (route) {
    case Route::kBulletin:
      return "bulletin";
    case Route::kWindow:
      return "window";
    case Route::kSchedule:
      return "schedule";
  }
  return "?";
}

Choice choose(const RingContext& ctx, const CollectiveArgs& args) {
  // Small messages are bound by latency, not bandwidth: fewer dependent steps
  // beat fewer bytes. Where every peer is reached directly (shared memory),
  // one step of N-1 messages; else N-1 steps around the ring. The choice must
  // not depend on where the buffers live: host and GPU ranks meet in one call.
  // Above them, where hosts are joined by a slower network than their ranks
  // share, the hierarchical all_reduce sends each host's data across once
  // per direction instead of once per crossing of the flat ring. Every rank
  // sees the same hosts (exchanged at rendezvous), so all choose alike.
  if (ctx.transport.size() == 1) return {Route::kSchedule, Algorithm::kRing, Reason::kOneRank};
  if (args.kind != CollectiveKind::kAllReduce) {
    return {Route::kSchedule, Algorithm::kRing, Reason::kNotAllReduce};
  }
  const bool hierarchical = ctx.hierarchy != nullptr && ctx.hierarchy->usable();
  switch (ctx.policy) {
    case AlgorithmPolicy::kRing:
      return {Route::kSchedule, Algorithm::kRing, Reason::kPolicyRing};
    case AlgorithmPolicy::kHierarchical:
      return hierarchical ? Choice{Route::kSchedule, Algorithm::kHierarchical, Reason::kPolicyHier}
                          : Choice{Route::kSchedule, Algorithm::kRing, Reason::kPolicyHierNot};
    case AlgorithmPolicy::kAuto:
      break;
  }
  // The one choice made from where the buffers live: a rank whose buffers are
  // not all in windows chooses otherwise, and the headers say so.
  if (window_buffers(ctx, args)) return {Route::kWindow, Algorithm::kWindow, Reason::kWindows};
  const size_t bytes = args.count * dtype_size(args.dtype);
  if (bytes <= ctx.small_bytes) {
    if (!ctx.reaches_all) return {Route::kSchedule, Algorithm::kSmall, Reason::kSmallMessage};
    // A direct all_reduce that fits one entry of the transport's bulletin (shared
    // memory) runs there. Not from where the buffers live: a rank whose arrays are
    // on a GPU must take the bulletin exactly when its host-array peers do, or it
    // waits for messages they never send while they read its entry as data.
    const bool bulletin = bytes <= kBulletinDataBytes && ctx.transport.bulletin() != nullptr;
    return {bulletin ? Route::kBulletin : Route::kSchedule, Algorithm::kDirect,
            Reason::kSmallMessage};
  }
  return {Route::kSchedule, hierarchical ? Algorithm::kHierarchical : Algorithm::kRing,
          Reason::kLargeMessage};
}

namespace {

std::string byte_count(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && u < 3 && std::fmod(v, 1024.0) == 0) {
    v /= 1024;
    ++u;
  }
  char text[48];
  std::snprintf(text, sizeof text, "%.0f %s", v, units[u]);
  return text;
}

// Why the hierarchical all_reduce can or cannot run on these ranks.
std::string hosts_sentence(const RingContext& ctx) {
  const Hierarchy* h = ctx.hierarchy;
  const std::string n = std::to_string(ctx.transport.size());
  if (h == nullptr || h->hosts() == 0) {
    // Hosts not compared (this rank alone on its host), or of different sizes.
    return "the hierarchical all_reduce cannot run on these " + n +
           " ranks (it needs several hosts with the same number of ranks, more than one, "
           "on each)";
  }
  if (h->hosts() == 1) return "all " + n + " ranks share one host";
  if (h->local_size() == 1) return "the " + n + " ranks are on " + n + " hosts, one rank each";
  return "the " + n + " ranks span " + std::to_string(h->hosts()) + " hosts of " +
         std::to_string(h->local_size()) + " ranks";
}

}  // namespace

std::string explain(const Choice& choice, const RingContext& ctx, const CollectiveArgs& args) {
  const std::string name = algorithm_name(choice.algorithm);
  const size_t bytes = args.count * dtype_size(args.dtype);
  const std::string limit = "the small-message limit of " + byte_count(ctx.small_bytes) + " at " +
                            std::to_string(ctx.transport.size()) +
                            " ranks (RINGREDUCE_SMALL_BYTES, scaled by 2/N)";
  switch (choice.reason) {
    case Reason::kOneRank:
      return "one rank, nothing to exchange: " + name;
    case Reason::kNotAllReduce:
      if (compressed_kind(args.kind)) {
        return "compressed " + std::string(collective_name(args.kind)) +
               " has one schedule, the one-hop (algorithms/one_hop.h): no choice to make";
      }
      return std::string(collective_name(args.kind)) + " has one schedule, no choice to make";
    case Reason::kPolicyRing:
      return "RINGREDUCE_ALGORITHM=ring: " + name;
    case Reason::kPolicyHier:
      return "RINGREDUCE_ALGORITHM=hierarchical and " + hosts_sentence(ctx) + ": " + name;
    case Reason::kPolicyHierNot:
      return "RINGREDUCE_ALGORITHM=hierarchical, but " + hosts_sentence(ctx) + ": " + name;
    case Reason::kWindows:
      if (args.device >= 0) {
        return "every buffer of this rank is in a device window (comm.empty(..., device=" +
               std::to_string(args.device) + ")) and all " + std::to_string(ctx.transport.size()) +
               " ranks share this host, so the GPUs read each other's buffers in place: " + name;
      }
      return "every buffer of this rank is in a window (comm.empty) and all " +
             std::to_string(ctx.transport.size()) +
             " ranks share this host, so the ranks read each other's buffers in place: " + name;
    case Reason::kSmallMessage:
      return window_passed_over(ctx, args) + byte_count(bytes) + " <= " + limit +
             ", latency-bound; " +
             (choice.algorithm == Algorithm::kDirect
                  ? std::string("every peer is one link away (shared memory), so one step") +
                        (choice.route == Route::kBulletin
                             ? ", on the bulletin (one entry each, no message): "
                             : ": ")
                  : std::string("peers are reached around the ring, so N-1 steps of whole "
                                "vectors: ")) +
             name;
    case Reason::kLargeMessage:
      return window_passed_over(ctx, args) + byte_count(bytes) + " > " + limit +
             ", bandwidth-bound; " + hosts_sentence(ctx) +
             (choice.algorithm == Algorithm::kHierarchical
                  ? ", so each host's data crosses the network once per direction: "
                  : ": ") +
             name;
  }
  return name;
}

}  // namespace rr
