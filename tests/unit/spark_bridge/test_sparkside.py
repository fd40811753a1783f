"""The warm standby registry of ``sparkside``: what a failed side leaves for its source's next run (no Ray)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from chiray.operators.sides import SourceSide  # noqa: E402
from chiray.spark_bridge import SparkConfig  # noqa: E402
from chiray.spark_bridge import sparkside  # noqa: E402
from chiray.spark_bridge.sparkside import Standby, hand_on, take_standby  # noqa: E402


class _Actor:
    """Stands for an actor handle; ``ray.kill`` refuses it, which ``Standby.close`` ignores as for a dead one."""


@pytest.fixture(autouse=True)
def _empty_registry(monkeypatch):
    monkeypatch.setattr(sparkside, "_handed", {})
    closed: list[str] = []
    monkeypatch.setattr(Standby, "close", lambda self: closed.append(self.coordinator))
    return closed


def test_a_handed_standby_is_taken_once_by_its_source_with_the_same_config(_empty_registry):
    config = SparkConfig(conf={"spark.driver.memory": "512m"})
    standby = Standby("events", config, "events-1234", _Actor())
    hand_on(standby)
    assert take_standby("other", config) is None
    assert take_standby("events", SparkConfig(conf={"spark.driver.memory": "512m"})) is standby
    assert take_standby("events", config) is None  # taken: gone
    assert _empty_registry == []


def test_a_standby_made_for_another_config_or_replaced_is_closed_not_taken(_empty_registry):
    hand_on(Standby("events", SparkConfig(), "events-a", _Actor()))
    hand_on(Standby("events", SparkConfig(), "events-b", _Actor()))  # a second failure before a run took one
    assert _empty_registry == ["events-a"]
    assert take_standby("events", SparkConfig(cores=1)) is None
    assert _empty_registry == ["events-a", "events-b"]


def test_a_side_without_a_standby_hands_over_by_closing():
    class Side(SourceSide):
        closed = 0

        def failure(self):
            return None

        def status(self, timeout_s=5.0):
            raise NotImplementedError

        def close(self):
            self.closed += 1

    side = Side()
    side.keep_standby()
    side.hand_over()
    assert side.closed == 1
