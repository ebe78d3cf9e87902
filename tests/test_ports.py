"""tests/ports.py: each xdist worker's rendezvous port lies in its own band, below the kernel's
ephemeral range, and is free when handed out."""

from __future__ import annotations

import socket

import pytest

from tests import ports


@pytest.mark.parametrize("worker, start", [("gw0", 20000), ("gw1", 21000), (None, 20000)])
def test_each_worker_draws_from_its_own_band(monkeypatch, worker, start):
    if worker is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    for _ in range(20):
        port = ports.free_port()
        assert start <= port < start + ports.BAND
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free when handed out


def test_the_bands_lie_below_the_ephemeral_range():
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    assert ports.FIRST_PORT + 10 * ports.BAND <= low


def test_a_full_band_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setattr(ports.socket.socket, "bind", _refuse)
    with pytest.raises(RuntimeError, match="no free port in 23000-23999"):
        ports.free_port()


def _refuse(self, address):
    raise OSError(98, "Address already in use")
