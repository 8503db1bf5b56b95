"""Attack findings on ``read_shadow(label="judge")`` and ``--shadow-label judge``: each test
states what the reader should do; each failed on the first version of the judge path and
holds since the fix."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest

from router_models.cli import main
from router_models.records import RecordError
from router_models.training.shadow_train import read_shadow, store_files
from tests.router_models.test_shadow_train import COMPLEX, SIMPLE, record, write_store

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 7.0, -3.0, "0.25", True])
def test_a_judge_score_that_is_not_a_number_in_0_1_is_refused(tmp_path: Path, bad: object) -> None:
    """parse_score writes (n - 1) / 4 in [0, 1]; anything else in the store is corrupt. In
    the first version, NaN and +inf and 7.0 labelled the prompt simple, -inf and -3.0 complex,
    the string '0.25' and True were read as numbers: no error, and one such record among a
    prompt's judged records decided its mean (NaN makes any mean NaN, and NaN < 0.625 is
    False: simple)."""
    store = write_store(
        tmp_path / "s.jsonl",
        [record(SIMPLE[0], 0.0) | {"judge": 0.25}, record(SIMPLE[0], 0.0) | {"judge": bad}],
    )
    with pytest.raises(RecordError, match="judge"):
        read_shadow(store_files(store), label="judge")


def test_a_store_with_no_judged_record_says_so(tmp_path: Path) -> None:
    """60 records of the current feature space, none judged (judge_ratio was 0): the error
    names the judge, not a feature-space mismatch that did not happen."""
    records = [record(p, 1.0) for p in SIMPLE] + [record(p, 0.0) for p in COMPLEX]
    store = write_store(tmp_path / "s.jsonl", records)
    err = io.StringIO()
    args = ["train", "--from-shadow", str(store), "--out", str(tmp_path / "o.npz")]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stderr", err)
        assert main([*args, "--shadow-label", "judge"], out=io.StringIO()) == 2
    assert "feature space" not in err.getvalue(), err.getvalue()
    assert "judge" in err.getvalue(), err.getvalue()
