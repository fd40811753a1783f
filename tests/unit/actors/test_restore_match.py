"""Matching a checkpoint's state to a dataflow's operators by identity (uid, else name) and kind."""

from __future__ import annotations

import pytest

from chiray.actors.runtime.restore import RestoreInfo, match_operators
from chiray.control.ops.checkpoint import encode_offsets
from chiray.operators import Dataflow, collect, from_items


def manifest(operators: dict[str, dict], state: list[str], sources: dict[str, dict]) -> dict:
    return {"job": {"operators": operators},
            "state_files": {f"{op}/0": f"chk-000001/state-{op}-0.arrow" for op in state},
            "state_bins": {f"{op}/0": [0] for op in state},
            "sources": {f"{op}/0": encode_offsets(offsets) for op, offsets in sources.items()}, "sinks": {}}


SAVED = manifest({"src": {"kind": "source", "uid": "src"}, "count": {"kind": "keyed", "uid": "count"},
                  "out": {"kind": "sink", "uid": "out"}}, ["count"], {"src": {"items-0": 3}})


def flow(count_name: str = "count", uid: str | None = None, source_name: str = "src") -> Dataflow:
    f = Dataflow("f")
    s = f.source(from_items([{"k": "a"}]), name=source_name).key_by("k").count(name=count_name)
    (s.uid(uid) if uid else s).sink(collect(), name="out")
    return f


def test_same_names_match():
    renames, orphans, empty = match_operators(SAVED, flow().graph.nodes)
    assert renames == {"src": "src", "count": "count", "out": "out"} and orphans == {} and empty == []


def test_a_rename_orphans_the_state_and_leaves_the_new_operator_empty():
    renames, orphans, empty = match_operators(SAVED, flow("count_v2").graph.nodes)
    assert renames["count_v2"] is None and orphans == {"count": "keyed state"} and empty == ["count_v2"]


def test_a_uid_carries_the_state_across_a_rename():
    renames, orphans, empty = match_operators(SAVED, flow("count_v2", uid="count").graph.nodes)
    assert renames["count_v2"] == "count" and orphans == {} and empty == []


def test_source_offsets_need_a_home_too():
    renames, orphans, _ = match_operators(SAVED, flow(source_name="events").graph.nodes)
    assert orphans == {"src": "source offsets"}


def test_the_kind_must_match():
    f = Dataflow("f")
    f.source(from_items([{"k": "a"}]), name="src").map(lambda b: b, name="count").sink(collect(), name="out")
    renames, orphans, _ = match_operators(SAVED, f.graph.nodes)
    assert renames["count"] is None and orphans == {"count": "keyed state"}


def test_old_manifests_without_uids_match_by_name():
    old = manifest({"src": {"kind": "source"}, "count": {"kind": "keyed"}}, ["count"], {"src": {"x": 1}})
    renames, orphans, _ = match_operators(old, flow().graph.nodes)
    assert renames["count"] == "count" and orphans == {}


def test_restore_info_reads_through_the_renames(tmp_path):
    info = RestoreInfo(None, SAVED, {"count_v2": "count", "src2": None})  # type: ignore[arg-type]
    assert info._saved("count_v2") == "count" and info._saved("src2") is None
    assert info.source_offsets("src2") == {}
    assert RestoreInfo(None, SAVED).source_offsets("src") == {"items-0": 3}  # type: ignore[arg-type]


def test_uids_are_checked():
    f = flow()
    with pytest.raises(ValueError, match="non-empty"):
        f.source(from_items([{"k": 1}]), name="s2").uid("")
    with pytest.raises(ValueError, match="already the identity of operator 'count'"):
        f.source(from_items([{"k": 1}]), name="s3").uid("count")
    g = Dataflow("g")
    g.source(from_items([{"k": 1}]), name="a").uid("b").sink(collect(), name="z")
    g.source(from_items([{"k": 1}]), name="b").sink(collect(), name="y")
    with pytest.raises(ValueError, match="share the identity 'b'"):
        g.validate()
