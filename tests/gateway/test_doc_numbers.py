"""Numbers quoted in README.md and docs/ checked against the committed result files they cite,
and the limits docs/security.md states checked against the code's defaults."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gateway.config.settings import Settings
from gateway.config.tier_settings import TierSettings
from gateway.http import collector, native, protocol
from gateway.limits import limiter_redis
from gateway.limits.limits import limiter_lease_s
from gateway.upstream import connection, sse
from policies.keys import MAX_EXPIRY_DAYS

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
CLASSIFY = REPO / "bench" / "classify"


def _flat(path: Path) -> str:
    return " ".join(path.read_text(encoding="utf-8").split())


def _json_blocks(path: Path) -> list[Any]:
    text = path.read_text(encoding="utf-8")
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", text, re.DOTALL)]


def test_security_md_limits_are_the_code_defaults() -> None:
    """Every bracketed default and fixed bound of docs/security.md is the code's value."""
    doc = _flat(REPO / "docs/security.md")
    settings = Settings()
    server = settings.server
    assert settings.requests.max_json_depth == 64
    assert "`requests.max_json_depth` [64]" in doc
    assert server.max_body_bytes == 4 * 1024 * 1024
    assert "`server.max_body_bytes` [4 MiB]" in doc
    assert native.LINGER_S == 5.0
    assert "read and dropped for at most 5 s" in doc
    assert (connection.MAX_HEAD_BYTES, sse.MAX_EVENT) == (64 * 1024, 1024 * 1024)
    assert "a response head of at most 64 KiB and a streamed event of at most 1 MiB" in doc
    bracketed = {
        "max_head_bytes": (server.max_head_bytes, 16 * 1024, "[16 KiB]"),
        "head_timeout_s": (server.head_timeout_s, 10.0, "[10 s]"),
        "body_timeout_s": (server.body_timeout_s, 10.0, "[10 s]"),
        "body_min_rate_bytes_s": (server.body_min_rate_bytes_s, 1024, "[1 KiB/s]"),
        "idle_timeout_s": (server.idle_timeout_s, 75.0, "[75 s]"),
        "write_timeout_s": (server.write_timeout_s, 60.0, "[60 s]"),
    }
    for name, (value, expected, said) in bracketed.items():
        assert value == expected, name
        assert f"`{name}` {said}" in doc, name
    assert protocol.MAX_PIPELINE == 32
    assert "at most 32 pipelined requests" in doc
    assert {tier.max_tokens_cap for tier in settings.tiers.values()} == {4096}
    assert "(default: `max_tokens_cap`, 4,096)" in doc
    assert MAX_EXPIRY_DAYS == 3650
    assert "expiry is at most 10 years" in doc


def test_the_slot_lease_and_the_orphan_retries_of_security_md() -> None:
    """A slot whose release Redis did not take is retried every 0.5 s for up to a minute; then
    its 15 s lease, no longer renewed, bounds it. A live holder renews the lease for at most
    the longest tier timeout + 60 s."""
    doc = _flat(REPO / "docs/security.md")
    assert "retried in the background every 0.5 s for up to a minute" in doc
    assert "then the slot's 15 s lease, no longer renewed, still bounds it" in doc
    assert limiter_redis.SLOT_LEASE_S == 15.0
    retry_s, tries = limiter_redis._ORPHAN_RETRY_S, limiter_redis._ORPHAN_TRIES
    assert (retry_s, retry_s * tries) == (0.5, 60.0)
    tiers = Settings().tiers
    assert limiter_lease_s(tiers) == 660.0  # the default tiers' 600 s + 60 s
    tier = next(iter(tiers.values()))
    short, long = _with_total(tier, 30), _with_total(tier, 120)
    assert limiter_lease_s({"fast": short, "precise": long}) == 180.0


def _with_total(tier: TierSettings, total_s: float) -> TierSettings:
    timeouts = tier.timeouts.model_copy(update={"total_s": total_s})
    return tier.model_copy(update={"timeouts": timeouts})


def test_the_full_collection_schedule_of_security_md() -> None:
    """A full garbage collection every 10 s while passes find much garbage, the wait doubling
    up to 160 s while they find little."""
    doc = _flat(REPO / "docs/security.md")
    assert (collector.FULL_INTERVAL_S, collector.FULL_LONGEST_S) == (10.0, 160.0)
    assert collector.next_wait(10.0, collector.MUCH_GARBAGE) == 10.0
    assert collector.next_wait(10.0, 0) == 20.0
    assert collector.next_wait(160.0, 0) == 160.0
    assert "a full garbage collection runs every 10 s to 160 s" in doc


def test_savings_md_quotes_the_shadow_run_of_its_result_file() -> None:
    """docs/savings.md and README quote bench/results/shadow.md's counts, cost and quality,
    for the callers' answers and with the shadows' own cost counted."""
    routing, usage = _json_blocks(RESULTS / "shadow.md")
    rows = {row["tier"]: row for row in usage["rows"]}
    total, shadow = usage["total"], usage["shadow"]["total"]
    callers = total["cost"] - shadow["cost"]
    routed = 1 - callers / total["baseline_cost"]  # the savings of routing alone
    saids = [
        f"{total['requests'] - shadow['requests']} requests, {rows['fast']['requests']} fast / "
        f"{rows['precise']['requests']} precise, cost {callers:.2f} vs "
        f"{total['baseline_cost']:.2f} all-precise (savings {routed:.0%})",
        f"cost {shadow['cost']:.2f} more ({shadow['requests']} shadow answers)",
        f"it is {total['cost']:.2f} (savings {total['savings_share']:.0%})",
        f"quality retained {routing['quality_retained']:.2f}",
    ]
    doc = _flat(REPO / "docs/savings.md")
    for said in saids:
        assert said.replace("%", " %") in doc
    readme = _flat(REPO / "README.md")
    assert f"cost **{total['cost']:.2f} vs {total['baseline_cost']:.2f}** all-precise" in readme
    assert (
        f"{callers:.2f}, {1 - callers / total['baseline_cost']:.0%} saved".replace("%", " %")
        in readme
    )


def test_savings_md_quotes_the_learning_run_of_its_result_file() -> None:
    """The 2,000-shadow figures of docs/savings.md are bench/results/shadow-learn.md's."""
    text = (RESULTS / "shadow-learn.md").read_text(encoding="utf-8")
    shipped, retrained = re.search(
        r"^\| 2000 \| 0\.9\d\d \| (0\.\d+) \| (0\.\d+) \| [\d.]+% \|$", text, re.MULTILINE
    ).groups()  # type: ignore[union-attr]
    before, after = re.search(r"2000 shadow records: (0\.\d+) -> (0\.\d+)", text).groups()  # type: ignore[union-attr]
    doc = _flat(REPO / "docs/savings.md")
    assert f"from {shipped} to {retrained}" in doc
    assert f"sends {retrained} of the held-out simple prompts" in doc
    assert doc.count(f"falls from {before} to {after}") == 2


def _tiergate_rates(path: Path, leg: str) -> str:
    """``a / b / c`` req/s of one leg at c=1/16/64 in an overhead report."""
    row = rf"^\| {re.escape(leg)} \| (?:1|16|64) \| ([\d,]+) \|"
    rates = re.findall(row, path.read_text(encoding="utf-8"), re.M)
    assert len(rates) == 3, (path.name, leg)
    return " / ".join(rates)


def test_performance_md_quotes_the_epyc_runs_it_names() -> None:
    """The 2026-12-03 evening and 2026-12-04 runs of docs/performance.md are their files'."""
    doc = _flat(REPO / "docs/performance.md")
    reps = RESULTS / "overhead-reps"
    full, plain = reps / "epyc3-full-1-8402102.md", reps / "epyc3-plain-3-8402102.md"
    assert f"TierGate {_tiergate_rates(full, 'TierGate (full)')} req/s at c=1/16/64" in doc
    assert f"Portkey 1.15.2 {_tiergate_rates(full, 'Portkey gateway 1.15.2')};" in doc
    assert f"TierGate {_tiergate_rates(plain, 'TierGate (plain)')} req/s;" in doc
    assert f"Portkey {_tiergate_rates(plain, 'Portkey gateway 1.15.2')};" in doc
    for name, leg in (("epyc4-full-1-83efb1e.md", "full"), ("epyc4-plain-1-83efb1e.md", "plain")):
        rates = _tiergate_rates(reps / name, f"TierGate ({leg})")
        assert f"`{leg}`: TierGate {rates}" in doc


def test_readme_and_router_md_quote_the_held_out_reports() -> None:
    """The headline AUC and simple-sent share are heldout-eval.txt's and loso-v8.txt's."""
    held = (CLASSIFY / "heldout-eval.txt").read_text(encoding="utf-8")
    auc, sent = re.search(
        r"leave-one-source-out.*?\n\s+ROC AUC (0\.\d+); catching 95 % of complex sends ([\d.]+)%",
        held,
    ).groups()  # type: ignore[union-attr]
    loso = (CLASSIFY / "loso-v8.txt").read_text(encoding="utf-8")
    pooled = re.search(r"every held-out row: .*?ROC AUC (0\.\d+)", loso).group(1)  # type: ignore[union-attr]
    cjk = re.search(r"Chinese \+ Japanese: .*?ROC AUC (0\.\d+)", loso).group(1)  # type: ignore[union-attr]
    readme, router = _flat(REPO / "README.md"), _flat(REPO / "docs/router.md")
    assert f"AUC **{float(pooled):.3f}**" in readme
    assert f"**AUC {float(pooled):.3f}**" in router
    for doc in (readme, router):
        assert f"Chinese + Japanese **{float(cjk):.3f}**" in doc
    assert f"ROC AUC **{float(auc):.3f}**" in readme
    assert f"**ROC AUC {float(auc):.3f}**" in router
    assert f"**{sent} %**" in readme
    assert f"**{sent} %**" in router


def _within_source(path: Path) -> str:
    """Within-source AUC of the six both-label sources, in router.md's table order."""
    text = path.read_text(encoding="utf-8")
    names = ("ape210k", "aqua", "tal_scq5k", "jmmlu", "dm_mathematics", "followbench")
    return " / ".join(
        re.search(rf"^  {name}\s+\d+\s+\d+\s+[\d.]+\s+([\d.]+)", text, re.M).group(1)  # type: ignore[union-attr]
        for name in names
    )


def test_router_md_round_tables_quote_their_reports() -> None:
    """Rounds 12-14: the within-source AUC rows are those of the committed LOSO reports."""
    doc = _flat(REPO / "docs/router.md")
    base = _within_source(CLASSIFY / "loso-round12-base.txt")
    for name in ("loso-round12.txt", "loso-round13.txt", "loso-round14.txt"):
        assert f"| {base} | {_within_source(CLASSIFY / name)} |" in doc, name


def _c16(path: Path, leg: str) -> int:
    """req/s of the row whose setup starts with ``leg`` at c=16 in an overhead report."""
    row = rf"^\| {re.escape(leg)}[^|]* \| 16 \| ([\d,]+) \|"
    return int(re.search(row, path.read_text(encoding="utf-8"), re.M).group(1).replace(",", ""))  # type: ignore[union-attr]


def _k_range(values: list[int], digits: int = 0) -> str:
    """``low-high`` in thousands, as the docs write a machine's range."""
    low, high = min(values) / 1000, max(values) / 1000
    return f"{low:.{digits}f}-{high:.{digits}f}k"


def test_the_machine_ranges_are_those_of_the_kept_runs() -> None:
    """The direct upstream's and vllm-router's c=16 ranges of the 2026-12-03 evening and
    2026-12-04 machines, in performance.md and overhead-reps/README.md, span their files."""
    reps = RESULTS / "overhead-reps"
    epyc3 = sorted(reps.glob("epyc3-*.md"))
    direct = _k_range([_c16(path, "fixed upstream (direct)") for path in epyc3])
    router = _k_range([_c16(path, "vllm-router") for path in epyc3], 1)
    epyc4 = sorted(reps.glob("epyc4-*.md"))
    direct4 = _k_range([_c16(path, "fixed upstream (direct)") for path in epyc4])
    performance = _flat(REPO / "docs/performance.md")
    assert f"did {direct} req/s direct at c=16, vllm-router {router};" in performance
    assert f"({direct4} req/s direct at c=16" in performance.replace("(fixed upstream ", "(")
    readme = _flat(reps / "README.md")
    assert f"did {direct} req/s direct at c=16, vllm-router {router}:" in readme
    assert f"did {direct4} req/s direct at c=16" in readme


def _streams_added(path: Path, leg: str) -> list[tuple[float, float]]:
    """(added TTFT p99, added gap p99) of every ladder row of ``leg`` at 1,000 streams."""
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if len(cells) == 13 and cells[0].startswith(leg) and cells[1] == "1,000":
            ttft = re.search(r"\(\S+ / ([+-][\d.]+)\)", cells[5])
            gap = re.search(r"\(\S+ / ([+-][\d.]+) / \S+\)", cells[6])
            if ttft and gap:
                found.append((float(ttft.group(1)), float(gap.group(1))))
    return found


def _span(values: list[float]) -> str:
    return f"{min(values):+.1f} to {max(values):+.1f} ms"


def test_readme_streams_row_spans_the_fifth_rounds_runs() -> None:
    """README's 1,000-stream gap and TTFT ranges are the fifth round's TierGate legs' (the
    three rated-load A/Bs, the quiet peer run and the full path taken apart)."""
    names = [f"streams-accept-eager-ab{tail}.md" for tail in ("", "-2", "-3")]
    names += ["streams-peers-quiet.md", "streams-full-parts.md"]
    plain = [row for name in names for row in _streams_added(RESULTS / name, "TierGate (plain)")]
    full = [row for name in names for row in _streams_added(RESULTS / name, "TierGate (full)")]
    assert len(plain) == 9
    assert len(full) == 3
    readme = _flat(REPO / "README.md")
    gap, ttft = _span([g for _, g in plain]), _span([t for t, _ in plain])
    assert f"added gap p99 **{gap}**, added TTFT p99 {ttft} on a quiet machine" in readme
    full_ttft, full_gap = _span([t for t, _ in full]), _span([g for _, g in full])
    assert f"tracing: TTFT p99 {full_ttft}, gap p99 {full_gap};" in readme


def _rows(name: str) -> list[dict[str, str]]:
    path = REPO / "router_models/training/data" / name
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _lang(row: dict[str, str]) -> str:
    return row["category"].rsplit("/", 1)[-1]


def _median_chars(rows: list[dict[str, str]], label: str) -> int:
    lengths = sorted(len(row["prompt"]) for row in rows if row["label"] == label)
    middle = len(lengths) // 2
    value = lengths[middle] if len(lengths) % 2 else (lengths[middle - 1] + lengths[middle]) / 2
    return int(value + 0.5)


def _longer(rows: list[dict[str, str]]) -> str:
    """How the cards say complex prompts are longer: median characters, complex first."""
    complex_, simple = _median_chars(rows, "complex"), _median_chars(rows, "simple")
    return f"median {complex_} characters against {simple}"


def test_router_data_cards_count_the_committed_files() -> None:
    """Every count per source, language and label of docs/router-data.md (and the totals
    router.md repeats) is the committed jsonl files'."""
    cards, router = _flat(REPO / "docs/router-data.md"), _flat(REPO / "docs/router.md")
    external = _rows("external-train.jsonl")
    for source in sorted({row["source"] for row in external}):
        mine = [row for row in external if row["source"] == source]
        (lang,) = {_lang(row) for row in mine}
        simple = sum(row["label"] == "simple" for row in mine)
        assert f"| {source} | {lang} | {simple} | {len(mine) - simple} |" in cards, source
    simple = sum(row["label"] == "simple" for row in external)
    assert f"| **{simple:,}** | **{len(external) - simple:,}** |" in cards
    cjk = sum(_lang(row) in ("zh", "ja") for row in external)
    share = f"{cjk / len(external):.1%}".replace("%", " %")
    assert f"The total is {len(external):,} prompts. {cjk:,} of them ({share})" in cards
    assert f"({len(external):,} prompts, {cjk / len(external):.0%}".replace("%", " %") in router
    ape = [row for row in external if row["source"] == "ape210k"]
    assert _longer(ape) in cards
    follow = _rows("followbench.jsonl")
    for lang in ("en", "zh"):
        mine = [row for row in follow if _lang(row) == lang]
        simple = sum(row["label"] == "simple" for row in mine)
        assert f"| {lang} | {simple} | {len(mine) - simple} |" in cards
    simple, zh = sum(r["label"] == "simple" for r in follow), sum(_lang(r) == "zh" for r in follow)
    assert f"| **total** | **{simple}** | **{len(follow) - simple}** |" in cards
    total, complex_ = len(follow), len(follow) - simple
    assert f"{total} prompts, {zh} ({zh / total:.1%}) Chinese".replace("%", " %") in cards
    assert f"({total} prompts, {simple} simple / {complex_} complex, {zh} Chinese" in router


def test_step_count_cards_count_the_committed_files() -> None:
    """StepGame's and Multi-LogiEval's counts per hop / depth family and their medians."""
    cards = _flat(REPO / "docs/router-data.md")
    steps = _rows("stepgame.jsonl")
    hops = {hop: sum(row["category"] == f"hop{hop}/en" for row in steps) for hop in (1, 3, 4)}
    assert {_lang(row) for row in steps} == {"en"}
    assert (
        f"{hops[1]} simple (k = 1), {hops[3] + hops[4]} complex ({hops[3]} at k = 3, "
        f"{hops[4]} at k = 4), all English"
    ) in cards
    assert _longer(steps) in cards
    logic = _rows("multi_logieval.jsonl")
    assert {_lang(row) for row in logic} == {"en"}

    def family(label: str) -> str:
        mine = [row["category"].split("-")[0] for row in logic if row["label"] == label]
        return ", ".join(f"{name} {mine.count(name)}" for name in ("fol", "nm", "pl"))

    assert f"({family('simple')};" in cards
    assert f"complex of 700 ({family('complex')})" in cards
    assert _longer(logic) in cards


def _source_auc(path: Path, name: str) -> str:
    row = rf"^  {name}\s+\d+\s+\d+\s+[\d.]+\s+([\d.]+)"
    return re.search(row, path.read_text(encoding="utf-8"), re.M).group(1)  # type: ignore[union-attr]


def test_router_md_step_count_and_encoder_tables_quote_their_reports() -> None:
    """The StepGame / Multi-LogiEval LOSO table is loso-rule-s*.txt's; the encoder table is
    encoder-check.md's."""
    router = _flat(REPO / "docs/router.md")
    with_new, without = CLASSIFY / "loso-rule-s.txt", CLASSIFY / "loso-rule-s-base.txt"
    names = ("jmmlu", "ape210k", "tal_scq5k", "aqua", "dm_mathematics", "followbench")
    after = ", ".join(_source_auc(with_new, name) for name in names)
    before = ", ".join(_source_auc(without, name) for name in names)
    assert f"| {after} | {before} |" in router
    held = f"**{_source_auc(with_new, 'stepgame')}** / {_source_auc(with_new, 'multi_logieval')}"
    assert f"stepgame / multi_logieval (held out) | {held} |" in router
    for path in (with_new, without):
        pooled = r"every held-out row: n=(\d+) .*?ROC AUC (0\.\d+)"
        n, auc = re.search(pooled, path.read_text(encoding="utf-8")).groups()  # type: ignore[union-attr]
        assert f"{float(auc):.3f} ({int(n):,} rows)" in router
    text = (CLASSIFY / "encoder-check.md").read_text(encoding="utf-8")
    for said, name in (("shipped features", "features"), ("encoder embedding", "encoder")):
        cells = re.search(rf"^\| {name} \(C = \d\) \| (.*) \|$", text, re.M).group(1).split(" | ")  # type: ignore[union-attr]
        auc, ece, zh = float(cells[0]), float(cells[2]), float(cells[5])
        sent = cells[1].replace("%", " %")
        assert f"| {auc:.3f} | {sent} | {ece:.3f} | {zh:.3f} |" in router, said
