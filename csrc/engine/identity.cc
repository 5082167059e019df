#include "engine/identity.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.h"
#include "security/auth.h"

namespace rr {
namespace {

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string meeting_place(int size) { return "rr/w" + std::to_string(size) + "/"; }

std::string ask_key(int size, int rank) {
  return meeting_place(size) + "ask/" + std::to_string(rank);
}

std::string answer_key(int size, int rank, const std::string& ticket) {
  return meeting_place(size) + "answer/" + std::to_string(rank) + "/" + ticket;
}

std::string seat_key(const std::string& id, int rank) {
  return identity_prefix(id) + "seat/" + std::to_string(rank);
}

using Backoff = PollBackoff;


// Rank 0: answers the tickets of every rank until each has taken its seat.
void seat_everyone(Store& store, int size, const std::string& id, const std::string& meeting,
                   const Deadline& deadline) {
  std::set<int> pending;
  for (int r = 1; r < size; ++r) pending.insert(r);
  std::set<std::pair<int, std::string>> answered;
  Backoff backoff;
  const std::chrono::milliseconds look = store.peer_look();
  auto next_look = Clock::now() + look;
  while (!pending.empty()) {
    bool news = false;
    // Every pending rank's seat and ticket, read together: one round trip a look,
    // not two a rank (rank 0's looks are on every member's path into the communicator).
    std::vector<std::string> keys;
    for (int r : pending) {
      keys.push_back(seat_key(id, r));
      keys.push_back(ask_key(size, r));
    }
    const std::vector<std::optional<std::string>> found = store.try_get_many(keys);
    std::vector<std::pair<std::string, std::string>> answers;
    size_t i = 0;
    for (auto it = pending.begin(); it != pending.end(); i += 2) {
      const int r = *it;
      if (found[i]) {
        it = pending.erase(it);
        news = true;
        continue;
      }
      if (const std::optional<std::string>& ticket = found[i + 1]) {
        if (answered.insert({r, *ticket}).second)
          answers.emplace_back(answer_key(size, r, *ticket), id);
      }
      ++it;
    }
    if (!answers.empty()) {
      store.set_many(answers);  // together too
      news = true;
    }
    if (pending.empty()) break;
    if (deadline.expired()) {
      TimeoutError missing = did_not_join(*pending.begin(), 0, size, meeting, deadline);
      // The ranks already seated wait for rank 0 next: tell them who is missing.
      store.set(gave_up_key(identity_prefix(id)),
                std::to_string(missing.peer()) + "\n" + missing.what());
      throw missing;
    }
    if (Clock::now() >= next_look) {
      // A member of a shrink or grow that died before it took its seat: no need to
      // wait for the deadline (the store knows where the members' processes are).
      next_look = Clock::now() + look;
      for (int r : pending) {
        if (!store.peer_gone(r)) continue;
        const std::string why = "rank " + std::to_string(r) + " is gone: it died before it joined " +
                                meeting;
        store.set(gave_up_key(identity_prefix(id)), std::to_string(r) + "\n" + why);
        throw PeerError(why, r);
      }
    }
    if (news) {
      backoff.reset();
      continue;  // look again at once: others may have come meanwhile
    }
    // Wait for the first pending rank's next key, one not set yet: its ask, or its
    // seat once its ask is answered. A store that holds waits answers the moment
    // it is set; whoever else came meanwhile is seen by the next look.
    const int r = *pending.begin();
    const auto mine = answered.lower_bound({r, std::string()});
    const bool asked = mine != answered.end() && mine->first == r;
    store.look_for(asked ? seat_key(id, r) : ask_key(size, r), look, backoff, deadline);
  }
}

// Rank r > 0: asks rank 0 for the id with a fresh ticket, then takes its seat.
std::string ask_for_id(Store& store, int rank, int size, const std::string& meeting,
                       const Deadline& deadline) {
  // Re-publish the ticket now and then: a rank r of another communicator
  // meeting on the same store may have overwritten it before rank 0 read it.
  constexpr auto kRepublish = std::chrono::milliseconds(100);
  while (true) {
    const std::string ticket = hex64(random_u64());
    store.set(ask_key(size, rank), ticket);
    Clock::time_point asked = Clock::now();
    Backoff backoff;
    std::optional<std::string> id;
    const auto until_republish = [&] {
      return std::max(std::chrono::milliseconds(1),
                      std::chrono::duration_cast<std::chrono::milliseconds>(
                          kRepublish - (Clock::now() - asked)));
    };
    // Rank 0 sets the answer: a store that holds the request hands it over at once.
    while (!(id = store.look_for(answer_key(size, rank, ticket), until_republish(), backoff,
                                 deadline))) {
      if (deadline.expired()) {
        throw did_not_join(0, rank, size, meeting, deadline);
      }
      if (Clock::now() - asked >= kRepublish) {
        store.set(ask_key(size, rank), ticket);
        asked = Clock::now();
      }
    }
    if (id->size() != 16 || id->find_first_not_of("0123456789abcdef") != std::string::npos) {
      throw Error("rendezvous: rank 0 answered rank " + std::to_string(rank) +
                  " with a malformed communicator id (" + std::to_string(id->size()) +
                  " bytes); is something else writing to this store?");
    }
    if (store.claim(seat_key(*id, rank), ticket) == ticket) return *id;
    // Another rank `rank` (of a communicator made at the same time on this
    // store) took this seat first: ask again.
  }
}

}  // namespace

TimeoutError did_not_join(int missing, int waiter, int size, const std::string& meeting,
                          const Deadline& deadline) {
  return TimeoutError("rank " + std::to_string(missing) + " did not join within " +
                          format_seconds(deadline.seconds()) + " s; rank " +
                          std::to_string(waiter) + " waited for it at " + meeting +
                          ". Check that it was started, with the same rendezvous settings and "
                          "world size " +
                          std::to_string(size) + ", and can reach that address",
                      missing);
}

std::string agree_on_identity(Store& store, int rank, int size, const std::string& meeting,
                              const Deadline& deadline) {
  if (rank == 0) {
    const std::string id = hex64(random_u64());
    if (size > 1) seat_everyone(store, size, id, meeting, deadline);
    return id;
  }
  return ask_for_id(store, rank, size, meeting, deadline);
}

}  // namespace rr
