// A communicator's identity: the id that every member agrees on when it is
// made, under which all of its rendezvous keys live.
//
// Stores outlive communicators: a directory given as store_dir is reused by
// the next job, a torch store outlives its process group, and a program may
// make one communicator after another (or several at once) on one store. If
// the keys of two communicators met, a rank would read another communicator's
// addresses and segments (which is how a reused store_dir used to end in
// SIGBUS). So no member reads a key before it knows the id, and the id is
// learned in a way that stale keys cannot fake:
//
//   rank 0 draws a random 64-bit id X.
//   rank r > 0 draws a fresh random ticket q, writes it to  w<N>/ask/<r>,
//     and waits for            w<N>/answer/<r>/<q>  = X.
//     A key named by a ticket drawn just now cannot be stale.
//   rank 0 answers every ticket it finds under ask/<r> (it cannot tell a
//     stale ticket from a fresh one, so it answers each it sees) until rank r
//     takes its seat:          <X>/seat/<r>  (claim: set_if_absent, value q).
//     A seat under a freshly drawn X cannot be stale either.
//   rank r, given X, takes seat r with set_if_absent. If the seat holds
//     another ticket, a rank r of another communicator (made at the same
//     time, of the same size, on the same store) got this X: r draws a new
//     ticket and asks again, and the communicators sort themselves out.
//
// Every member then uses the prefix "rr/<X>/". The world size is part of the
// meeting place, so communicators of different sizes never ask each other.
#pragma once

#include <cstdint>
#include <string>

#include "common/deadline.h"
#include "common/error.h"
#include "rendezvous/store.h"

namespace rr {

// The id (16 hex digits) that ranks 0..size-1 meeting in `store` agree on.
// Every rank calls it; TimeoutError names a rank that did not take its seat
// (rank 0) or names rank 0 (the others) at the deadline.
std::string agree_on_identity(Store& store, int rank, int size, const std::string& meeting,
                              const Deadline& deadline);

// The error for rank `missing`, which never came to `meeting` while rank
// `waiter` waited for it until `deadline`.
TimeoutError did_not_join(int missing, int waiter, int size, const std::string& meeting,
                          const Deadline& deadline);

// The prefix of every key of the communicator with this id.
inline std::string identity_prefix(const std::string& id) { return "rr/" + id + "/"; }

// Where rank 0 writes "<missing rank>\n<its error>" when a rank never came, so that
// the ranks already seated name that rank instead of rank 0 (see bootstrap.cc).
inline std::string gave_up_key(const std::string& prefix) { return prefix + "gave_up"; }

}  // namespace rr
