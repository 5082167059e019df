#include "engine/failure_report.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "common/error.h"

namespace rr {
namespace {

// A failure as published in the store: "kind\npeer\nrank\nmessage".
struct Report {
  std::string kind;  // "mismatch" | "timeout" | "peer" | "error"
  int peer = -1;
  int rank = -1;
  std::string message;

  std::string encode() const {
    return kind + "\n" + std::to_string(peer) + "\n" + std::to_string(rank) + "\n" + message;
  }
  static Report decode(const std::string& text) {
    Report r;
    std::istringstream in(text);
    std::string peer, rank;
    std::getline(in, r.kind);
    std::getline(in, peer);
    std::getline(in, rank);
    std::getline(in, r.message, '\0');
    r.peer = std::atoi(peer.c_str());
    r.rank = std::atoi(rank.c_str());
    return r;
  }
};

Report classify(std::exception_ptr error, int rank) {
  Report r;
  r.rank = rank;
  try {
    std::rethrow_exception(error);
  } catch (const MismatchError& e) {
    r = {"mismatch", e.peer(), rank, e.what()};
  } catch (const TimeoutError& e) {
    r = {"timeout", e.peer(), rank, e.what()};
  } catch (const PeerError& e) {
    r = {"peer", e.peer(), rank, e.what()};
  } catch (const std::exception& e) {
    r = {"error", -1, rank, e.what()};
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
// report that one record, so they all name the same culprit.
Report end_of_wait_chain(Store& store, const std::string& prefix, const Report& mine,
                         double timeout) {
  const std::string first_key = prefix + "first_error";
  auto timeout_key = [&prefix](int rank) { return prefix + "timeout/" + std::to_string(rank); };
  store.set(timeout_key(mine.rank), mine.encode());
  const Deadline grace = Deadline::after(std::min(1.0, timeout / 2));
  while (!grace.expired() && !store.try_get(first_key)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Report end = mine;
  std::set<int> seen{mine.rank};
  try {
    while (end.peer >= 0 && seen.insert(end.peer).second) {
      std::optional<std::string> next = store.try_get(timeout_key(end.peer));
      if (!next) break;
      end = Report::decode(*next);
    }
  } catch (const std::exception&) {
    // The store went away mid-walk: the chain so far is still our best answer.
  }
  return end;
}

std::exception_ptr make_error(const std::string& kind, const std::string& message, int peer) {
  if (kind == "mismatch") return std::make_exception_ptr(MismatchError(message, peer));
  if (kind == "timeout") return std::make_exception_ptr(TimeoutError(message, peer));
  if (kind == "peer") return std::make_exception_ptr(PeerError(message, peer));
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
  try {
    if (is_timeout(error)) first = end_of_wait_chain(store, prefix, mine, timeout);
  } catch (const std::exception&) {
    // The store is gone before we could record our wait: go by what we saw.
  }
  try {
    first = Report::decode(store.set_if_absent(prefix + "first_error", first.encode()));
  } catch (const std::exception&) {
    // The store is gone (its host died): report what we know ourselves.
  }
  transport.abort();
  if (store.hosted_here()) {
    // Our process may end as soon as the error reaches Python, taking the
    // store with it: stay a moment so that the other ranks can read why.
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(1.0, timeout / 2)));
  }

  std::string kind = mine.kind;
  std::string message = mine.message;
  int peer = mine.peer;
  if (first.rank != rank) {
    // Someone failed before us; our own failure is most likely the echo of
    // theirs, so the message leads with the original cause and its culprit,
    // and what we saw ourselves comes after, in brackets.
    kind = first.kind;
    peer = first.peer;
    message = first.message + " [then here, on rank " + std::to_string(rank) + ", " + description +
              " failed: " + cause + "]";
  }
  if (interrupted(error)) return {error, message};
  return {make_error(kind, message, peer), message};
}

}  // namespace rr
