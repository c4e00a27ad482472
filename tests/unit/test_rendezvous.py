"""Where a bundled runner's rendezvous listens (issue 33.7): exactly MASTER_ADDR, never every address.

The real 2-rank DeepSpeed run (its sockets sampled while it runs) is
tests/e2e/test_argv_secrets.py::test_one_node_rendezvous_listens_on_loopback_only.
"""

from __future__ import annotations

import socket
import sys

import pytest
from helpers import REPO

sys.path.insert(0, str(REPO / "runners"))
import process_group  # noqa: E402

from dstui.execute.launch import free_port  # noqa: E402


def test_the_store_socket_is_bound_to_the_master_address_only() -> None:
    sock = process_group.listen_on("127.0.0.1", free_port())
    assert sock is not None
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
    finally:
        sock.close()


def test_an_address_of_another_host_is_not_bound_and_a_taken_port_is_an_error() -> None:
    assert process_group.listen_on("192.0.2.1", free_port()) is None  # TEST-NET-1: no host has it
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(OSError):
            process_group.listen_on("127.0.0.1", taken.getsockname()[1])


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WORLD_SIZE": "2", "LOCAL_SIZE": "2", "CROSS_SIZE": "1"}, True),  # dstui.execute.injob.ranks, DeepSpeed's launch
        ({"WORLD_SIZE": "16", "LOCAL_SIZE": "8", "CROSS_SIZE": "2"}, False),  # two nodes
        ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}, True),  # torchrun's name
        ({"WORLD_SIZE": "4"}, False),  # unknown: not assumed local
    ],
)
def test_one_node_is_what_the_launcher_says(env: dict[str, str], expected: bool) -> None:
    assert process_group.one_node(env) is expected
    assert process_group.is_loopback("127.0.0.1") and process_group.is_loopback("localhost") and not process_group.is_loopback("192.0.2.1")
