"""griffe_examples.py: a griffe extension that reads a docstring's ``Example:`` section as ``Examples:``.

The Google style allows both titles and the code uses ``Example:``; griffe
knows only the plural, and would render the doctest lines of a singular
section as prose.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_SINGULAR = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Rename each ``Example:`` section title to ``Examples:`` before the docstring is parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _SINGULAR.sub(r"\1Examples:", obj.docstring.value)
