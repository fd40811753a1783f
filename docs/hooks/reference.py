"""reference.py: MkDocs hooks that make the parts of the reference taken from the code.

* ``on_config`` lays out the ``chiray`` package as it installs (``chiray/`` with
  ``actors/``, ``control/``, ``operators/`` and ``spark_bridge/`` inside it) as
  symbolic links under ``build/docs-api/``, where mkdocstrings reads the
  sources: in the checkout those folders sit beside ``chiray/``, not in it.
* ``on_page_markdown`` replaces ``<!-- chiray:cli -->`` with the verbs of the
  ``chiray`` command line, made from its argparse parser, and
  ``<!-- chiray:metrics -->`` with the table of exported metrics, made from
  ``chiray.actors.jobs.metrics``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

LAYERS = ("actors", "control", "operators", "spark_bridge")
API_TREE = Path("build") / "docs-api"


def _lay_out_package(root: Path) -> None:
    """``root/build/docs-api/chiray``: links to ``chiray/``'s files and to the layer folders."""
    tree = root / API_TREE
    package = tree / "chiray"
    wanted = {p.name: p for p in (root / "chiray").iterdir() if p.name != "__pycache__"}
    wanted.update({layer: root / layer for layer in LAYERS})
    if package.is_dir() and all((package / n).resolve() == p.resolve() for n, p in wanted.items()):
        return
    tree.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="chiray-", dir=tree))
    for name, target in wanted.items():
        (scratch / name).symlink_to(target.resolve())
    shutil.rmtree(package, ignore_errors=True)
    try:
        scratch.rename(package)
    except OSError:  # another build laid it out meanwhile
        shutil.rmtree(scratch, ignore_errors=True)


@event_priority(100)  # before mkdocstrings reads its configuration
def on_config(config: Any) -> Any:
    _lay_out_package(Path(config.config_file_path).resolve().parent)
    return config


def _verbs(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(verb, its help line, its parser) for each subcommand, in the parser's order."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help or "" for a in action._choices_actions}
    return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]


def cli_reference() -> str:
    """Markdown for every verb of the ``chiray`` command: a table, then each verb's usage and options."""
    from chiray.cli import build_parser

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "88"  # argparse wraps its help to the terminal's width (and the page's)
    try:
        parser = build_parser()
        verbs = _verbs(parser)
        lines = ["| verb | what it does |", "|---|---|"]
        lines += [f"| [`{name}`](#chiray-{name}) | {text} |" for name, text, _ in verbs]
        for name, text, sub in verbs:
            lines += ["", f"### chiray {name}", "", f"{text[:1].upper()}{text[1:]}.", "", "```text",
                      sub.format_help().rstrip(), "```"]
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return "\n".join(lines)


def metrics_reference() -> str:
    """Markdown table of the metrics a detached job exports, by their names on Ray's metrics endpoint."""
    from chiray.actors.jobs import metrics

    rows = [("counter", f, d) for f, d in {**metrics.COUNTERS, **metrics.JOB_COUNTERS}.items()]
    rows += [("gauge", f, d) for f, d in metrics.GAUGES.items()]
    lines = ["| name on the endpoint | kind | what it measures |", "|---|---|---|"]
    for kind, field, text in rows:
        name = f"ray_{metrics.metric_name(field)}" + ("_total" if kind == "counter" else "")
        lines.append(f"| `{name}` | {kind} | {text} |")
    return "\n".join(lines)


MARKERS = {"<!-- chiray:cli -->": cli_reference, "<!-- chiray:metrics -->": metrics_reference}


def on_page_markdown(markdown: str, **_: Any) -> str:
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
