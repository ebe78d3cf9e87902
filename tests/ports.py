"""A TCP port for the tests' two-process rendezvous (``MASTER_PORT``).

Asking the kernel for a free port (bind to port 0, close, hand the number on) races with every
other socket the machine opens before the rendezvous binds it: gloo's pair connections and the
other pytest-xdist worker's processes get their ports from the same ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default). A port *below* that range
is never handed out by the kernel, so only another test choosing the same number could take it;
each xdist worker draws from its own band of 1,000 ports, so two workers never choose the same.
"""

from __future__ import annotations

import os
import random
import socket

#: first port of the bands; well below Linux's default ephemeral range
FIRST_PORT = 20000
BAND = 1000


def _worker_index() -> int:
    """0 for ``gw0`` (and without xdist), 1 for ``gw1``, ..."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker[2:].isdigit() else 0


def free_port() -> int:
    """A port in this worker's band that nothing listens on now.

    Raises:
        RuntimeError: if 100 random ports of the band are all in use.
    """
    start = FIRST_PORT + BAND * (_worker_index() % 10)
    rng = random.Random()
    for _ in range(100):
        port = rng.randrange(start, start + BAND)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(
        f"no free port in {start}-{start + BAND - 1}; is another test suite running?"
    )
