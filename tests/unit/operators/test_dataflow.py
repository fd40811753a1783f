"""Tests for operators.dataflow: build-time validation messages and the output schemas it promises.

Every misuse is caught while the graph is built (or by ``validate()``,
before any Ray use), with a message that names the operator and says what
was expected and what was got.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from chiray.operators import Dataflow, KeyedStream, Stream, collect, from_items, to_parquet
from chiray.operators.graph import OperatorKind
from chiray.operators.keyed import AggSpec, aggregate_output_schema

SCHEMA = pa.schema([
    ("k", pa.string()),
    ("v", pa.int64()),
    ("i32", pa.int32()),
    ("f", pa.float64()),
    ("b", pa.bool_()),
    ("s", pa.string()),
    ("t", pa.timestamp("us")),
])
ROWS = [{"k": "a", "v": 1, "i32": 2, "f": 0.5, "b": True, "s": "x", "t": None}]


def _flow(name: str = "flow") -> tuple[Dataflow, Stream]:
    flow = Dataflow(name)
    return flow, flow.source(from_items(ROWS, schema=SCHEMA), name="src")


def _keyed() -> tuple[Dataflow, KeyedStream]:
    flow, src = _flow()
    return flow, src.key_by("k")


def _identity(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


# --------------------------------------------------------------------------- unknown columns


def test_key_by_unknown_column_names_operator_column_and_available_columns():
    _, src = _flow()
    with pytest.raises(ValueError) as info:
        src.key_by("nope")
    message = str(info.value)
    assert "'src'" in message
    assert "'nope'" in message
    assert str(SCHEMA.names) in message


def test_key_by_after_filter_still_checks_columns():
    _, src = _flow()
    filtered = src.filter(lambda b: [True] * b.num_rows, name="keep")
    with pytest.raises(ValueError, match=r"'keep'.*'nope'.*\['k', 'v'"):
        filtered.key_by("nope")


@pytest.mark.parametrize("verb", ["sum", "min", "max", "mean"])
def test_single_aggregate_on_unknown_column_names_operator_and_columns(verb):
    _, keyed = _keyed()
    with pytest.raises(ValueError) as info:
        getattr(keyed, verb)("missing", name="my-agg")
    message = str(info.value)
    assert "'my-agg'" in message
    assert "'missing'" in message
    assert str(SCHEMA.names) in message


def test_single_aggregate_default_name_appears_in_unknown_column_message():
    _, keyed = _keyed()
    with pytest.raises(ValueError, match=r"operator 'sum-\d+': unknown column 'missing'"):
        keyed.sum("missing")


def test_agg_unknown_column_names_operator_aggregate_column_and_available_columns():
    _, keyed = _keyed()
    with pytest.raises(ValueError) as info:
        keyed.agg(name="stats", n=(None, "count"), total=("zz", "sum"))
    message = str(info.value)
    assert "'stats'" in message and "'zz'" in message
    assert str(SCHEMA.names) in message


def test_agg_column_check_after_map_with_declared_schema():
    _, src = _flow()
    narrowed = src.map(lambda b: b.select(["k", "v"]), name="narrow",
                       schema=pa.schema([("k", pa.string()), ("v", pa.int64())]))
    with pytest.raises(ValueError, match=r"'f'.*\['k', 'v'\]"):
        narrowed.key_by("k").sum("f")


# --------------------------------------------------------------------------- parallelism


def _bad_parallelism(operator: str, bad: object) -> str:
    """The message (a regex) for a bad parallelism: the operator, what is expected, what was got."""
    return rf"operator '{operator}': parallelism must be a positive integer, got {re.escape(repr(bad))}"

@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_source_parallelism_must_be_positive_int(bad):
    flow = Dataflow("flow")
    with pytest.raises(ValueError) as info:
        flow.source(from_items(ROWS, schema=SCHEMA), parallelism=bad, name="src")
    message = str(info.value)
    assert "'src'" in message
    assert "positive integer" in message
    assert f"got {bad!r}" in message
    assert "src" not in flow.graph.nodes  # nothing half-added


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
@pytest.mark.parametrize("verb", ["map", "filter", "flat_map", "map_records", "filter_records",
                                  "flat_map_records"])
def test_transform_parallelism_must_be_positive_int(verb, bad):
    _, src = _flow()
    with pytest.raises(ValueError, match=_bad_parallelism("op", bad)):
        getattr(src, verb)(_identity, name="op", parallelism=bad)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
@pytest.mark.parametrize("make", [
    lambda ks, p: ks.count(name="op", parallelism=p),
    lambda ks, p: ks.sum("v", name="op", parallelism=p),
    lambda ks, p: ks.agg(name="op", parallelism=p, n=(None, "count")),
    lambda ks, p: ks.reduce(lambda a, r: a, name="op", parallelism=p),
    lambda ks, p: ks.process(lambda k, rows, st: None, name="op", parallelism=p),
], ids=["count", "sum", "agg", "reduce", "process"])
def test_keyed_parallelism_must_be_positive_int(make, bad):
    flow, keyed = _keyed()
    with pytest.raises(ValueError, match=_bad_parallelism("op", bad)):
        make(keyed, bad)
    assert "op" not in flow.graph.nodes


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_sink_parallelism_must_be_positive_int(bad):
    _, src = _flow()
    with pytest.raises(ValueError, match=_bad_parallelism("out", bad)):
        src.sink(collect(), name="out", parallelism=bad)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_union_parallelism_must_be_positive_int(bad):
    _, src = _flow()
    other = src.filter(_identity, name="other")
    with pytest.raises(ValueError, match=_bad_parallelism("u", bad)):
        src.union(other, name="u", parallelism=bad)


def test_union_parallelism_zero_is_rejected():
    _, src = _flow()
    other = src.filter(_identity, name="other")
    with pytest.raises(ValueError, match=r"operator 'u': parallelism must be a positive integer, got 0"):
        src.union(other, name="u", parallelism=0)


def test_parallelism_is_inherited_from_upstream():
    flow = Dataflow("flow")
    src = flow.source(from_items(ROWS, schema=SCHEMA), parallelism=3)
    mapped = src.map(_identity)
    counted = mapped.key_by("k").count()
    out = counted.sink(collect())
    assert [s.node.parallelism for s in (mapped, counted, out)] == [3, 3, 3]
    assert src.collect().node.parallelism == 1  # collect() is one instance


# --------------------------------------------------------------------------- key column, names


@pytest.mark.parametrize("bad", ["", None, 3])
def test_key_by_needs_a_column_name(bad):
    _, src = _flow()
    with pytest.raises(ValueError) as info:
        src.key_by(bad)
    message = str(info.value)
    assert "'src'" in message
    assert "expected a column name" in message
    assert f"got {bad!r}" in message


def test_key_by_num_bins_must_be_a_power_of_two():
    _, src = _flow()
    with pytest.raises(ValueError, match=r"power of two.*got 3"):
        src.key_by("k", num_bins=3)
    assert src.key_by("k", num_bins=4).num_bins == 4


def test_duplicate_operator_name_names_it_and_the_flow():
    flow, src = _flow("jobname")
    src.map(_identity, name="twice")
    with pytest.raises(ValueError) as info:
        src.filter(_identity, name="twice")
    message = str(info.value)
    assert "'twice'" in message and "'jobname'" in message and "unique" in message
    assert flow.graph.nodes["twice"].origin.startswith("_identity")


def test_duplicate_name_against_a_default_name():
    _, src = _flow()
    first = src.map(_identity)
    with pytest.raises(ValueError, match=re.escape(repr(first.name))):
        src.map(_identity, name=first.name)


@pytest.mark.parametrize("bad", ["", 5])
def test_explicit_name_must_be_a_non_empty_string(bad):
    _, src = _flow()
    expected = rf"map\(\): operator name must be a non-empty string, got {re.escape(repr(bad))}"
    with pytest.raises(ValueError, match=expected):
        src.map(_identity, name=bad)


def test_dataflow_name_must_be_a_non_empty_string():
    with pytest.raises(ValueError, match="got ''"):
        Dataflow("")


UNSAFE = [("kafka/clicks", "holds '/' (a path separator)"), ("out\\x", "holds '\\\\' (a path separator)"),
          ("tab\tname", "holds '\\t' (a control character)"), (".hidden", "starts with '.'")]


@pytest.mark.parametrize("bad, why", UNSAFE)
def test_names_that_would_split_a_path_are_refused_where_they_are_given(bad, why):
    """A name is part of file and checkpoint paths (the manifest joins names with '/'): a source named
    ``kafka/clicks`` would be read back as operator ``kafka`` and re-read its input after a recovery."""
    def refused(what: str):
        return pytest.raises(ValueError, match=re.escape(f"{what} name {bad!r} {why}"))

    with refused("Dataflow: job"):
        Dataflow(bad)
    flow = Dataflow("names")
    with refused("source(): operator"):
        flow.source(from_items([{"key": "a"}]), name=bad)
    src = flow.source(from_items([{"key": "a"}]), name="src")
    with refused("map(): operator"):
        src.map(_identity, name=bad)
    counted = src.key_by("key").count(name="count")
    with refused("operator 'count': uid"):
        counted.uid(bad)
    with refused("sink(): operator"):
        counted.sink(to_parquet("/nonexistent-never-written"), name=bad)
    with refused("collect(): operator"):
        counted.collect(name=bad)


def test_safe_names_pass_unchanged():
    flow = Dataflow("clicks per user: v2")  # spaces, colons and non-ASCII letters are fine in file names
    stream = flow.source(from_items([{"key": "a"}]), name="kafka.clicks-été")
    assert stream.name == "kafka.clicks-été" and flow.name == "clicks per user: v2"


def test_default_names_are_unique_and_skip_taken_names():
    flow = Dataflow("flow")
    src = flow.source(from_items(ROWS, schema=SCHEMA))
    src.map(_identity, name="map-2")  # takes the name the counter would give next
    streams = [src.map(_identity), src.filter(_identity), src.flat_map(_identity),
               src.map_records(dict), src.filter_records(bool)]
    keyed = src.key_by("k")
    streams += [keyed.count(), keyed.sum("v"), keyed.min("v"), keyed.max("v"), keyed.mean("v"),
                keyed.agg(n=(None, "count")), keyed.reduce(lambda a, r: a),
                keyed.process(lambda k, r, s: None)]
    streams.append(streams[0].union(streams[1]))
    streams += [s.sink(collect()) for s in streams]
    names = [s.name for s in streams] + [src.name, "map-2"]
    assert len(set(names)) == len(names)
    assert set(names) == set(flow.graph.nodes)
    assert "map-2" not in [s.name for s in streams]


# --------------------------------------------------------------------------- validate()


def test_validate_rejects_an_unconsumed_stream_naming_it():
    flow, src = _flow("jobname")
    src.collect(name="out")
    src.map(_identity, name="dangling")
    with pytest.raises(ValueError) as info:
        flow.validate()
    message = str(info.value)
    assert "'dangling'" in message and "'jobname'" in message
    assert "not consumed" in message
    assert "_identity" in message  # the user function


def test_validate_rejects_an_unconsumed_keyed_stream():
    flow, src = _flow()
    src.collect(name="out")
    src.key_by("k").count(name="lonely")
    with pytest.raises(ValueError, match=r"'lonely'.*not consumed"):
        flow.validate()


def test_validate_rejects_no_source():
    with pytest.raises(ValueError, match=r"dataflow 'empty' has no source"):
        Dataflow("empty").validate()


def test_validate_rejects_no_sink():
    flow, src = _flow("jobname")
    src.map(_identity)
    with pytest.raises(ValueError, match=r"dataflow 'jobname' has no sink"):
        flow.validate()


def test_validate_accepts_a_complete_flow():
    flow, src = _flow()
    src.key_by("k").count().collect()
    src.collect()
    flow.validate()


def test_submit_raises_before_any_ray_use(monkeypatch):
    ray = pytest.importorskip("ray")

    def no_ray(*args, **kwargs):
        raise AssertionError("submit() used Ray before validating the flow")

    monkeypatch.setattr(ray, "init", no_ray)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    flow, src = _flow()
    src.collect()
    src.map(_identity, name="dangling")
    with pytest.raises(ValueError, match="'dangling'.*not consumed"):
        flow.submit()


# --------------------------------------------------------------------------- wrong types


@pytest.mark.parametrize("bad", [123, "file.parquet", [{"x": 1}], collect()])
def test_source_needs_a_source_object(bad):
    flow = Dataflow("flow")
    with pytest.raises(TypeError) as info:
        flow.source(bad)
    message = str(info.value)
    assert "source()" in message and "expected a Source" in message
    assert f"got {type(bad).__name__}" in message


@pytest.mark.parametrize("bad", [123, "out.parquet", print, from_items(ROWS)])
def test_sink_needs_a_sink_object(bad):
    _, src = _flow()
    with pytest.raises(TypeError) as info:
        src.sink(bad)
    message = str(info.value)
    assert "sink()" in message and "expected a Sink" in message
    assert f"got {type(bad).__name__}" in message


@pytest.mark.parametrize("verb", ["map", "filter", "flat_map", "map_records", "filter_records",
                                  "flat_map_records"])
@pytest.mark.parametrize("bad", [5, "upper", None])
def test_transforms_need_a_function(verb, bad):
    _, src = _flow()
    with pytest.raises(TypeError, match=rf"{verb}\(\): expected a function, got {type(bad).__name__}"):
        getattr(src, verb)(bad)


@pytest.mark.parametrize("verb", ["map", "filter", "flat_map"])
def test_params_must_be_a_dict(verb):
    _, src = _flow()
    with pytest.raises(TypeError, match=rf"{verb}\(\): params must be a dict, got list"):
        getattr(src, verb)(_identity, params=[1, 2])


@pytest.mark.parametrize("verb", ["reduce", "process"])
def test_keyed_functions_need_a_function(verb):
    _, keyed = _keyed()
    with pytest.raises(TypeError, match=rf"{verb}\(\): expected a function, got int"):
        getattr(keyed, verb)(7)


def test_transform_type_error_names_an_operator():
    _, src = _flow()
    with pytest.raises(TypeError) as info:
        src.map(5, name="double")
    assert "'double'" in str(info.value) or "'src'" in str(info.value)


def test_sink_type_error_names_an_operator():
    _, src = _flow()
    with pytest.raises(TypeError) as info:
        src.sink("out.parquet", name="out")
    assert "'out'" in str(info.value) or "'src'" in str(info.value)


# --------------------------------------------------------------------------- agg() arguments


@pytest.mark.parametrize("bad", ["bad", "FINAL", ""])  # None is the default ("final")
@pytest.mark.parametrize("verb", ["count", "sum", "agg"])
def test_emit_must_be_final_or_updates(verb, bad):
    _, keyed = _keyed()
    with pytest.raises(ValueError) as info:
        if verb == "count":
            keyed.count(name="op", emit=bad)
        elif verb == "sum":
            keyed.sum("v", name="op", emit=bad)
        else:
            keyed.agg(name="op", emit=bad, n=(None, "count"))
    message = str(info.value)
    assert "'op'" in message and "'final' or 'updates'" in message and f"got {bad!r}" in message


def test_agg_needs_an_aggregate():
    _, keyed = _keyed()
    with pytest.raises(ValueError, match=r"operator 'stats': agg\(\) needs at least one aggregate"):
        keyed.agg(name="stats")


@pytest.mark.parametrize("spec", ["count", ("v",), ("v", "arg_max", "s", "extra"), ["v", "sum"]])
def test_agg_spec_must_be_a_column_func_pair(spec):
    _, keyed = _keyed()
    with pytest.raises(TypeError) as info:
        keyed.agg(name="stats", total=spec)
    message = str(info.value)
    assert "'stats'" in message and "'total'" in message
    assert "(column, func)" in message and f"got {spec!r}" in message


def test_agg_third_item_is_only_for_arg_min_and_arg_max_and_must_be_a_column():
    _, keyed = _keyed()
    with pytest.raises(ValueError, match=r"operator 'stats'.*'total'.*only arg_min and arg_max take a third item"):
        keyed.agg(name="stats", total=("v", "sum", "s"))
    with pytest.raises(ValueError, match=r"operator 'stats': unknown column 'extra'"):
        keyed.agg(name="stats", top=("v", "arg_max", "extra"))
    out = keyed.agg(name="stats", top=("v", "arg_max", "s"), row=("v", "arg_min"), seen=("s", "count_distinct"))
    assert out.schema.field("top").type == pa.string() and out.schema.field("seen").type == pa.int64()
    assert out.schema.field("row").type.num_fields == 7


def test_agg_unknown_function_names_the_operator():
    _, keyed = _keyed()
    with pytest.raises(ValueError) as info:
        keyed.agg(name="stats", mid=("v", "median"))
    message = str(info.value)
    assert "'median'" in message  # holds today
    assert "'stats'" in message


def test_agg_function_without_column_names_the_operator():
    _, keyed = _keyed()
    with pytest.raises(ValueError) as info:
        keyed.agg(name="stats", total=(None, "sum"))
    message = str(info.value)
    assert "needs a column" in message  # holds today
    assert "'stats'" in message


def test_agg_output_name_equal_to_key_is_rejected():
    _, keyed = _keyed()
    with pytest.raises(ValueError, match=r"operator 'stats':.*'k' is used twice"):
        keyed.agg(name="stats", k=("v", "sum"))


@pytest.mark.parametrize("verb", ["sum", "mean", "min", "max"])
@pytest.mark.parametrize("column", ["s", "k"])
def test_aggregates_reject_string_columns(verb, column):
    _, keyed = _keyed()
    with pytest.raises(TypeError) as info:
        getattr(keyed, verb)(column, name="op")
    message = str(info.value)
    assert "'op'" in message and f"column {column!r} has type string" in message


@pytest.mark.parametrize("verb", ["sum", "mean"])
@pytest.mark.parametrize("column", ["b", "t"])
def test_sum_and_mean_reject_boolean_and_temporal_columns(verb, column):
    _, keyed = _keyed()
    expected = rf"'op'.*{verb} needs an integer, floating or decimal column.*{column!r} has type"
    with pytest.raises(TypeError, match=expected):
        getattr(keyed, verb)(column, name="op")


# --------------------------------------------------------------------------- union


def test_union_of_different_schemas_names_both_streams_and_schemas():
    flow = Dataflow("flow")
    a = flow.source(from_items([{"x": 1}]), name="a")
    b = flow.source(from_items([{"x": "one"}]), name="b")
    with pytest.raises(ValueError) as info:
        a.union(b)
    message = str(info.value)
    assert "'a'" in message and "'b'" in message
    assert "x: int64" in message and "x: string" in message


def test_union_mismatch_message_names_the_stream_whose_schema_it_quotes():
    flow = Dataflow("flow")
    src = flow.source(from_items([{"x": 1}]), name="src")
    unknown = src.map(_identity, name="unknown")  # schema not declared
    a = flow.source(from_items([{"x": 1}]), name="a")
    b = flow.source(from_items([{"x": "one"}]), name="b")
    with pytest.raises(ValueError) as info:
        unknown.union(a, b)
    message = str(info.value)
    assert "'b'" in message
    assert "'a' has" in message  # the stream whose schema (x: int64) the message quotes


def test_union_with_unknown_schema_is_accepted_and_takes_the_known_one():
    flow, src = _flow()
    unknown = src.map(_identity)
    merged = unknown.union(src)
    assert merged.schema.equals(SCHEMA)
    assert [e.upstream for e in merged.node.inputs] == [unknown.name, "src"]


@pytest.mark.parametrize("bad", [5, "src"])
def test_union_needs_streams(bad):
    _, src = _flow()
    with pytest.raises(TypeError, match=r"union\(\): expected streams of the same Dataflow"):
        src.union(bad)


def test_union_needs_streams_of_the_same_dataflow():
    _, src = _flow()
    _, other = _flow("other")
    with pytest.raises(TypeError, match="same Dataflow"):
        src.union(other)


def test_union_type_error_says_what_it_got():
    _, src = _flow()
    with pytest.raises(TypeError, match="got int"):
        src.union(5)


# --------------------------------------------------------------------------- output schemas


SINGLE_AGGREGATES = [  # (method, column, promised output type)
    ("count", None, pa.int64()),
    ("sum", "i32", pa.int64()),
    ("sum", "v", pa.int64()),
    ("sum", "f", pa.float64()),
    ("min", "i32", pa.int32()),
    ("max", "f", pa.float64()),
    ("min", "b", pa.bool_()),
    ("max", "t", pa.timestamp("us")),
    ("mean", "v", pa.float64()),
    ("mean", "f", pa.float64()),
]


@pytest.mark.parametrize("key", ["k", "v"])
@pytest.mark.parametrize("func,column,value_type", SINGLE_AGGREGATES)
def test_single_aggregate_output_schemas(key, func, column, value_type):
    _, src = _flow()
    keyed = src.key_by(key)
    stream = keyed.count() if func == "count" else getattr(keyed, func)(column)
    assert stream.schema.names == [key, func]
    assert stream.schema.field(0).equals(pa.field(key, SCHEMA.field(key).type))
    assert stream.schema.field(1).type == value_type
    promised = aggregate_output_schema(SCHEMA, key, [AggSpec(func, func, column)])
    assert stream.schema.equals(promised)


def test_agg_output_schema_is_key_then_aggregates_in_order():
    _, keyed = _keyed()
    stream = keyed.agg(rows=(None, "count"), nn=("f", "count"), total=("v", "sum"),
                       lo=("i32", "min"), hi=("t", "max"), avg=("f", "mean"))
    assert stream.schema.names == ["k", "rows", "nn", "total", "lo", "hi", "avg"]
    assert stream.schema.types == [pa.string(), pa.int64(), pa.int64(), pa.int64(), pa.int32(),
                                   pa.timestamp("us"), pa.float64()]
    specs = [AggSpec("rows", "count"), AggSpec("nn", "count", "f"), AggSpec("total", "sum", "v"),
             AggSpec("lo", "min", "i32"), AggSpec("hi", "max", "t"), AggSpec("avg", "mean", "f")]
    assert stream.schema.equals(aggregate_output_schema(SCHEMA, "k", specs))
    assert stream.node.kind is OperatorKind.KEYED and stream.node.key == "k"


def test_stateless_schemas():
    _, src = _flow()
    declared = pa.schema([("k", pa.string())])
    assert src.filter(_identity).schema.equals(SCHEMA)
    assert src.filter_records(bool).schema.equals(SCHEMA)
    assert src.map(_identity).schema is None
    assert src.map(_identity, schema=declared).schema.equals(declared)
    assert src.key_by("k").reduce(lambda a, r: a).schema.equals(SCHEMA)
    assert src.key_by("k").process(lambda k, r, s: None).schema is None
    assert src.sink(collect()).schema.equals(SCHEMA)


def test_key_by_after_map_without_schema_is_accepted():
    flow, src = _flow()
    mapped = src.map(lambda b: b.append_column("new", pa.array([1] * b.num_rows)), name="add")
    assert mapped.schema is None
    keyed = mapped.key_by("new")
    assert keyed.key == "new"
    counted = keyed.count(name="per-new")
    total = mapped.key_by("anything").agg(name="any", s=("whatever", "sum"))
    assert counted.schema is None and total.schema is None  # unknown until run time
    counted.collect()
    total.collect()
    flow.validate()


def test_keyed_node_carries_key_bins_and_hash_edge():
    flow = Dataflow("flow", num_bins=64)
    src = flow.source(from_items(ROWS, schema=SCHEMA), name="src")
    counted = src.key_by("k").count(name="c")
    small = src.key_by("k", num_bins=8).count(name="d")
    (edge,) = counted.node.inputs
    assert (edge.upstream, edge.partition.value, edge.key, edge.num_bins) == ("src", "hash", "k", 64)
    assert counted.node.num_bins == 64 and small.node.num_bins == 8
    assert small.node.inputs[0].num_bins == 8
