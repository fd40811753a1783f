"""operators: the user API (Dataflow, Stream), the operator library, sources, sinks and keyed state.

Pure Python over pyarrow and NumPy; nothing here imports Ray.
"""

from .callsinks import to_callable
from .connected import ConnectedStreams, KeyedConnectedStreams
from .dataflow import Dataflow, KeyedStream, Stream
from .delta import to_delta
from .generator import generate
from .logic import InstanceInfo, OperatorLogic, Sink, SinkWriter, Source, SourceSplit, SplitAddress, SplitReader
from .sides import SideState, SourceSide, SourceSideStatus
from .sinks import collect, to_parquet
from .sources import from_arrow, from_items, from_parquet
from .textsources import from_csv, from_json
from .watermarks import WatermarkStrategy, bounded_out_of_orderness, watermarks_from
from .windowed import WindowedStream
from .windows import session, sliding, tumbling

__all__ = [
    "Dataflow",
    "Stream",
    "KeyedStream",
    "ConnectedStreams",
    "KeyedConnectedStreams",
    "from_items",
    "from_arrow",
    "from_parquet",
    "from_csv",
    "from_json",
    "generate",
    "collect",
    "to_parquet",
    "to_delta",
    "to_callable",
    "Source",
    "SourceSplit",
    "SplitAddress",
    "SplitReader",
    "SourceSide",
    "SourceSideStatus",
    "SideState",
    "Sink",
    "SinkWriter",
    "OperatorLogic",
    "InstanceInfo",
    "WatermarkStrategy",
    "bounded_out_of_orderness",
    "watermarks_from",
    "WindowedStream",
    "tumbling",
    "sliding",
    "session",
]
