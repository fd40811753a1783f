"""The hosts' Arrow memory pool: chosen by ``JobConfig.memory_pool``, checked when the config is made."""

from __future__ import annotations

import pyarrow as pa
import pytest

from chiray.actors.config import JobConfig
from chiray.actors.runtime.host import use_memory_pool


def test_an_unknown_pool_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="memory_pool must be one of"):
        JobConfig(memory_pool="tcmalloc")


@pytest.mark.parametrize("name", ["system", "jemalloc"])
def test_the_named_pool_serves_later_allocations(name):
    before = pa.default_memory_pool()
    try:
        use_memory_pool(name)
        assert pa.default_memory_pool().backend_name == name
        assert pa.array(range(1000)).buffers()[1].address  # allocated from it
    finally:
        pa.set_memory_pool(before)


def test_none_leaves_pyarrows_default():
    before = pa.default_memory_pool().backend_name
    use_memory_pool(None)
    assert pa.default_memory_pool().backend_name == before
