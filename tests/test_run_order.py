"""tests/run_order.py: the collection order under ``--dist worksteal``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests import run_order


@dataclass(frozen=True)
class _Item:
    nodeid: str


def _items(spec: dict[str, int]) -> list[_Item]:
    return [_Item(f"{module}::test_{i}") for module, n in spec.items() for i in range(n)]


def test_chunk_sizes_are_xdists() -> None:
    """As xdist's work stealing deals the collection: ``remaining // workers_left``."""
    assert run_order.chunk_sizes(10, 4) == [2, 2, 3, 3]
    assert run_order.chunk_sizes(2657, 4) == [664, 664, 664, 665]
    assert sum(run_order.chunk_sizes(7, 3)) == 7


def test_expensive_modules_start_the_chunks_and_spread_by_time() -> None:
    spec = {"a.py": 3, "b.py": 2, "c.py": 1, "d.py": 2, "cheap.py": 40}
    times = {"a.py": 200.0, "b.py": 150.0, "c.py": 100.0, "d.py": 60.0, "cheap.py": 1.0}
    items = _items(spec)
    ordered = run_order.balanced(items, 4, times)
    assert sorted(i.nodeid for i in ordered) == sorted(i.nodeid for i in items)  # all, once
    sizes = run_order.chunk_sizes(len(items), 4)
    starts = [sum(sizes[:k]) for k in range(4)]
    firsts = {run_order.module_of(ordered[s].nodeid) for s in starts}
    assert firsts == {"a.py", "b.py", "c.py", "d.py"}  # each worker starts on one of them
    for module in ("a.py", "b.py", "c.py", "d.py"):  # a module's tests stay together, in order
        where = [k for k, item in enumerate(ordered) if item.nodeid.startswith(module)]
        assert where == list(range(where[0], where[0] + len(where)))
        assert [ordered[k].nodeid for k in where] == [
            f"{module}::test_{i}" for i in range(spec[module])
        ]


def test_the_least_loaded_chunk_takes_the_next_module() -> None:
    """Two workers: 100 → chunk 0, 90 → chunk 1, 50 → chunk 1 (90 < 100), 45 → chunk 0."""
    spec = {"w.py": 1, "x.py": 1, "y.py": 1, "z.py": 1, "cheap.py": 6}
    times = {"w.py": 100.0, "x.py": 90.0, "y.py": 50.0, "z.py": 45.0}
    ordered = [run_order.module_of(i.nodeid) for i in run_order.balanced(_items(spec), 2, times)]
    assert ordered[:2] == ["w.py", "z.py"]
    assert ordered[5:7] == ["x.py", "y.py"]


def test_a_module_larger_than_any_room_left_still_runs() -> None:
    ordered = run_order.balanced(_items({"big.py": 9, "other.py": 1}), 2, {"big.py": 50.0})
    assert len(ordered) == 10


def test_a_missing_or_broken_durations_file_means_no_times(tmp_path: Path) -> None:
    assert run_order.load_durations(tmp_path / "none.json") == {}
    broken = tmp_path / "broken.json"
    broken.write_text("[1, 2", encoding="utf-8")
    assert run_order.load_durations(broken) == {}


def test_the_committed_durations_name_real_modules() -> None:
    """A renamed module's time would silently stop counting: every entry is a file here."""
    durations = run_order.load_durations()
    assert len(durations) > 100
    root = Path(__file__).resolve().parents[1]
    missing = [name for name in durations if not (root / name).is_file()]
    assert missing == []


def test_durations_are_read_from_a_junit_report(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.x.test_y" name="test_a" time="1.5"/>'
        '<testcase classname="tests.x.test_y.TestGroup" name="test_b" time="2.0"/>'
        '<testcase classname="tests.test_z" name="test_c" time="0.25"/>'
        "</testsuite></testsuites>",
        encoding="utf-8",
    )
    assert run_order.module_times(report) == {"tests/x/test_y.py": 3.5, "tests/test_z.py": 0.25}
