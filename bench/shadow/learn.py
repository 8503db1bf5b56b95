"""The router learns from shadowed traffic: the issue-17 loop, end to end on the simulator.

    .venv/bin/python bench/shadow/learn.py [--requests 2000] [--steps 250,500,1000,2000]

1. **Sources.** The train rows of ../shared/datasets/router-dev2.jsonl (read at run time,
   never copied here), grouped by source. The shipped artifact's *misrouting* of a source is
   its mean score on a simple source (how often it sends it precise) and one minus its mean
   score on a complex one; the ``PER_LABEL`` worst sources of each label are the traffic.
2. **Split.** A row is held out when the hash of its id falls below ``HELD_OUT``; traffic is
   drawn (seeded, with replacement) from the others only.
3. **Loop.** A weak fast simulator and a strong precise one (quality file: those rows'
   labels), a gateway on the shipped artifact with every request shadowed
   (``router.shadow`` ratio 1.0 both ways) into a store. Requests go until ``--requests``
   shadows were compared.
4. **Retrain.** ``tiergate router train --from-shadow STORE`` (the CLI's entry point), on
   the store cut to each step's first N records.
5. **Score.** On the held-out rows, with their dataset labels: simple prompts sent to precise
   by the old and new artifacts at equal complex caught (``router_models.training.shadow_eval``).
6. **Reload.** The last artifact is written over the gateway's configured one and loaded with
   ``POST /admin/router/reload``; ``/admin/routing`` must name it.

Writes bench/results/shadow-learn.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import random
import shutil
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

import router_models
from router_models import cli as router_cli
from router_models.artifact import load as load_model
from router_models.training.shadow_eval import compare
from router_models.training.shadow_train import hash_unit, scores, to_csr
from router_models.vectors import hashed_vector

REPO: Final = Path(__file__).resolve().parents[2]
DATASET: Final = REPO.parent / "shared" / "datasets" / "router-dev2.jsonl"
PER_LABEL: Final = 2
HELD_OUT: Final = 0.3
MAX_TOKENS: Final = 24


def body_of(prompt: str) -> dict[str, Any]:
    """The request body the traffic sends (and the held-out rows are scored as)."""
    return {
        "model": "auto",
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": prompt}],
    }


def every_row(path: Path = DATASET) -> list[dict[str, Any]]:
    """Every row of the set (``"use": "eval"`` ones are only ever scored, never learned)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def train_rows(path: Path = DATASET) -> list[dict[str, Any]]:
    """The rows marked ``"use": "train"``."""
    return [r for r in every_row(path) if r.get("use") == "train"]


def misrouting(rows: Sequence[dict[str, Any]], router: router_models.Router) -> dict[str, float]:
    """Per source: mean score (simple sources) or one minus it (complex ones)."""
    by_source: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_source[row["source"]].append(row)
    out = {}
    for source, members in sorted(by_source.items()):
        mean = float(np.mean([router.score(body_of(r["prompt"])) for r in members]))
        labels = {r["label"] for r in members}
        out[source] = mean if labels == {"simple"} else 1.0 - mean if labels == {"complex"} else -1
    return out


def worst_sources(
    rows: Sequence[dict[str, Any]], router: router_models.Router, per_label: int = PER_LABEL
) -> list[str]:
    """The ``per_label`` most misrouted single-label sources of each label."""
    scored = misrouting(rows, router)
    label = {r["source"]: r["label"] for r in rows}
    chosen: list[str] = []
    for wanted in ("simple", "complex"):
        ranked = sorted(
            (s for s in scored if label[s] == wanted and scored[s] >= 0),
            key=lambda s: scored[s],
            reverse=True,
        )
        chosen += ranked[:per_label]
    return sorted(chosen)


def split(rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(traffic rows, held-out rows), disjoint by a hash of the row id."""
    held = [r for r in rows if hash_unit(str(r["id"]), "heldout:") < HELD_OUT]
    traffic = [r for r in rows if hash_unit(str(r["id"]), "heldout:") >= HELD_OUT]
    return traffic, held


def write_quality_file(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """The simulators' labelled prompts (kept in a temporary directory, never in the repo)."""
    lines = (json.dumps({"prompt": r["prompt"], "label": r["label"]}) + "\n" for r in rows)
    path.write_text("".join(lines), encoding="utf-8")


def shadow_config(
    fast: str, precise: str, store: Path, artifact: Path, admin: str, *, judge_ratio: float = 0.0
) -> dict[str, Any]:
    """Gateway settings: the given artifact, every request shadowed into ``store`` (and
    ``judge_ratio`` of the shadows graded by the precise tier)."""
    return {
        "auth": {"enabled": False, "admin_token": admin},
        "tiers": {
            "fast": {"model": "tiergate-fast", "replicas": [fast]},
            "precise": {"model": "tiergate-precise", "replicas": [precise]},
        },
        "router": {
            "artifact": str(artifact),
            "shadow": {
                "fast_ratio": 1.0,
                "precise_ratio": 1.0,
                "max_concurrent": 64,
                "store": str(store),
                "judge_ratio": judge_ratio,
                # one tenant (auth off) whose every request is shadowed on purpose
                "tenant_samples_per_minute": None,
            },
        },
        "telemetry": {"access_log": False},
    }


def admin_call(url: str, token: str, method: str = "GET") -> dict[str, Any]:
    """An admin request; the JSON answer."""
    headers = {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, method=method, headers=headers)  # noqa: S310
    with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310  # loopback URL we built
        data: dict[str, Any] = json.loads(resp.read())
        return data


async def _send(url: str, prompts: list[str], concurrency: int) -> int:
    """Send ``prompts`` as ``model: auto`` chats; the number answered 200."""
    import aiohttp  # noqa: PLC0415 - the client only where traffic is sent

    queue = list(prompts)
    ok = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal ok
        while queue:
            body = body_of(queue.pop())
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                await resp.read()
                ok += resp.status == 200

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return ok


def compared(view: dict[str, Any]) -> tuple[int, int]:
    """(shadows compared, shadows finished any way) in an /admin/routing view."""
    outcomes: dict[str, int] = view.get("shadow", {}).get("outcomes", {})
    done = sum(v for k, v in outcomes.items() if not k.startswith("judge:"))  # not shadows
    return sum(v for k, v in outcomes.items() if k.endswith(":compared")), done


def drive(
    url: str, admin: str, traffic: Sequence[dict[str, Any]], wanted: int, seed: int = 1
) -> dict[str, int]:
    """Send traffic until ``wanted`` shadows were compared; counts of sent and compared."""
    rng = random.Random(seed)  # traffic sampling, not security
    sent = 0
    while True:
        have, done = compared(admin_call(url + "/admin/routing", admin))
        if have >= wanted:
            return {"sent": sent, "compared": have}
        if done < sent:  # shadows still running
            time.sleep(0.05)
            continue
        batch = [rng.choice(traffic)["prompt"] for _ in range(min(512, wanted - have))]
        sent += asyncio.run(_send(url, batch, 16))


def truncate_store(store: Path, records: int, out: Path) -> Path:
    """The first ``records`` records of a (single-file) store, written to ``out``."""
    with store.open(encoding="utf-8") as src:
        lines = [next(src) for _ in range(records)]
    out.write_text("".join(lines), encoding="utf-8")
    return out


def retrain(store: Path, out: Path, report: Path) -> dict[str, Any]:
    """``tiergate router train --from-shadow STORE`` (the CLI's own entry point, in this
    process: its ML imports are already paid for); its JSON report."""
    args = ["train", "--from-shadow", str(store), "--out", str(out), "--report", str(report)]
    printed = io.StringIO()
    if router_cli.main(args, out=printed) != 0:
        raise RuntimeError(f"tiergate router {' '.join(args)} failed")
    data: dict[str, Any] = json.loads(report.read_text(encoding="utf-8"))
    data["printed"] = printed.getvalue()
    return data


def held_out_comparison(old: Path, new: Path, held: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Old against new on the held-out dataset rows, with their dataset labels."""
    x = to_csr([hashed_vector(body_of(r["prompt"])) for r in held])
    y = np.asarray([1.0 if r["label"] == "complex" else 0.0 for r in held])
    base = load_model(old)
    return compare(
        scores(base, x), scores(load_model(new), x), y, float(base.metadata["default_threshold"])
    )


def other_sources_auc(old: Path, new: Path, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """ROC AUC of both artifacts on rows of the sources *not* learned (the price of learning)."""
    from sklearn.metrics import roc_auc_score  # noqa: PLC0415 - only for this check

    x = to_csr([hashed_vector(body_of(r["prompt"])) for r in rows])
    y = np.asarray([1.0 if r["label"] == "complex" else 0.0 for r in rows])
    old_auc = roc_auc_score(y, scores(load_model(old), x))
    new_auc = roc_auc_score(y, scores(load_model(new), x))
    return {
        "rows": len(rows),
        "old_auc": round(float(old_auc), 4),
        "new_auc": round(float(new_auc), 4),
    }


def reload_live(url: str, admin: str, new: Path, live: Path) -> dict[str, Any]:
    """Put ``new`` where the gateway's artifact is configured and hot-reload it."""
    staged = live.with_name(live.name + ".new")
    shutil.copyfile(new, staged)
    staged.replace(live)
    admin_call(url + "/admin/router/reload", admin, method="POST")
    view: dict[str, Any] = admin_call(url + "/admin/routing", admin)["artifact"]
    return view


def _stack(
    work: Path, quality: Path, store: Path, live: Path, admin: str, *, judge_ratio: float = 0.0
) -> tuple[str, list[subprocess.Popen[bytes]]]:
    """Start the two simulators and the gateway; its URL and the processes."""
    from bench.shadow.run import free_port, start, wait  # noqa: PLC0415

    sim = [
        sys.executable,
        "-m",
        "simulator",
        "--latency-scale",
        "0",
        "--quality-file",
        str(quality),
    ]
    fast_port, precise_port, port = free_port(), free_port(), free_port()
    procs = [
        start([*sim, "--profile", "fast", "--port", str(fast_port), "--weak"], work / "f.log"),
        start([*sim, "--profile", "precise", "--port", str(precise_port)], work / "p.log"),
    ]
    config = shadow_config(
        f"http://127.0.0.1:{fast_port}",
        f"http://127.0.0.1:{precise_port}",
        store,
        live,
        admin,
        judge_ratio=judge_ratio,
    )
    (work / "gw.json").write_text(json.dumps(config), encoding="utf-8")
    serve = [
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        str(work / "gw.json"),
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    procs.append(start(serve, work / "g.log"))
    for p in (fast_port, precise_port):
        wait(f"http://127.0.0.1:{p}/health")
    wait(f"http://127.0.0.1:{port}/readyz")
    return f"http://127.0.0.1:{port}", procs


def run(work: Path, requests: int, steps: Sequence[int]) -> dict[str, Any]:
    """The whole loop in ``work``; the result document."""
    admin = "bench-shadow-learn-admin-token-0000000"
    shipped = router_models.load()
    rows = train_rows()
    sources = worst_sources(rows, shipped)
    others = [r for r in every_row() if r["source"] not in sources]
    chosen = [r for r in rows if r["source"] in sources]
    traffic, held = split(chosen)
    write_quality_file(chosen, work / "labels.jsonl")
    store, live = work / "shadow.jsonl", work / "live.npz"
    shutil.copyfile(router_models.DEFAULT_ARTIFACT, live)
    url, procs = _stack(work, work / "labels.jsonl", store, live, admin)
    try:
        started = time.monotonic()
        loop: dict[str, Any] = {**drive(url, admin, traffic, requests)}
        loop["seconds"] = round(time.monotonic() - started, 1)
        results = []
        for step in steps:
            cut = truncate_store(store, step, work / f"store-{step}.jsonl")
            new = work / f"new-{step}.npz"
            started = time.monotonic()
            report = retrain(cut, new, work / f"report-{step}.json")
            report["seconds"] = round(time.monotonic() - started, 1)
            results.append(
                {
                    "records": step,
                    "shadow_report": report,
                    "held_out": held_out_comparison(live, new, held),
                    "other_sources": other_sources_auc(live, new, others),
                }
            )
        live_view = reload_live(url, admin, work / f"new-{steps[-1]}.npz", live)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
    return {
        "rule": (
            f"the {PER_LABEL} train sources of each label the shipped artifact misroutes most: "
            "mean score on a simple source, 1 - mean score on a complex one"
        ),
        "misrouting": {k: round(v, 4) for k, v in misrouting(rows, shipped).items()},
        "sources": sources,
        "traffic_rows": len(traffic),
        "held_out_rows": len(held),
        "loop": loop,
        "steps": results,
        "live_after_reload": live_view,
    }


def _row(records: int, point: dict[str, Any]) -> str:
    old, new = point["old"], point["new"]
    return (
        f"| {records} | {old['complex_caught']:.3f} | {old['simple_sent']:.3f} | "
        f"{new['simple_sent']:.3f} | {point['reduction']:.1%} |"
    )


def markdown(result: dict[str, Any], command: str) -> str:
    """The result as a short Markdown report."""
    live = result["live_after_reload"]
    lines = [
        "# The router learns from shadowed traffic (simulator, quality model)\n",
        f"`{command}`\n",
        f"Sources: {', '.join(result['sources'])} ({result['rule']}).",
        f"Misrouting by source: `{json.dumps(result['misrouting'])}`.\n",
        f"Traffic drawn from {result['traffic_rows']} rows; {result['held_out_rows']} rows held "
        f"out by id hash. Loop: {result['loop']}.\n",
        "Simple prompts sent to precise on the held-out rows, shipped -> retrained, at equal "
        "complex caught (the shipped artifact's operating point first, then fixed levels):\n",
        "| shadow records | complex caught | simple sent, shipped | simple sent, retrained "
        "| reduction |",
        "|---|---|---|---|---|",
    ]
    for step in result["steps"]:
        held = step["held_out"]
        for point in [held["operating_point"], *held["curve"]]:
            lines.append(_row(step["records"], point))
    lines.append(
        "\nThe price: ROC AUC on the router-dev2 rows of every *other* source (eval rows "
        "included), shipped -> retrained:\n"
    )
    for step in result["steps"]:
        other = step["other_sources"]
        lines.append(
            f"- {step['records']} shadow records: {other['old_auc']:.3f} -> "
            f"{other['new_auc']:.3f} ({other['rows']} rows)"
        )
    lines.append(
        f"\nAfter `POST /admin/router/reload`, `/admin/routing` names the live artifact "
        f"`{live['id']}` (trained from shadows: `{json.dumps(live['trained_from_shadow'])}`).\n"
    )
    return "\n".join(lines)


def main() -> int:
    """Run the loop; print and write the result files."""
    import tempfile  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--steps", default="250,500,1000,2000")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "shadow-learn")
    args = parser.parse_args()
    steps = sorted(int(s) for s in args.steps.split(","))
    if steps[-1] > args.requests:
        parser.error("the largest step exceeds --requests")
    with tempfile.TemporaryDirectory() as tmp:
        result = run(Path(tmp), args.requests, steps)
    command = (
        f".venv/bin/python bench/shadow/learn.py --requests {args.requests} --steps {args.steps}"
    )
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    text = markdown(result, command)
    args.out.with_suffix(".md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
