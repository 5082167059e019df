"""Free ports for a job's rendezvous: torch.distributed's store and ringreduce's.

A port is chosen at random *outside* the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``) and then probed. Asking the kernel for port 0
and closing the socket, the usual trick, returns an ephemeral port: the very pool the
kernel draws from for every outgoing connection and every other ``bind(0)`` on the host,
so between the probe and the store's bind another process's ``connect`` can take it (or
the port after it), and the job fails with "Address already in use". A random port below
the ephemeral range can only be taken by a program that asks for that number.

The band just below the ephemeral range (``standby_band()``) is left to the ranks' own
standby stores (fault tolerance), which each rank binds while the job runs: a port a
launcher picks there could be taken by one of them between the probe and the bind.
"""

from __future__ import annotations

import random
import socket

__all__ = ["free_port", "standby_band"]

_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_LOWEST = 10000  # leave the well-known and registered low ports alone
_STANDBY_WIDTH = 12000  # ports just below the ephemeral range, for standby stores


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open(_RANGE_FILE, encoding="ascii") as f:
            lo, hi = (int(x) for x in f.read().split()[:2])
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def standby_band() -> tuple[int, int]:
    """[first, end) of the ports the ranks' standby stores bind (membership.py), just
    below the ephemeral range; ``free_port`` never returns one."""
    lo = max(2048, _ephemeral_range()[0])
    return max(1024, lo - _STANDBY_WIDTH), lo


def _candidate_ranges(span: int) -> list[tuple[int, int]]:
    """[first, last] ranges of start ports whose whole run avoids the ephemeral range and,
    where there is room below it, the standby band."""
    lo, hi = _ephemeral_range()
    band = min(lo, standby_band()[0])
    below = band if band - span >= _LOWEST else lo
    ranges = []
    if below - span >= _LOWEST:
        ranges.append((_LOWEST, below - span))
    if hi + 1 <= 65536 - span:
        ranges.append((hi + 1, 65536 - span))
    return ranges


def free_port(addr: str = "127.0.0.1", span: int = 2) -> int:
    """Returns a port p on ``addr`` such that p .. p+span-1 were all free a moment ago,
    chosen outside the ephemeral range where it can be (see the module's docstring).

    ``span`` defaults to 2 because a launched job uses two: torch.distributed's env://
    store listens on MASTER_PORT, ringreduce's rendezvous on RINGREDUCE_PORT (the next).
    """
    # SystemRandom: forked test workers and ranks share the random module's state, and
    # would otherwise try the same ports in the same order.
    pick = random.SystemRandom()
    ranges = _candidate_ranges(span)
    for _ in range(256 if ranges else 0):
        first, last = pick.choices(ranges, weights=[b - a + 1 for a, b in ranges])[0]
        port = pick.randint(first, last)
        if all(_port_is_free(addr, port + k) for k in range(span)):
            return port
    for _ in range(64):  # no room outside the ephemeral range: ask the kernel
        with socket.socket() as s:
            s.bind((addr, 0))
            port = s.getsockname()[1]
        if port + span - 1 <= 65535 and all(_port_is_free(addr, port + k) for k in range(1, span)):
            return port
    raise OSError(f"no run of {span} free ports found on {addr}")


def _port_is_free(addr: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((addr, port))
        except OSError:
            return False
    return True
