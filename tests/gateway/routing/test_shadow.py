"""Shadow records: the router's feature vector, and no prompt text unless asked."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.routing.shadow import RequestFeatures, ShadowConfig, ShadowRunner

BODY = {"messages": [{"role": "user", "content": "What is two plus two?"}]}


def featurizer(body: Mapping[str, Any]) -> RequestFeatures:
    """A fixed vector, standing in for the live router's."""
    assert body is BODY
    return RequestFeatures("space:1", "sha256:abc", [3, 7], [0.5, 0.25])


def runner(store: Path, *, store_prompts: bool = False) -> ShadowRunner:
    """A runner writing to ``store``."""
    config = ShadowConfig(fast_ratio=1.0, store=store, max_records=100, store_prompts=store_prompts)
    return ShadowRunner(
        config,
        {},
        fast_tier="fast",
        precise_tier="precise",
        upstream=lambda: None,
        featurizer=featurizer,
    )


def test_a_record_holds_the_vector_and_no_prompt(tmp_path: Path) -> None:
    """The stored line has the features, their space and artifact, and no prompt text."""
    store = tmp_path / "s.jsonl"
    runner(store).record("fast_on_precise", "precise", "4", "4", 0.2, prompt="What?", body=BODY)
    line = store.read_text(encoding="utf-8")
    assert "What?" not in line
    record = json.loads(line)
    assert record["features"] == {"index": [3, 7], "value": [0.5, 0.25]}
    assert record["feature_space"] == "space:1"
    assert record["artifact"] == "sha256:abc"
    assert record["prompt"] is None
    assert record["agreement"] == 1.0
    assert record["tier"] == "fast"


def test_prompts_are_stored_only_when_asked(tmp_path: Path) -> None:
    """``store_prompts`` puts the prompt text into the record."""
    store = tmp_path / "s.jsonl"
    shadow = runner(store, store_prompts=True)
    shadow.record("fast_on_precise", "precise", "4", "5", 0.2, prompt="What?", body=BODY)
    assert json.loads(store.read_text(encoding="utf-8"))["prompt"] == "What?"


def test_a_record_names_the_tenant_and_never_the_key(tmp_path: Path) -> None:
    """The caller's tenant goes into the stored line (training balances by it)."""
    store = tmp_path / "s.jsonl"
    shadow = runner(store)
    shadow.record("fast_on_precise", "precise", "4", "4", 0.2, prompt="x", body=BODY, tenant="t1")
    assert json.loads(store.read_text(encoding="utf-8"))["tenant"] == "t1"


def test_a_tenant_past_its_sample_budget_is_not_shadowed_and_is_counted(tmp_path: Path) -> None:
    """``tenant_samples_per_minute``: beyond it ``admit`` refuses, outcome skipped_tenant_budget."""
    config = ShadowConfig(fast_ratio=1.0, tenant_samples_per_minute=2)
    shadow = ShadowRunner(
        config, {}, fast_tier="fast", precise_tier="precise", upstream=lambda: None
    )
    assert [shadow.admit("fast_on_precise", "a") for _ in range(3)] == [True, True, False]
    assert shadow.admit("fast_on_precise", "b")
    assert shadow.counts == {"fast_on_precise:skipped_tenant_budget": 1}
    assert ShadowConfig().tenant_samples_per_minute == 30  # the documented default
