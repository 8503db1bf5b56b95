"""Tests for router_models/steps.py: the round 12 step-count block (off by default).

The block's pure functions are tested directly.  Turned on (``TIERGATE_ROUTER_STEPS=1``, read
when ``router_models.features`` is imported), it is checked in a child process: the lean
scorer's margins equal the training featurizer's vector times the weights, an artifact with the
longer structural block round-trips through the pickle-free format, and the shipped artifact
(trained without the block) is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from router_models.features import FEATURE_SPEC, STEP_SIGNALS, STRUCTURAL_NAMES
from router_models.steps import (
    CHAIN,
    COMPARE,
    STEP_NAMES,
    has_quantity,
    step_signals,
    token_cues,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_block_is_off_by_default() -> None:
    """Without the variable the feature space is the shipped one, with no step columns."""
    assert os.environ.get("TIERGATE_ROUTER_STEPS", "") != "1"
    assert not STEP_SIGNALS
    assert FEATURE_SPEC["name"] == "tiergate-hashed-v7"
    assert not set(STEP_NAMES) & set(STRUCTURAL_NAMES)


def test_cues_in_english_chinese_and_japanese() -> None:
    """English cues match whole tokens; Chinese and Japanese cues match inside long runs."""
    assert token_cues("then") == CHAIN
    assert token_cues("than") == COMPARE
    assert token_cues("thenceforth") == ""
    assert token_cues("剩下的每人分0个") == CHAIN * 2
    assert token_cues("比乙多多少") == COMPARE
    assert token_cues("0個ずつ配ると残りは") == CHAIN * 2
    assert token_cues("どちらが少ない") == COMPARE


def test_quantities_inside_tokens_and_cjk_numerals() -> None:
    """A folded digit anywhere, or a CJK numeral other than 一, is a quantity."""
    assert has_quantity("售价00元")
    assert has_quantity("打九折出售后")
    assert not has_quantity("一个篮球")
    assert not has_quantity("apples")


def test_step_signals_count_quantity_clauses_not_numbers() -> None:
    """Two numbers in one clause are one quantity clause; numeric option lines are not
    counted; the few-steps flag needs at most two quantity clauses and no chain cue."""
    # classes: two clauses with numbers (one with a compare cue), a question
    one_step = step_signals("n-nX s--ns--q", option_lines=0, numeric_options=0)
    values = dict(zip(STEP_NAMES, one_step, strict=True))
    assert values["few_steps"] == 1.0
    assert values["log_compare_cues"] > 0.0
    assert values["log_chain_cues"] == 0.0
    chained = step_signals("n-pNC-pn-pNC-s--q", option_lines=0, numeric_options=0)
    more = dict(zip(STEP_NAMES, chained, strict=True))
    assert more["log_quantity_clauses"] > values["log_quantity_clauses"]
    assert more["few_steps"] == 0.0
    # the same one-step text followed by four numeric option lines ("a . 0" each)
    with_options = step_signals("n-nX s--ns--q" + "-sn" * 4, 4, 4)
    assert with_options[0] == one_step[0]
    assert with_options[4] == 1.0


_CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np
    import router_models
    from router_models.artifact import ArtifactError, RouterModel, load, save
    from router_models.corpus.build import DEFAULT_CORPUS
    from router_models.features import FEATURE_SPEC, HASH_SIZE, STRUCTURAL_NAMES, extract
    from router_models.records import body_of, read_jsonl
    from router_models.scorer import LeanScorer
    from router_models.steps import STEP_NAMES

    rng = np.random.default_rng(7)
    index = np.sort(rng.choice(HASH_SIZE, size=40_000, replace=False)).astype(np.int32)
    model = RouterModel(
        hashed_index=index,
        hashed_weight=rng.normal(size=index.size),
        structural_weight=rng.normal(size=len(STRUCTURAL_NAMES)),
        intercept=0.1, platt_a=1.3, platt_c=-0.2,
        metadata={"feature_spec": FEATURE_SPEC},
    )
    path = Path(sys.argv[1])
    save(model, path)
    model = load(path)
    dense, bias = model.folded_weights()
    root = Path(sys.argv[2])
    records = read_jsonl(DEFAULT_CORPUS)[:200]
    records += read_jsonl(root / "router_models/training/data/external-train.jsonl")[::40]
    bodies = [body_of(r) for r in records] + [
        {"prompt": "りんごを3個ずつ5人に配ると、残りは2個です。全部で何個ですか\\uff1f"},
        {"prompt": "一个篮球打九折出售后\\uff0c售价72元\\uff0c原价多少元\\uff0e"},
        {"prompt": "Which costs more?\\nA. 12\\nB. 15\\nC. 18"},
    ]
    lean = LeanScorer(model)
    worst = 0.0
    for body in bodies:
        feats = extract(body)
        want = bias + sum(dense[i] * v for i, v in feats.items())
        for _ in range(2):  # first with an empty cache entry, then from the cache
            worst = max(worst, abs(lean.margin(body) - want) / max(1.0, abs(want)))
    try:
        load(router_models.DEFAULT_ARTIFACT)
        refused = False
    except ArtifactError:
        refused = True
    print(json.dumps({
        "space": FEATURE_SPEC["name"], "n_bodies": len(bodies), "worst": worst,
        "refused": refused, "tail": list(STRUCTURAL_NAMES[-len(STEP_NAMES):]),
    }))
    """
)


def test_turned_on_the_scorer_matches_the_featurizer(tmp_path: Path) -> None:
    """With the block on, lean margins equal extract()·w to 1e-9 on corpus, Chinese and
    Japanese maths and option-line prompts; the shipped artifact is refused."""
    env = dict(os.environ, TIERGATE_ROUTER_STEPS="1")
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "steps.npz"), str(ROOT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["space"] == "tiergate-hashed-v7-steps"
    assert result["tail"] == list(STEP_NAMES)
    assert result["n_bodies"] >= 300
    assert result["worst"] <= 1e-9
    assert result["refused"] is True
