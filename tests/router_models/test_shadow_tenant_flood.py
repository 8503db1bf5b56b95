"""A flooding tenant cannot flip what ``router train --from-shadow`` learns for another."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

import router_models
from router_models.cli import main
from tests.router_models.test_shadow_train import record, write_store

pytestmark = pytest.mark.slow

TEMPLATE = "Summarize the clinical trial report number {} in one short sentence."
B_PROMPTS = [TEMPLATE.format(i) for i in range(40)]  # tenant b: its fast answers fail (complex)
A_PROMPTS = [TEMPLATE.format(i) for i in range(1000, 1800)]  # tenant a: 20x, agreeing (simple)
B_LATER = [TEMPLATE.format(i) for i in range(500, 540)]  # b's traffic after the retrain


def b_later_scores(artifact: Path) -> list[float]:
    """The retrained router's score of each of b's later prompts (never trained on)."""
    router = router_models.load(artifact)
    return [router.score({"messages": [{"role": "user", "content": p}]}) for p in B_LATER]


def test_a_twentyfold_flood_cannot_flip_the_router_on_the_other_tenants_prompts(
    tmp_path: Path,
) -> None:
    """Same kind of prompt, opposite labels, 800 rows of a against 40 of b. Unbalanced
    (--max-tenant-share 1) a's label wins on b's later prompts (mean score 0.31, none at 0.5
    or above, docs/savings.md); balanced (the default) b's does (0.74, all of them)."""
    records = [record(p, 0.05) | {"tenant": "b"} for p in B_PROMPTS]
    records += [record(p, 1.0) | {"tenant": "a"} for p in A_PROMPTS]
    store = write_store(tmp_path / "shadow.jsonl", records)
    results = {}
    for name, extra in (("balanced", []), ("unbalanced", ["--max-tenant-share", "1"])):
        out, report, text = tmp_path / f"{name}.npz", tmp_path / f"{name}.json", io.StringIO()
        args = ["train", "--from-shadow", str(store), "--out", str(out), "--report", str(report)]
        assert main([*args, *extra], out=text) == 0
        scores = b_later_scores(out)
        results[name] = (float(np.mean(scores)), sum(s >= 0.5 for s in scores) / len(scores))
        data = json.loads(report.read_text(encoding="utf-8"))
        balance = data["tenant_balance"]
        held = data["comparison"]["tenant_balance"]  # held-out rows weighted as in training
        assert held["largest_weight_share"] == (
            0.5 if name == "balanced" else pytest.approx(held["largest_row_share"])
        )
        assert balance["tenants"] == 2
        assert balance["largest_row_share"] > 0.9  # a sent 20x b's traffic
        assert balance["largest_weight_share"] == (
            0.5 if name == "balanced" else pytest.approx(balance["largest_row_share"])
        )
        assert "tenants: 2" in text.getvalue()
        print(name, results[name])  # the numbers docs/savings.md quotes (pytest -s)
    unbalanced_mean, unbalanced_precise = results["unbalanced"]
    balanced_mean, balanced_precise = results["balanced"]
    assert unbalanced_precise <= 0.1  # a's flood flips b's prompts to the fast tier
    assert balanced_precise >= 0.9  # balanced: b's own label holds
    assert balanced_mean - unbalanced_mean > 0.25
