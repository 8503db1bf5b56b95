"""docs/replicas.md's slow-replica table quotes bench/results/slow-replica.md: each strategy's
share sent to the slow replica and p50/p95 latency, feature on → off."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _rows() -> dict[str, list[str]]:
    """The results file's rows of the slow-replica section, by label."""
    text = (REPO / "bench/results/slow-replica.md").read_text(encoding="utf-8")
    section = text.split("## Equal replicas")[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if re.match(r"(distinct|shared), c=\d+, \w+, speed (on|off)$", cells[0]):
            rows[cells[0]] = cells
    return rows


def test_the_slow_replica_table_quotes_the_results_file() -> None:
    """Every strategy, workload and concurrency: 'share on → off', 'p50 on → off ms' and
    'p95 on → off ms' appear in docs/replicas.md as the bench wrote them."""
    doc = (REPO / "docs/replicas.md").read_text(encoding="utf-8")
    rows = _rows()
    assert len(rows) == 16
    for label, on in rows.items():
        if not label.endswith("speed on"):
            continue
        off = rows[label.replace("speed on", "speed off")]
        share = f"{on[6].replace('%', ' %')} → {off[6].replace('%', ' %')}"
        assert share in doc, share
        assert f"{on[3]} → {off[3]} ms" in doc, label
        assert f"{on[4]} → {off[4]} ms" in doc, label


def test_the_mixed_traffic_table_quotes_the_results_file() -> None:
    """Equal replicas under mixed traffic, one and four at a time: the hit rate, the share of
    requests after which the speed ratio was 1.5 or more, the largest ratio, and (one at a
    time) the repeats on the same replica appear in docs/replicas.md as 'on → off'."""
    doc = (REPO / "docs/replicas.md").read_text(encoding="utf-8")
    text = (REPO / "bench/results/slow-replica.md").read_text(encoding="utf-8")
    section = text.split("## Equal replicas, mixed traffic")[1]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip().replace("%", " %") for c in line.strip("|").split("|")]
        if re.match(r"mixed, c=\d, prefix_affinity, speed (on|off)$", cells[0]):
            rows[cells[0]] = cells
    assert len(rows) == 4
    for label, on in rows.items():
        if label.endswith("speed on"):
            off = rows[label.replace("speed on", "speed off")]
            for column in (3, 4, 5, 6) if on[3] else (4, 5, 6):
                assert f"{on[column]} → {off[column]}" in doc, (label, column)
