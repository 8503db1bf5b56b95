"""The order tests run in, so that ``pytest -n N --dist worksteal`` ends with no worker idle
long before the others.

pytest-xdist's work stealing hands each of the N workers one contiguous chunk of the
collection (sizes by count: ``remaining // workers_left``), and an idle worker later takes the
back half of the busiest worker's queue. So a chunk's front is where its worker stays, and a
long test that happens to sit at the back of a chunk starts last and runs alone at the end of
the run. :func:`balanced` builds the collection as N chunks of exactly those sizes, each
starting with its share of the expensive modules (assigned largest first to the chunk with
the least time so far, a whole module at a time so its module fixtures start once) and filled
up with the cheap tests, which stealing then evens out.

Times per module come from ``tests/durations.json``; a module missing there counts as cheap.
To refresh it: ``.venv/bin/pytest -n 4 --dist worksteal --junitxml=/tmp/junit.xml`` (what
``make test-all`` runs, plus the report), then ``.venv/bin/python -m tests.run_order
/tmp/junit.xml [more.xml ...] > tests/durations.json`` (a module in several reports keeps its
last time). Only the modules' relative cost matters, so a loaded machine's times do.
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TypeVar

DURATIONS = Path(__file__).with_name("durations.json")
# A module below this many seconds in all is a filler: no need to place it.
EXPENSIVE_S = 5.0


class _Item(Protocol):
    @property
    def nodeid(self) -> str: ...


ItemT = TypeVar("ItemT", bound=_Item)


def module_of(nodeid: str) -> str:
    """``tests/x/test_y.py::test_z[p]`` → ``tests/x/test_y.py``."""
    return nodeid.split("::", 1)[0]


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    """Seconds per module file, or nothing when the file is missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}


def chunk_sizes(total: int, workers: int) -> list[int]:
    """The chunk sizes xdist's work stealing deals out first, in order."""
    sizes = []
    left = total
    for i in range(workers):
        size = left // (workers - i)
        sizes.append(size)
        left -= size
    return sizes


def balanced(items: Sequence[ItemT], workers: int, durations: dict[str, float]) -> list[ItemT]:
    """``items`` reordered as described above; the order within a module is kept."""
    modules: dict[str, list[ItemT]] = {}
    for item in items:
        modules.setdefault(module_of(item.nodeid), []).append(item)
    sizes = chunk_sizes(len(items), workers)
    chunks: list[list[ItemT]] = [[] for _ in sizes]
    spent = [0.0] * len(sizes)
    expensive = sorted(
        (m for m in modules if durations.get(m, 0.0) >= EXPENSIVE_S),
        key=lambda m: -durations[m],
    )
    fillers: list[ItemT] = []
    for name in expensive:
        tests = modules.pop(name)
        fits = [i for i in range(len(sizes)) if len(chunks[i]) + len(tests) <= sizes[i]]
        if not fits:  # a module larger than any room left: it fills in like a cheap one
            fillers.extend(tests)
            continue
        best = min(fits, key=lambda i: spent[i])
        chunks[best].extend(tests)
        spent[best] += durations[name]
    for tests in modules.values():
        fillers.extend(tests)
    for i, size in enumerate(sizes):
        room = size - len(chunks[i])
        chunks[i].extend(fillers[:room])
        del fillers[:room]
    return [item for chunk in chunks for item in chunk] + fillers


_MODULE = re.compile(r"^(.*?test_[^.]*)")


def module_times(report: Path) -> dict[str, float]:
    """``tests/x/test_y.py`` → the sum of its test cases' times in a JUnit XML ``report``."""
    times: dict[str, float] = {}
    for case in ET.parse(report).iter("testcase"):  # noqa: S314  # our own pytest's report
        match = _MODULE.match(case.get("classname") or "")
        if match is None:
            continue
        module = match.group(1).replace(".", "/") + ".py"
        times[module] = times.get(module, 0.0) + float(case.get("time") or 0.0)
    return times


def main(argv: list[str]) -> int:
    """Print durations.json's content for the JUnit XML reports named in ``argv``."""
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    merged: dict[str, float] = {}
    for name in argv:
        merged.update(module_times(Path(name)))
    ordered = sorted(merged.items(), key=lambda kv: -kv[1])
    print(json.dumps({k: round(v, 1) for k, v in ordered}, indent=0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
