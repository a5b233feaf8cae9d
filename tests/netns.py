"""A second host on this machine: a network namespace joined to this one by a veth pair whose cable can be cut.

Cutting it (the link set down on this side) is a silence, not a refusal:
nothing answers and nothing resets, as when a server's machine freezes or
its address moves in a failover; a proxy on localhost cannot show that,
because the kernel on this side would go on acknowledging bytes. Needs
root (``ip netns``), as the test machine and CI run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from tests.processes import RUNNER

ROOT = Path(__file__).resolve().parents[1]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=10)


class SecondHost:
    """``here`` is this side's address, which the second host reaches over the cable."""

    def __init__(self):
        tag = uuid.uuid4().hex[:6]
        self.namespace = f"attache_{tag}"
        self.link, peer = f"at{tag}h", f"at{tag}p"
        # a /30 of its own: a subnet by the tag, in a /16 of the test runner's own (make test runs in parallel)
        subnet, block = int(tag[:2], 16) % 250 + 1, int(tag[2:4], 16) % 64 * 4
        network = f"10.{231 + RUNNER % 16}.{subnet}"
        self.here, there = f"{network}.{block + 1}", f"{network}.{block + 2}"
        _ip("netns", "add", self.namespace)
        try:
            _ip("link", "add", self.link, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", self.namespace)
            _ip("addr", "add", f"{self.here}/30", "dev", self.link)
            _ip("link", "set", self.link, "up")
            _ip("-n", self.namespace, "addr", "add", f"{there}/30", "dev", peer)
            _ip("-n", self.namespace, "link", "set", peer, "up")
            _ip("-n", self.namespace, "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise

    def python(self, code: str, *args: str) -> subprocess.Popen:
        """``python -c code args`` on the second host, with the project importable; lines on stdout."""
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        return subprocess.Popen(["ip", "netns", "exec", self.namespace, sys.executable, "-c", code, *args],
                                cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def cut(self) -> None:
        """Nothing crosses the cable from now on, either way, and nobody is told."""
        _ip("link", "set", self.link, "down")

    def mend(self) -> None:
        """The cable is back: what was sent before it was cut and not yet given up on goes through."""
        _ip("link", "set", self.link, "up")

    def remove(self) -> None:
        _ip("link", "del", self.link, check=False)
        _ip("netns", "del", self.namespace, check=False)
