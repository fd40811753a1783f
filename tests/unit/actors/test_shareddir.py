"""The shared-directory probe without Ray: nodes that share a disk pass (and leave no file behind), a node
with a disk of its own or one that cannot write is refused naming both nodes and the fix, URIs and a cluster
of one node are never probed, and a directory that passed is not probed again."""

from __future__ import annotations

import os

import pytest

from chiray.actors.jobs import shareddir
from chiray.actors.jobs.shareddir import UnsharedStorageError, check_shared_dir, probe

NODES = {"a1" * 14: "10.0.0.1", "b2" * 14: "10.0.0.2", "c3" * 14: "10.0.0.3"}


def disks(tmp_path, groups: dict[str, str]):
    """A runner that runs each function in-process as node ``n`` would: paths under the disk ``groups[n]``
    (nodes with one disk name share it), as separate machines see one absolute path."""
    calls = []

    def run_on(fn, args):
        calls.append(fn.__name__)
        out = {}
        for node, a in args.items():
            root = tmp_path / "disks" / groups[node]
            moved = tuple(str(root) + x if isinstance(x, str) and x.startswith("/") else x for x in a)
            try:
                out[node] = fn(*moved)
            except Exception as exc:
                out[node] = exc
        return out

    run_on.calls = calls
    return run_on


def files_under(path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.setattr(shareddir, "_passed", set())


def test_nodes_on_one_disk_share_it_and_the_probe_leaves_nothing(tmp_path):
    run_on = disks(tmp_path, {n: "one" for n in NODES})
    (tmp_path / "disks" / "one" / "chk").mkdir(parents=True)
    assert probe("/chk", list(NODES), run_on) == []
    assert run_on.calls == ["write_token", "read_token"]  # two rounds, no clean-up needed
    assert files_under(tmp_path / "disks") == []
    assert os.listdir(tmp_path / "disks" / "one" / "chk") == []  # its own directory went too


@pytest.mark.parametrize("groups", [{"a": "x", "b": "y", "c": "z"},  # each its own disk
                                    {"a": "x", "b": "x", "c": "y"},  # two share, one does not
                                    {"a": "y", "b": "x", "c": "x"}])
def test_a_node_with_a_disk_of_its_own_is_refused_naming_the_nodes_and_the_fix(tmp_path, groups):
    ids = sorted(NODES)
    run_on = disks(tmp_path, {node: groups[letter] for node, letter in zip(ids, "abc")})
    with pytest.raises(UnsharedStorageError) as info:
        check_shared_dir(str(tmp_path / "chk"), run_on, NODES)
    text = str(info.value)
    assert f"checkpoint_dir {str(tmp_path / 'chk')!r} is a local directory" in text
    assert "the 3 nodes of this Ray cluster do not share" in text and "no file there" in text
    assert "s3://" in text and "a mount that every node shares" in text
    named = text.split(": ", 1)[1].split(" wrote there")[0]  # "node R (...) could not read what node W (...)"
    assert len({address for address in NODES.values() if address in named}) == 2
    assert run_on.calls == ["write_token", "read_token", "remove_token"]
    assert files_under(tmp_path / "disks") == []  # the clean-up round removed what nobody read


def test_the_failures_are_the_ring_edges_that_cross_disks(tmp_path):
    ids = sorted(NODES)  # the ring: ids[0] reads ids[1]'s file, ids[1] reads ids[2]'s, ids[2] reads ids[0]'s
    run_on = disks(tmp_path, {ids[0]: "x", ids[1]: "x", ids[2]: "y"})
    failures = probe(str(tmp_path / "chk"), ids, run_on)
    assert {(f.writer, f.reader) for f in failures} == {(ids[2], ids[1]), (ids[0], ids[2])}


def test_a_node_that_cannot_write_is_refused(tmp_path):
    ids = sorted(NODES)
    shared = disks(tmp_path, {n: "one" for n in ids})

    def run_on(fn, args):
        out = dict(shared(fn, args))
        if fn.__name__ == "write_token":
            out[ids[1]] = PermissionError("read-only file system")
        return out

    failures = probe("/chk", ids, run_on)
    assert [(f.writer, f.reader) for f in failures] == [(ids[1], None)]
    assert "could not write there (PermissionError: read-only file system)" in failures[0].why
    with pytest.raises(UnsharedStorageError, match=rf"node {ids[1][:12]} \(10.0.0.2\) could not write there"):
        check_shared_dir("/chk", run_on, NODES)


def test_uris_and_one_node_are_not_probed_and_a_passed_directory_not_again(tmp_path):
    def never(fn, args):
        raise AssertionError("probed")

    check_shared_dir("s3://bucket/chk?endpoint_override=10.0.0.9:9000", never, NODES)
    check_shared_dir(str(tmp_path / "chk"), never, {"a1" * 14: "10.0.0.1"})
    run_on = disks(tmp_path, {n: "one" for n in [*NODES, "d4"]})
    check_shared_dir(f"file://{tmp_path}/chk", run_on, NODES)
    check_shared_dir(str(tmp_path / "chk"), never, NODES)  # the same directory and nodes: passed already
    check_shared_dir(str(tmp_path / "chk"), run_on, dict(NODES, d4="10.0.0.4"))  # a new node: probed again
    assert run_on.calls == ["write_token", "read_token"] * 2


def test_without_checkpoint_dir_the_temporary_directory_is_probed(tmp_path, monkeypatch):
    monkeypatch.setattr(shareddir.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    ids = sorted(NODES)
    run_on = disks(tmp_path, {ids[0]: "x", ids[1]: "y", ids[2]: "y"})
    with pytest.raises(UnsharedStorageError, match=r"without checkpoint_dir, checkpoints go to a temporary "
                                                   r"directory under '.*/tmp', which is local"):
        check_shared_dir(None, run_on, NODES)
