"""``tiergate bench`` as a user runs it, against real simulator and gateway processes.

The simulators run with ``--jitter 0``, so their latency model is exact: at concurrency 1,
TTFT = base + prompt tokens x prefill per token and TPOT = the inter-token latency. The
measured medians must match within ``REL`` + ``ABS_MS`` (event-loop and socket overhead on a
busy 2-core machine).

The two latency-model tests run ``python -m gateway bench`` as a separate process, as a user
does; the others call the same entry point (``gateway.__main__.main``, which finds ``bench``
by its entry point) in this process, since what they check is the exit status and the
output, not the interpreter's start (about 2 s each on a busy machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.__main__ import main as tiergate_main
from simulator.profiles import PRECISE
from tests.integration.gateway_proc import GatewayProcess, tiers_config
from tests.simulator.procs import SimulatorProcess

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
REL = 0.10
TTFT_ABS_MS = 8.0
TPOT_ABS_MS = 1.5


def bench(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """Run ``python -m gateway bench ARGS``."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", "bench", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


Bench = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def bench_here(capsys: pytest.CaptureFixture[str]) -> Bench:
    """``bench`` run in this process: ``tiergate bench ARGS`` through the console command's
    entry point, its exit status and output as a finished process's."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()  # only this run's output
        try:
            code = tiergate_main(["bench", *args])
        except SystemExit as exc:  # argparse refusing an option
            code = exc.code if isinstance(exc.code, int) else 2
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["tiergate", "bench", *args], code, out, err)

    return run


@pytest.fixture(scope="module")
def instant() -> Iterator[SimulatorProcess]:
    """A zero-latency simulator (nothing is set on it: tests may share it)."""
    with SimulatorProcess("--latency-scale", "0") as sim:
        yield sim


@pytest.fixture(scope="module")
def precise() -> Iterator[SimulatorProcess]:
    """A precise-tier simulator with exact latencies."""
    with SimulatorProcess("--profile", "precise", "--jitter", "0") as sim:
        yield sim


@pytest.fixture(scope="module")
def fast() -> Iterator[SimulatorProcess]:
    """A fast-tier simulator with exact latencies."""
    with SimulatorProcess("--profile", "fast", "--jitter", "0") as sim:
        yield sim


@pytest.fixture(scope="module")
def gateway(fast: SimulatorProcess, precise: SimulatorProcess) -> Iterator[GatewayProcess]:
    """A gateway, auth off, in front of both simulators."""
    with GatewayProcess(
        {"auth": {"enabled": False}, "tiers": tiers_config([fast.url], [precise.url])}
    ) as gw:
        yield gw


def _close(measured: float, expected: float, abs_ms: float) -> bool:
    return abs(measured - expected) <= REL * expected + abs_ms


def _check_model(point: dict[str, Any]) -> None:
    m = point["metrics"]
    assert m["completed"] == m["requests"], m["first_errors"]
    assert m["tokens_counted_from"] == "usage"
    assert m["mean_output_tokens"] == point["output_tokens"]  # ignore_eos honoured
    expected_ttft = (
        PRECISE.base_overhead_s + m["mean_prompt_tokens"] * PRECISE.prefill_per_token_s
    ) * 1000
    expected_tpot = PRECISE.inter_token_s * 1000
    assert _close(m["ttft_ms"]["median"], expected_ttft, TTFT_ABS_MS), (m["ttft_ms"], expected_ttft)
    assert _close(m["tpot_ms"]["median"], expected_tpot, TPOT_ABS_MS), m["tpot_ms"]


def test_direct_ttft_and_tpot_match_the_latency_model(
    precise: SimulatorProcess, tmp_path: Path
) -> None:
    """Direct to a backend, median TTFT and TPOT match the simulator's model."""
    out = tmp_path / "out"
    result = bench(
        "--url",
        precise.url,
        "--model",
        "tiergate-precise",
        "--prompt-tokens",
        "long=400",
        "--output-tokens",
        "short=16",
        "--concurrency",
        "1",
        "--num-requests",
        "8",
        "--slo",
        "ttft_ms=5000,tpot_ms=500",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads((out / "bench.json").read_text())
    (point,) = doc["points"]
    assert abs(point["metrics"]["mean_prompt_tokens"] - 400) <= 16
    _check_model(point)
    assert point["metrics"]["goodput"] > 0
    assert "| tiergate-precise | tiergate-precise | long/short | 1 | inf | 8/8 |" in result.stdout
    assert (out / "bench.md").read_text() == result.stdout
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_direct_and_through_the_gateway_in_one_run(
    precise: SimulatorProcess, gateway: GatewayProcess, tmp_path: Path
) -> None:
    """The same load direct and through the gateway, in turns: both match the model; the run
    reports the gateway's added TTFT per grid point."""
    out = tmp_path / "out"
    result = bench(
        "--target",
        f"name=direct,url={precise.url},model=tiergate-precise",
        "--target",
        f"name=gateway,url={gateway.url}/v1,model=precise",
        "--prompt-tokens",
        "300",
        "--output-tokens",
        "12",
        "--concurrency",
        "1,2",
        "--num-requests",
        "6",
        "--rounds",
        "2",
        "--no-plot",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads((out / "bench.json").read_text())
    points = {(p["target"], p["concurrency"]): p for p in doc["points"]}
    assert all(p["metrics"]["requests"] == 6 for p in points.values())
    assert "gateway 300/12 c=2 rate=inf (round 2/2):" in result.stderr
    assert set(points) == {("direct", 1), ("direct", 2), ("gateway", 1), ("gateway", 2)}
    _check_model(points["direct", 1])
    _check_model(points["gateway", 1])
    rows = {r["concurrency"]: r for r in doc["comparisons"]}
    assert set(rows) == {1, 2}
    assert rows[1]["target"] == "gateway"
    assert rows[1]["baseline"] == "direct"
    added = rows[1]["added_ttft_ms"]["median"]
    assert added == pytest.approx(
        points["gateway", 1]["metrics"]["ttft_ms"]["median"]
        - points["direct", 1]["metrics"]["ttft_ms"]["median"]
    )
    assert -TTFT_ABS_MS < added < 50
    assert "| gateway | direct | 300/12 | 1 | inf |" in result.stdout
    assert not (out / "bench.png").exists()


def test_errors_are_counted_by_status(tmp_path: Path, bench_here: Bench) -> None:
    """A backend failing a third of requests with 503: the error rate and statuses show it."""
    with SimulatorProcess("--latency-scale", "0", "--fail-503", "0.35", "--seed", "3") as sim:
        out = tmp_path / "out"
        result = bench_here(
            "--url",
            sim.url,
            "--model",
            "tiergate-fast",
            "--prompt-tokens",
            "16",
            "--output-tokens",
            "4",
            "--concurrency",
            "4",
            "--num-requests",
            "60",
            "--warmup",
            "5",
            "--no-plot",
            "--out",
            str(out),
        )
    assert result.returncode == 0, result.stderr
    (point,) = json.loads((out / "bench.json").read_text())["points"]
    m = point["metrics"]
    assert set(m["errors_by_status"]) == {"503"}
    assert 0.15 < m["error_rate"] < 0.6
    assert m["completed"] + m["errors_by_status"]["503"] == 60
    assert "fault injection" in m["first_errors"]["503"]


def test_poisson_rate_and_time_bound(
    tmp_path: Path, instant: SimulatorProcess, bench_here: Bench
) -> None:
    """With a rate and no cap, requests arrive over time; --max-duration stops new ones."""
    out = tmp_path / "out"
    started = time.monotonic()
    result = bench_here(
        "--url",
        instant.url,
        "--model",
        "tiergate-fast",
        "--prompt-tokens",
        "8",
        "--output-tokens",
        "4",
        "--concurrency",
        "0",
        "--request-rate",
        "20",
        "--num-requests",
        "10000",
        "--max-duration",
        "1.5",
        "--no-plot",
        "--out",
        str(out),
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    (point,) = json.loads((out / "bench.json").read_text())["points"]
    m = point["metrics"]
    assert 10 <= m["requests"] <= 60  # about 30 in 1.5 s at 20/s
    assert m["completed"] == m["requests"]
    assert point["request_rate"] == 20
    assert point["concurrency"] is None
    assert elapsed < 30


def test_unreachable_url_is_a_clear_error(bench_here: Bench) -> None:
    """Nothing listening: exit 2 and a message naming the target and the connection error."""
    from tests.processes import free_port

    url = f"http://127.0.0.1:{free_port()}"
    result = bench_here("--url", url, "--model", "fast", "--num-requests", "1")
    assert result.returncode == 2
    assert (
        f"target fast ({url}, model fast) does not answer: connect: cannot connect" in result.stderr
    )
    assert result.stdout == ""


def test_wrong_model_and_bad_jsonl_are_clear_errors(
    precise: SimulatorProcess, tmp_path: Path, bench_here: Bench
) -> None:
    """A model the server lacks shows the server's 404 message; a bad file names its line."""
    result = bench_here("--url", precise.url, "--model", "nope", "--num-requests", "1")
    assert result.returncode == 2
    assert "does not answer: HTTP 404: The model `nope` does not exist." in result.stderr
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": 3}\n')
    result = bench_here("--url", precise.url, "--model", "tiergate-precise", "--prompts", str(bad))
    assert result.returncode == 2
    assert f"{bad}:2: expected a non-empty string `prompt`" in result.stderr
    result = bench_here("--url", precise.url, "--model", "tiergate-precise", "--slo", "ttft=1")
    assert result.returncode == 2
    assert "unknown limit 'ttft'" in result.stderr


def test_user_prompts_from_jsonl(
    precise: SimulatorProcess, tmp_path: Path, bench_here: Bench
) -> None:
    """Prompts and chat messages from the user's file drive the run (shape file/<output>)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        '{"prompt": "Tell me about tiers."}\n'
        '{"messages": [{"role": "system", "content": "Be brief."}, '
        '{"role": "user", "content": "Why a gateway?"}]}\n'
    )
    out = tmp_path / "out"
    result = bench_here(
        "--url",
        precise.url,
        "--model",
        "tiergate-precise",
        "--prompts",
        str(prompts),
        "--output-tokens",
        "4",
        "--concurrency",
        "2",
        "--num-requests",
        "4",
        "--no-plot",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    (point,) = json.loads((out / "bench.json").read_text())["points"]
    assert point["shape"] == "file/4"
    assert point["metrics"]["completed"] == 4
    assert json.loads((out / "bench.json").read_text())["settings"]["prompt_source"] == "file"


def test_a_server_that_never_answers_times_out(bench_here: Bench) -> None:
    """A backend stalling longer than --timeout fails the check with a timeout message."""
    with SimulatorProcess(
        "--latency-scale", "0", "--stall-first-byte", "1", "--stall-seconds", "10"
    ) as sim:
        started = time.monotonic()
        result = bench_here(
            "--url", sim.url, "--model", "tiergate-fast", "--timeout", "0.5", "--warmup", "1"
        )
    assert result.returncode == 2
    assert "does not answer: timeout: no complete answer in 0.5 s" in result.stderr
    assert time.monotonic() - started < 20


def test_contradictory_options_are_refused(bench_here: Bench) -> None:
    """Contradictory or unusable options exit 2 before any request, saying why."""
    cases = [
        (
            [
                "--url",
                "http://127.0.0.1:1",
                "--model",
                "m",
                "--target",
                "name=a,url=http://127.0.0.1:1,model=m",
            ],
            "not both",
        ),
        (
            ["--url", "http://127.0.0.1:1", "--model", "m", "--concurrency", "0"],
            "give --request-rate too",
        ),
        (["--target", "name=a,url=http://127.0.0.1:1,model=m,vs=b"], "vs=b is not a target"),
        (["--url", "http://127.0.0.1:1"], "--url needs --model"),
        (["--url", "http://127.0.0.1:1", "--model", "m", "--warmup", "0"], "--warmup must be"),
        (
            ["--url", "http://127.0.0.1:1", "--model", "m", "--out", str(REPO / "pyproject.toml")],
            "cannot create the directory",
        ),
        (
            [
                "--url",
                "http://127.0.0.1:1",
                "--model",
                "m",
                "--concurrency",
                "8",
                "--num-requests",
                "16",
                "--rounds",
                "4",
            ],
            "rounds of 4 requests, fewer than concurrency 8",
        ),
    ]
    for args, message in cases:
        result = bench_here(*args)
        assert result.returncode == 2, args
        assert message in result.stderr, (args, result.stderr)


def test_many_requests_at_full_speed_stop_at_the_time_bound(
    tmp_path: Path, instant: SimulatorProcess, bench_here: Bench
) -> None:
    """100k requests at concurrency 2 and no rate: --max-duration ends the point in time."""
    out = tmp_path / "out"
    started = time.monotonic()
    result = bench_here(
        "--url",
        instant.url,
        "--model",
        "tiergate-fast",
        "--prompt-tokens",
        "8",
        "--output-tokens",
        "2",
        "--concurrency",
        "2",
        "--num-requests",
        "100000",
        "--max-duration",
        "1",
        "--no-plot",
        "--out",
        str(out),
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    (point,) = json.loads((out / "bench.json").read_text())["points"]
    assert 0 < point["metrics"]["requests"] < 100000
    assert point["metrics"]["failed"] == 0
    assert point["metrics"]["duration_s"] < 5
    assert elapsed < 30
