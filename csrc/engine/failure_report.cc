#include "engine/failure_report.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "common/error.h"

namespace rr {

namespace {

// A call's text as it travels in a record: one line, no tabs, bounded.
std::string field_text(const std::string& text) {
  std::string out = text.substr(0, 512);
  for (char& c : out) {
    if (c == '\t' || c == '\n') c = ' ';
  }
  return out;
}

std::string encode_facts(const MismatchFacts& f) {
  if (!f.known()) return "";
  char tags[48];
  std::snprintf(tags, sizeof tags, "%llx\t%llx", static_cast<unsigned long long>(f.issuers[0]),
                static_cast<unsigned long long>(f.issuers[1]));
  return field_text(f.reason) + "\t" + std::to_string(f.ranks[0]) + "\t" +
         std::to_string(f.ranks[1]) + "\t" + tags + "\t" + field_text(f.calls[0]) + "\t" +
         field_text(f.calls[1]);
}

// Read back from a store anyone may have written to: facts that do not parse
// are dropped (the message still says everything).
MismatchFacts decode_facts(const std::string& line, int world_size) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(line);
  while (std::getline(in, part, '\t')) parts.push_back(part);
  MismatchFacts f;
  if (parts.size() != 7 || parts[0].empty()) return f;
  for (int i = 0; i < 2; ++i) {
    char* end = nullptr;
    errno = 0;
    const long r = std::strtol(parts[1 + i].c_str(), &end, 10);
    if (parts[1 + i].empty() || *end != '\0' || errno != 0 || r < 0 || r >= world_size) {
      return {};
    }
    const unsigned long long tag = std::strtoull(parts[3 + i].c_str(), &end, 16);
    if (parts[3 + i].empty() || *end != '\0' || errno != 0) return {};
    f.ranks[i] = static_cast<int>(r);
    f.issuers[i] = tag;
    f.calls[i] = field_text(parts[5 + i]);
  }
  f.reason = field_text(parts[0]);
  return f;
}

}  // namespace

std::string FailureRecord::encode() const {
  const std::string details = kind == "mismatch" ? encode_facts(facts)
                              : kind == "peer"   ? field_text(reason)
                                                 : "";
  return kind + "\n" + std::to_string(peer) + "\n" + std::to_string(rank) + "\n" + details + "\n" +
         message;
}

FailureRecord FailureRecord::decode(const std::string& text, int world_size) {
  // Written by a peer, read back from a store anyone may have written to:
  // every field is checked, and what is not understood is said plainly.
  FailureRecord r;
  std::istringstream in(text);
  std::string peer, rank, facts;
  std::getline(in, r.kind);
  std::getline(in, peer);
  std::getline(in, rank);
  std::getline(in, facts);
  std::getline(in, r.message, '\0');
  auto to_rank = [world_size](const std::string& field) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(field.c_str(), &end, 10);
    const bool ok =
        !field.empty() && end != nullptr && *end == '\0' && errno == 0 && v >= 0 && v < world_size;
    return ok ? static_cast<int>(v) : -1;
  };
  r.peer = to_rank(peer);
  r.rank = to_rank(rank);
  if (r.kind == "mismatch") r.facts = decode_facts(facts, world_size);
  if (r.kind == "peer" && facts == kUnreachable) r.reason = facts;
  if (r.kind != "mismatch" && r.kind != "timeout" && r.kind != "peer" && r.kind != "error") {
    r.kind = "error";
  }
  if (r.message.size() > kMaxMessage) r.message.resize(kMaxMessage);
  if (r.rank < 0) r.message = "(a failure report that names no valid rank) " + r.message;
  return r;
}

namespace {

using Report = FailureRecord;

Report classify(std::exception_ptr error, int rank) {
  Report r;
  r.rank = rank;
  try {
    std::rethrow_exception(error);
  } catch (const MismatchError& e) {
    r = {"mismatch", e.peer(), rank, e.what(), e.facts()};
  } catch (const TimeoutError& e) {
    r = {"timeout", e.peer(), rank, e.what(), {}};
  } catch (const PeerError& e) {
    r = {"peer", e.peer(), rank, e.what(), {}, e.reason()};
  } catch (const Interrupted&) {
    // This rank's caller stopped it (Ctrl-C): to the others it is a peer
    // that left, and it is the one to name.
    r = {"peer",
         rank,
         rank,
         "rank " + std::to_string(rank) +
             " was interrupted (Ctrl-C or another signal in its caller) and left the "
             "communicator",
         {}};
  } catch (const std::exception& e) {
    r = {"error", -1, rank, e.what(), {}};
  }
  return r;
}

bool is_timeout(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError&) {
    return true;
  } catch (...) {
    return false;
  }
}

// When a rank stalls, the ranks waiting on it time out, and so, a moment
// later, do the ranks waiting on those: the rank we waited on may itself be
// waiting. Each timed-out rank records whom it waited on; after a short grace
// for the others' records to arrive, every rank follows the chain of waits to
// its end, the wait on a rank that is not itself waiting. All ranks then
// report that one record, so they all name the same culprit. The grace ends
// early once every rank but one has recorded its wait: the one left is then
// the end of every chain unless it records a wait of its own later (a stalled
// rank records nothing), so a stalled rank is named at the timeout, not a
// second after it.
Report end_of_wait_chain(Store& store, const std::string& prefix, const Report& mine,
                         double timeout, int world_size) {
  const std::string first_key = prefix + "first_error";
  auto timeout_key = [&prefix](int rank) { return prefix + "timeout/" + std::to_string(rank); };
  store.set(timeout_key(mine.rank), mine.encode());
  std::set<int> unrecorded;
  for (int r = 0; r < world_size; ++r) {
    if (r != mine.rank) unrecorded.insert(r);
  }
  const Deadline grace = Deadline::after(std::min(1.0, timeout / 2));
  while (!grace.expired() && unrecorded.size() > 1 && !store.try_get(first_key)) {
    // Records stay: each look asks only until two ranks are still missing,
    // so the store sees a few requests per look, not one per rank.
    size_t missing = 0;
    for (auto it = unrecorded.begin(); it != unrecorded.end() && missing < 2;) {
      if (store.try_get(timeout_key(*it))) {
        it = unrecorded.erase(it);
      } else {
        ++missing;
        ++it;
      }
    }
    if (unrecorded.size() > 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Report end = mine;
  std::set<int> seen{mine.rank};
  try {
    while (end.peer >= 0 && seen.insert(end.peer).second) {
      std::optional<std::string> next = store.try_get(timeout_key(end.peer));
      if (!next) break;
      end = Report::decode(*next, world_size);
    }
  } catch (const std::exception&) {
    // The store went away mid-walk: the chain so far is still our best answer.
  }
  return end;
}

// The error to raise for record r, with `message` in place of r's.
std::exception_ptr make_error(const Report& r, const std::string& message) {
  if (r.kind == "mismatch") return std::make_exception_ptr(MismatchError(message, r.peer, r.facts));
  if (r.kind == "timeout") return std::make_exception_ptr(TimeoutError(message, r.peer));
  if (r.kind == "peer") return std::make_exception_ptr(PeerError(message, r.peer, r.reason));
  return std::make_exception_ptr(Error(message));
}

// An interrupted wait (Ctrl-C in the caller) is raised as it is: the caller
// asked for it.
bool interrupted(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Interrupted&) {
    return true;
  } catch (...) {
    return false;
  }
}

// The first failure, as the error of rank `rank` whose own call (description)
// failed with `cause`: "rank 1: <our call> failed after rank 0's <its call>
// failed: <its cause> [seen here: <our cause>]". A mismatch names both calls in
// its cause already, so it reads "rank 1: <our call> failed: <the mismatch>";
// one we saw too is the same news from the other side, stated once.
std::string told_from_here(const Report& first, int rank, const std::string& description,
                           const std::string& cause, bool saw_mismatch) {
  const std::string mine = "rank " + std::to_string(rank) + ": " + description + " failed";
  const std::string seen = " [seen here: " + cause + "]";
  // A record written by report_failure reads "rank F: <call> failed: <cause>";
  // those made up for a rank that could not write one (a dead or stopped
  // store host) are a sentence of their own.
  const std::string theirs = "rank " + std::to_string(first.rank) + ": ";
  const std::string::size_type split = first.message.find(" failed: ");
  if (first.rank < 0 || first.message.rfind(theirs, 0) != 0 || split == std::string::npos) {
    return mine + ": " + first.message + seen;
  }
  const std::string their_call = first.message.substr(theirs.size(), split - theirs.size());
  const std::string their_cause = first.message.substr(split + 9);
  if (first.kind == "mismatch") {
    return mine + ": " + their_cause + (saw_mismatch ? "" : seen);
  }
  return mine + " after rank " + std::to_string(first.rank) + "'s " + their_call +
         " failed: " + their_cause + seen;
}

}  // namespace

FailureOutcome report_failure(Store& store, const std::string& prefix, Transport& transport,
                              int rank, double timeout, std::exception_ptr error,
                              const std::string& description) {
  Report mine = classify(error, rank);
  const std::string cause = mine.message;
  mine.message = "rank " + std::to_string(rank) + ": " + description + " failed: " + cause;

  // Publish before tearing down the connections: a neighbour that sees our
  // sockets close then finds the reason already in the store.
  Report first = mine;
  // Once a request to the store has failed (its host is gone, or stopped: then
  // each request would wait out its I/O timeout), the others are skipped.
  bool store_answers = true;
  try {
    if (is_timeout(error)) {
      first = end_of_wait_chain(store, prefix, mine, timeout, transport.size());
    }
  } catch (const std::exception&) {
    // The store is gone before we could record our wait: go by what we saw.
    store_answers = false;
  }
  try {
    if (!store_answers) throw Error("the store did not answer");
    first = Report::decode(store.set_if_absent(prefix + "first_error", first.encode()),
                           transport.size());
  } catch (const std::exception&) {
    store_answers = false;
    // The store is gone: report what we know ourselves, unless the store's
    // going is itself the news. Its host (rank 0) would have published a
    // failure of its own before leaving, and every client would hold the
    // notice of it: a store that closed on us with no such report means its
    // process died (killed, crashed). What we saw (a neighbour closing its
    // link, say) is most likely the echo of that.
    if (store.host_unreachable() && rank != 0 && mine.peer != 0) {
      // Not gone: cut off. Its process may well be alive, so it is named as
      // unreachable, which the shrink's agreement acts on (counted dead at
      // once, never tried as the agreement's host).
      first = {"peer",
               0,
               0,
               "rank 0's machine stopped answering: the rendezvous store it hosts acknowledged "
               "no request within the TCP keepalive time (a network partition, or its host "
               "froze or lost power; RINGREDUCE_TCP_KEEPALIVE sets how long)",
               {},
               kUnreachable};
    } else if (store.host_lost() && rank != 0 && mine.peer != 0) {
      first = {"peer",
               0,
               0,
               "rank 0 is gone: its process died (killed, crashed or exited without closing "
               "the communicator) without a failure report, and the rendezvous store it "
               "hosts went with it",
               {}};
    } else if (store.host_stopped() && rank != 0) {
      // A stopped rank 0 stalls every wait that leads to it, and it is the
      // one rank whose wait records we cannot read: the chain ends there.
      first = {"timeout", 0, 0,
               "rank 0 is stopped (SIGSTOP, Ctrl-Z or a debugger): its process, on this "
               "machine, neither takes part in the collective nor answers the rendezvous "
               "store it hosts",
               {}};
    }
  }
  // A rank silent (stopped, cut off), here or at the root: the news of the
  // failure may not travel the ring by itself (transport.h, note_silent).
  if (is_timeout(error) || mine.reason == kUnreachable || first.kind == "timeout" ||
      first.reason == kUnreachable) {
    transport.note_silent();
  }
  transport.abort();
  const std::string reported = prefix + "reported/";
  try {
    if (store_answers) store.set(reported + std::to_string(rank), "1");  // we read the first
  } catch (const std::exception&) {
  }
  if (store_answers && store.hosted_here() && !interrupted(error)) {
    // Our process may end as soon as the error reaches Python, taking the
    // store with it: stay until every other rank has read why (all but the
    // one the first failure blames, which may be dead), or a moment at most.
    // (Not when the caller pressed Ctrl-C: it asked to stop now, and a store
    // that goes away with us still names us, as the host that left.)
    const Deadline linger = Deadline::after(std::min(1.0, timeout / 2));
    std::set<int> waiting;
    for (int r = 0; r < transport.size(); ++r) {
      if (r != rank && r != first.peer) waiting.insert(r);
    }
    try {
      while (!waiting.empty() && !linger.expired()) {
        for (auto it = waiting.begin(); it != waiting.end();) {
          it = store.try_get(reported + std::to_string(*it)) ? waiting.erase(it) : std::next(it);
        }
        if (!waiting.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    } catch (const std::exception&) {
    }
  }

  std::string message = mine.message;
  const Report* raised = &mine;
  if (first.rank != rank) {
    // Someone failed before us; our own failure is most likely the echo of
    // theirs. The error is theirs (its kind, culprit and facts are the same
    // news on every rank), told from here: our own call first, then theirs
    // and its cause, then what we saw ourselves in brackets.
    raised = &first;
    message = told_from_here(first, rank, description, cause, mine.kind == "mismatch");
  }
  if (interrupted(error)) return {error, message};
  return {make_error(*raised, message), message};
}

}  // namespace rr
