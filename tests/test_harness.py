"""The harness the process tests stand on: what makes a test fail for a reason of its own, not the product's."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.processes import free_port


def test_servers_listen_on_ports_no_outgoing_connection_can_take():
    """A full run once failed a failure-window test with "Address already in use": its web was given a port from
    the kernel's ephemeral range (by binding port 0), which an outgoing connection then held."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = {free_port() for _ in range(50)}
    assert not any(low <= port <= high for port in ports), sorted(ports)[:5]
    assert len(ports) == 50  # never the same one twice: two servers of one test may ask before either listens
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports.pop()))  # and free
