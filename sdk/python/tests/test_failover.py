"""Several endpoints against two real appliances: the session opens on the first node that
attests, stays there, and moves to the other node (attesting it again) when the first stops.

The two nodes are provisioned alike, as an operator provisions a fleet: the second starts from a
copy of the first one's data dir, so both have the same simulated hardware roots (one policy
admits both) and the same tenant token. Each keeps its own model store."""
from __future__ import annotations

import shutil
import socket

import numpy as np
import pytest

import cloister
from conftest import CLS, Appliance, model_path, reference_sets

OUTPUT = "softmax_0.tmp_0"


def _two_nodes(work_dir, name: str):
    """Two appliances provisioned alike (the second from a copy of the first's data dir)."""
    first = Appliance(work_dir / f"{name}-a")
    first.work.mkdir()
    first.start()
    second = Appliance(work_dir / f"{name}-b")
    second.work.mkdir()
    shutil.copytree(first.data_dir, second.data_dir, ignore=shutil.ignore_patterns("models"))
    second.start()
    yield first, second
    first.stop()
    second.stop()


@pytest.fixture(scope="module")
def nodes(work_dir):
    yield from _two_nodes(work_dir, "failover")


def _closed_address() -> str:
    """A loopback port where nothing listens: one the kernel just handed out, closed again."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def _connect(server: str, node: Appliance, key):
    return cloister.connect(server, policy=node.policy, tenant="demo", token=node.token, key=key)


def _check_cls(client, name: str) -> None:
    inputs, expected = reference_sets(CLS)[0]
    np.testing.assert_allclose(client.infer(name, inputs)[OUTPUT], expected[OUTPUT],
                               rtol=1e-3, atol=1e-3)


def test_a_bad_server_list_is_invalid_argument(nodes, key):
    first, _ = nodes
    with pytest.raises(cloister.InvalidArgument, match="empty entry"):
        _connect(f"{first.address},,{first.address}", first, key)
    with pytest.raises(cloister.InvalidArgument, match="listed twice"):
        _connect(f"{first.address},{first.address}", first, key)


def test_connects_to_the_second_node_when_the_first_is_down(nodes, key):
    first, second = nodes
    with _connect(f"{_closed_address()},{second.address}", first, key) as client:
        assert client.verdict.passed
        client.upload_model(model_path(CLS), "failover-down")
        _check_cls(client, "failover-down")
    # The model went to the second node only.
    with _connect(first.address, first, key) as on_first:
        assert "failover-down" not in {m.name for m in on_first.models()}
    with _connect(second.address, first, key) as on_second:
        assert "failover-down" in {m.name for m in on_second.models()}


def test_moves_to_the_other_node_when_its_node_stops(nodes, key):
    first, second = nodes
    # Models are per node: upload to each node the client may use.
    with _connect(second.address, first, key) as on_second:
        on_second.upload_model(model_path(CLS), "failover-cls")
    with _connect(f"{first.address},{second.address}", first, key) as client:
        client.upload_model(model_path(CLS), "failover-cls")
        client.upload_model(model_path(CLS), "failover-only-first")
        for _ in range(3):
            _check_cls(client, "failover-cls")
        first_session = client.session_id
        first.stop()  # the node holding the session goes away
        _check_cls(client, "failover-cls")  # attests the second node and carries on there
        assert client.session_id != first_session
        assert client.verdict.passed
        with pytest.raises(cloister.NotFound, match="each node keeps its own models"):
            client.infer("failover-only-first", reference_sets(CLS)[0][0])


@pytest.fixture(scope="module")
def spread_nodes(work_dir):
    """Two more nodes, both up (the tests above stop the first of theirs)."""
    yield from _two_nodes(work_dir, "spread")


def test_spread_starts_each_key_on_the_node_it_picks(spread_nodes, work_dir, monkeypatch):
    """spread=True: the start is the SHA-256 of the key's public key, first 8 bytes big-endian,
    modulo the number of nodes (computed here independently); the upload lands there."""
    import hashlib

    listed = list(spread_nodes)
    server = ",".join(node.address for node in listed)
    keys = {}
    for i in range(64):
        path = work_dir / f"spread-{i}.key"
        public = cloister.generate_key(path)
        start = int.from_bytes(hashlib.sha256(bytes.fromhex(public)).digest()[:8], "big") % 2
        keys.setdefault(start, path)
        if len(keys) == 2:
            break
    assert len(keys) == 2, "64 keys should pick both nodes"
    for start, key in keys.items():
        name = f"spread-{start}"
        with cloister.connect(server, policy=listed[0].policy, tenant="demo",
                              token=listed[0].token, key=key, spread=True) as client:
            client.upload_model(model_path(CLS), name)
            _check_cls(client, name)
        for index, node in enumerate(listed):
            with _connect(node.address, node, key) as on_node:
                held = name in {m.name for m in on_node.models()}
            assert held == (index == start), f"{name} on node {index}: {held}"
    # The environment variable, as the CLI reads it: a bad value is refused before connecting.
    monkeypatch.setenv("CLOISTER_SPREAD", "often")
    with pytest.raises(cloister.InvalidArgument, match="CLOISTER_SPREAD must be 1, true, 0 or false"):
        cloister.connect(server, policy=listed[0].policy, tenant="demo", token=listed[0].token,
                         key=keys[0])
