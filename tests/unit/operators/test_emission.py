"""An aggregation left to emit only at end of input, fed by a source that never ends: refused at submit (or
a warning where the source cannot tell)."""

from __future__ import annotations

import datetime
import warnings

import pyarrow as pa
import pytest

import chiray
from chiray.operators import Dataflow, bounded_out_of_orderness, from_items, generate
from chiray.operators.emission import FinalOnlyWarning, FinalOnUnboundedError
from chiray.operators.logic import Source, SourceSplit, SplitReader


class _Quiet(Source):
    """A custom source that does not say whether it ends."""

    def schema(self) -> pa.Schema:
        return pa.schema([("key", pa.string()), ("value", pa.int64())])

    def splits(self) -> list[SourceSplit]:
        return [SourceSplit("only", None)]

    def open_split(self, split: SourceSplit, offset=None) -> SplitReader:
        raise NotImplementedError


def _never_ends(flow: Dataflow):
    return flow.source(generate(None, rate=100, num_keys=4), name="events")


def test_submit_refuses_a_default_final_count_on_a_source_that_never_ends_naming_the_fix():
    flow = Dataflow("counts")
    _never_ends(flow).key_by("key").count(name="count").collect(name="out")
    with pytest.raises(FinalOnUnboundedError) as caught:
        chiray.submit(flow)  # refused before anything is deployed
    assert str(caught.value) == (
        "dataflow 'counts': operator 'count' emits only when its input ends (emit=\"final\", the default), but "
        "source 'events' (generate(uniform)) never ends, so it would emit nothing; pass emit=\"updates\" to "
        "'count' to emit each key's new value as its batches arrive (or emit=\"final\" to keep it so knowingly)")
    assert isinstance(caught.value, chiray.ChirayError) and isinstance(caught.value, ValueError)


@pytest.mark.parametrize("build", [
    lambda k: k.agg(name="totals", total=("value", "sum")),
    lambda k: k.sum("value", name="totals"),
    lambda k: k.reduce(lambda acc, row: acc, name="totals"),
], ids=["agg", "sum", "reduce"])
def test_every_final_only_aggregation_is_refused_below_a_map_and_watermarks(build):
    flow = Dataflow("aggs")
    src = flow.source(generate(None, rate=100, num_keys=4), name="events",
                      watermarks=bounded_out_of_orderness("ts", datetime.timedelta(seconds=1)))
    build(src.map(lambda b: b, name="same").key_by("key")).collect(name="out")
    with pytest.raises(FinalOnUnboundedError, match="operator 'totals' emits only when its input ends"):
        flow.validate()


@pytest.mark.parametrize("emit", ["updates", "final"])
def test_a_chosen_emit_is_left_alone(emit):
    flow = Dataflow("chosen")
    _never_ends(flow).key_by("key").count(name="count", emit=emit).collect(name="out")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flow.validate()


def test_a_source_that_ends_says_so_and_nothing_is_said():
    flow = Dataflow("ends")
    flow.source(from_items([{"key": "a"}]), name="items").key_by("key").count(name="count").collect(name="c1")
    flow.source(generate(10), name="ten").key_by("key").count(name="count2").collect(name="c2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flow.validate()


def test_a_source_that_cannot_tell_gets_a_warning_naming_the_fix():
    flow = Dataflow("quiet")
    flow.source(_Quiet(), name="mine").key_by("key").count(name="count").collect(name="out")
    with pytest.warns(FinalOnlyWarning, match=r"source 'mine' \(_Quiet\) may never end .* pass emit=\"updates\" to "
                                              r"'count'.*Source.bounded\(\) returning True"):
        flow.validate()


def test_a_top_per_key_without_idle_on_a_source_that_never_ends_is_refused_naming_idle():
    flow = Dataflow("best")
    _never_ends(flow).key_by("key").top(2, by="value", name="best").collect(name="out")
    with pytest.raises(FinalOnUnboundedError) as caught:
        flow.validate()
    assert str(caught.value) == (
        "dataflow 'best': operator 'best' emits only when its input ends, but source 'events' (generate(uniform)) "
        "never ends, so it would emit nothing; pass idle= and on= to 'best' (a duration and an event-time column) "
        "to emit each key's rows once it has been idle that long")


def test_a_top_per_key_with_idle_or_on_a_source_that_ends_is_accepted():
    idle = Dataflow("idle")
    src = idle.source(generate(None, rate=100, num_keys=4), name="events",
                      watermarks=bounded_out_of_orderness("ts", datetime.timedelta(seconds=1)))
    src.key_by("key").top(2, by="value", idle=datetime.timedelta(seconds=5), on="ts", name="best").collect()
    ends = Dataflow("ends")
    ends.source(from_items([{"key": "a", "value": 1}]), name="rows").key_by("key").top(
        1, by="value", name="best").collect()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        idle.validate()
        ends.validate()
