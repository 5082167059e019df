"""Emulated hosts: network namespaces rrhost0..H-1 with shaped links (netns_hosts.sh)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

NETNS_HOSTS = Path(__file__).resolve().parent.parent / "netns_hosts.sh"
MASTER_ADDR = "10.231.0.1"  # rrhost0, as netns_hosts.sh numbers the hosts


class Namespaces:
    """H emulated hosts at a rate (netns_hosts.sh up), taken down again on leaving."""

    def __init__(self, hosts: int, rate: str):
        self.hosts, self.rate, self.up = hosts, rate, False

    def __enter__(self) -> Namespaces:
        taken = [n for n in _netns_names() if n == "rrswitch" or n.startswith("rrhost")]
        if taken:
            raise RuntimeError(
                f"network namespaces {', '.join(taken)} exist already (another run?); "
                f"remove them with: {NETNS_HOSTS} down {max(4, len(taken))}"
            )
        self.up = True
        try:
            subprocess.run(
                [str(NETNS_HOSTS), "up", str(self.hosts), self.rate],
                check=True,
                stdout=subprocess.DEVNULL,
                timeout=60,
            )
        except BaseException:
            self.__exit__()  # a partial bring-up is taken down too
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.up:
            subprocess.run([str(NETNS_HOSTS), "down", str(self.hosts)], timeout=60, check=False)
            self.up = False


def _netns_names() -> list[str]:
    out = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]
