"""Tests for router_models/cli.py: the train, eval and score subcommands."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from router_models import cli
from router_models.cli import main
from router_models.records import read_jsonl
from router_models.training.train import DEFAULT_DATA

ROOT = Path(__file__).resolve().parents[2]
PROMPTS: list[dict[str, object]] = [
    {"id": "a", "prompt": "Write a function to find the nth Bell number."},
    {"id": "b", "prompt": "hi there"},
    {"id": "c", "messages": [{"role": "user", "content": "Solve x^2 - 5x + 6 = 0 step by step"}]},
    {"id": "d", "prompt": "what's the capital of peru"},
]


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "router_models.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=120,
    )


def _jsonl(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_score_writes_one_line_per_input(tmp_path: Path) -> None:
    """``score`` prints id, score and tier for every input line, in order."""
    result = _cli("score", str(_jsonl(tmp_path / "in.jsonl", PROMPTS)))
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["id"] for r in rows] == ["a", "b", "c", "d"]
    assert all(0.0 <= r["score"] <= 1.0 for r in rows)
    tiers = {r["id"]: r["tier"] for r in rows}
    assert tiers["a"] == "precise"
    assert tiers["b"] == "fast"


def test_score_target_share_and_reference_move_the_threshold(tmp_path: Path) -> None:
    """A target share of 0 sends nothing to precise; 1 sends everything; stdin works."""
    data = "".join(json.dumps(r) + "\n" for r in PROMPTS)
    none = _cli("score", "-", "--target-share", "0", stdin=data)
    every = _cli(
        "score",
        "-",
        "--target-share",
        "1",
        "--reference",
        str(_jsonl(tmp_path / "ref.jsonl", PROMPTS)),
        stdin=data,
    )
    assert none.returncode == every.returncode == 0
    assert {json.loads(x)["tier"] for x in none.stdout.splitlines()} == {"fast"}
    assert {json.loads(x)["tier"] for x in every.stdout.splitlines()} == {"precise"}


def test_eval_prints_tables_and_writes_png(tmp_path: Path) -> None:
    """``eval`` reports AUC, the operating point, per-category and per-source tables, and a PNG."""
    records = read_jsonl(DEFAULT_DATA[1])
    for i, record in enumerate(records):
        record["source"] = "odd" if i % 2 else "even"
    data = _jsonl(tmp_path / "eval.jsonl", records)
    plot = tmp_path / "curve.png"
    result = _cli("eval", "--data", str(data), "--plot", str(plot))
    assert result.returncode == 0, result.stderr
    for needle in (
        "ROC AUC",
        "operating point",
        "by category",
        "by source",
        "odd",
        "even",
        "share sent to precise",
    ):
        assert needle in result.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_json_output(tmp_path: Path) -> None:
    """``eval --json`` prints a machine-readable report with the curve."""
    out = io.StringIO()
    code = main(["eval", "--data", str(DEFAULT_DATA[1]), "--json", "--no-plot"], out=out)
    assert code == 0
    report = json.loads(out.getvalue())["data"]
    assert 0.5 < report["roc_auc"] <= 1.0
    assert report["op_complex_caught"] >= 0.95
    assert len(report["curve"]) == 20
    assert {row["name"] for row in report["by_source"]} == {"tiergate-hard"}


def test_eval_writes_no_png_unless_asked(tmp_path: Path) -> None:
    """Without ``--plot`` nothing is written into the working directory."""
    result = subprocess.run(
        [sys.executable, "-m", "router_models.cli", "eval", "--data", str(DEFAULT_DATA[1])],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert list(tmp_path.iterdir()) == []
    assert "plot written" not in result.stdout


def test_eval_needs_data_or_held_out() -> None:
    """``eval`` with neither ``--data`` nor ``--held-out`` is a usage error, not a traceback."""
    result = _cli("eval")
    assert result.returncode == 2
    assert "--held-out" in result.stderr


def _traffic(tmp_path: Path, n: int) -> Path:
    records = read_jsonl(DEFAULT_DATA[0])[:n]
    rows = [{k: v for k, v in r.items() if k in ("id", "prompt", "messages")} for r in records]
    return _jsonl(tmp_path / "traffic.jsonl", rows)


def test_calibrate_sets_the_threshold_from_unlabelled_traffic(tmp_path: Path) -> None:
    """``calibrate`` prints a threshold that sends the target share of the sample, as YAML."""
    sample = _traffic(tmp_path, 400)
    snippet = tmp_path / "router.yaml"
    result = _cli(
        "calibrate", "--sample", str(sample), "--target-share", "0.25", "--out", str(snippet)
    )
    assert result.returncode == 0, result.stderr
    assert "warning" in result.stderr  # 400 requests is a small sample
    import yaml

    config = yaml.safe_load(snippet.read_text())["router"]
    assert config["target_precise_share"] == 0.25
    scored = _cli("score", str(sample), "--target-share", "0.25", "--reference", str(sample))
    tiers = [json.loads(line)["tier"] for line in scored.stdout.splitlines()]
    assert tiers.count("precise") == 100
    scores = [json.loads(line)["score"] for line in scored.stdout.splitlines()]
    assert sum(s >= config["threshold"] - 1e-6 for s in scores) == 100


@pytest.mark.parametrize(
    ("share", "n", "message"),
    [("1.5", 400, "share must be within"), ("0.3", 5, "at least 20"), ("nan", 400, "share")],
)
def test_calibrate_refuses_bad_input(tmp_path: Path, share: str, n: int, message: str) -> None:
    """Bad shares and tiny samples exit with status 2 and a one-line reason."""
    result = _cli("calibrate", "--sample", str(_traffic(tmp_path, n)), "--target-share", share)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_train_writes_a_loadable_artifact(tmp_path: Path) -> None:
    """``train --data --out`` builds an artifact that ``score --artifact`` can use."""
    records = read_jsonl(DEFAULT_DATA[0])[:400]
    data = _jsonl(tmp_path / "small.jsonl", records)
    out = io.StringIO()
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "m.npz")], out=out) == 0
    assert "trained on 400 examples" in out.getvalue()
    result = _cli(
        "score", str(_jsonl(tmp_path / "in.jsonl", PROMPTS)), "--artifact", str(tmp_path / "m.npz")
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == len(PROMPTS)


@pytest.mark.parametrize(
    "args",
    [["score", "/nonexistent.jsonl"], ["eval", "--data", "/nonexistent.jsonl", "--no-plot"]],
)
def test_errors_exit_with_status_2(args: list[str]) -> None:
    """Missing files are reported on stderr with exit status 2, not a traceback."""
    result = _cli(*args)
    assert result.returncode == 2
    assert "error" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_artifact_is_reported(tmp_path: Path) -> None:
    """A file that is not an artifact is refused with a clear message."""
    (tmp_path / "bad.npz").write_bytes(b"nope")
    result = _cli(
        "score",
        str(_jsonl(tmp_path / "in.jsonl", PROMPTS)),
        "--artifact",
        str(tmp_path / "bad.npz"),
    )
    assert result.returncode == 2
    assert "artifact" in result.stderr


def test_train_help_names_the_extra_when_scikit_learn_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without scikit-learn, ``train --help`` says to install the ``train`` extra, and
    ``train`` itself stops with that advice (exit 2) instead of an ImportError."""
    monkeypatch.setattr(cli, "sklearn_missing", lambda: True)
    with pytest.raises(SystemExit) as shown:
        main(["train", "--help"])
    assert shown.value.code == 0
    assert "pip install 'tiergate[train]'" in " ".join(capsys.readouterr().out.split())
    assert main(["train"]) == 2
    assert "pip install 'tiergate[train]'" in capsys.readouterr().err


def test_serving_imports_neither_training_nor_scikit_learn() -> None:
    """The composition root and the console command load no training module, no sklearn."""
    probe = (
        "import sys, gateway.composition, gateway.__main__\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy')"
        " or m.startswith('router_models.training'))\n"
        "print(bad)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
