"""Small claims in README.md and docs/ checked against the code that makes them true."""

from __future__ import annotations

import ast
import inspect
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gateway.access.key_cache import DEGRADED_TTL_S, KeyCache
from gateway.access.key_feed import KeyChangeFeed
from gateway.config.router_settings import RouterSettings
from gateway.config.settings import AuthSettings, ServerSettings, Settings
from gateway.pipeline.context import request_id_from
from policies.requests import COMPLETIONS_DEFAULT_MAX_TOKENS, default_max_tokens
from router_models.records import body_of
from tests.adversarial.test_keys_revocation import BOUND_S

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
API_DOC = (REPO / "docs/api.md").read_text(encoding="utf-8")
ACCESS_DOC = (REPO / "docs/access.md").read_text(encoding="utf-8")
SECURITY_DOC = (REPO / "docs/security.md").read_text(encoding="utf-8")


def _flat(text: str) -> str:
    return " ".join(text.split())


def _docs() -> dict[Path, str]:
    paths = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return {path: path.read_text(encoding="utf-8") for path in paths}


def test_docs_address_the_gateway_on_its_own_port() -> None:
    """The gateway listens on 8080 by default; no doc sends gateway traffic to :8000 (vLLM's)."""
    assert ServerSettings().port == 8080
    wrong = [path.name for path, text in _docs().items() if "gateway:8000" in text]
    assert wrong == []


def test_the_request_id_length_limit_is_documented_and_enforced() -> None:
    """A caller's x-request-id of at most 128 printable characters is echoed; longer is replaced."""
    assert "at most 128 printable characters" in _flat(API_DOC)
    assert request_id_from("r" * 128) == "r" * 128
    assert request_id_from("r" * 129) != "r" * 129
    assert request_id_from("bad\nid") != "bad\nid"


def test_completions_without_max_tokens_get_16_as_documented() -> None:
    """/v1/completions without max_tokens gets 16 (the API's default), under the same caps."""
    assert COMPLETIONS_DEFAULT_MAX_TOKENS == 16
    assert default_max_tokens([4096], None, "completion") == 16
    assert default_max_tokens([4096], 8, "completion") == 8
    assert default_max_tokens([4096], None, "chat") == 4096
    assert "`/v1/completions` gets the API's default of 16" in _flat(ACCESS_DOC)
    assert "`/v1/completions`: 16, the API's default" in _flat(SECURITY_DOC)


def test_revocation_timing_is_stated_one_way_the_test_bound() -> None:
    """README and docs give the bound the revocation tests check (1 s), not milliseconds or ~1 s."""
    assert BOUND_S == 1.0
    for doc in (README, ACCESS_DOC, SECURITY_DOC):
        assert "within 1 s on every other replica" in _flat(doc)
    for path, text in _docs().items():
        flat = _flat(text)
        assert "within milliseconds on every other" not in flat, path.name
        assert "every other replica within milliseconds" not in flat, path.name
        assert "within ~1 s" not in flat, path.name


_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks, inline code removed."""
    lines: list[str] = []
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(re.sub(r"`[^`]*`", "", line))
    return lines


def _anchors(text: str) -> set[str]:
    """The fragment ids GitHub gives a document's headings (duplicates get -1, -2, ...)."""
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        heading = None if fenced else _HEADING.match(line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _broken_links(path: Path) -> list[str]:
    """Relative links of ``path`` whose file or heading does not exist."""
    broken: list[str] = []
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        for target in _LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            name, _, fragment = target.partition("#")
            linked = (path.parent / name).resolve() if name else path
            if not linked.exists():
                broken.append(f"{path.relative_to(REPO)}: {target} (no such file)")
            elif (
                linked.suffix == ".md"
                and fragment
                and fragment not in _anchors(linked.read_text(encoding="utf-8"))
            ):
                broken.append(f"{path.relative_to(REPO)}: {target} (no such heading)")
    return broken


def test_links_between_readme_and_docs_resolve() -> None:
    """Every relative link in README.md, docs/ and deploy/ names an existing file and heading."""
    paths = [*_docs(), REPO / "deploy/README.md"]
    assert [broken for path in paths for broken in _broken_links(path)] == []


def test_the_link_check_sees_a_broken_file_and_a_broken_heading(tmp_path: Path) -> None:
    """The link check reports a missing file and a missing heading, and passes a good link."""
    (tmp_path / "other.md").write_text("# Title\n\n## The `model` table\n", encoding="utf-8")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](other.md#the-model-table) [gone](nowhere.md) [bad](other.md#nope)\n"
        "`[in code](skipped.md)`\n```\n[fenced](skipped.md)\n```\n",
        encoding="utf-8",
    )
    texts = _prose_lines(doc.read_text(encoding="utf-8"))
    targets = [t for line in texts for t in _LINK.findall(line)]
    assert targets == ["other.md#the-model-table", "nowhere.md", "other.md#nope"]
    assert _anchors((tmp_path / "other.md").read_text(encoding="utf-8")) == {
        "title",
        "the-model-table",
    }


def test_readme_is_a_landing_page_of_at_most_300_lines() -> None:
    """The README orients (at most 300 lines); reference and results live in docs/."""
    assert len(README.splitlines()) <= 300


def _has_code(path: Path) -> bool:
    """More than a docstring (a sub-package's ``__init__.py`` that only names the room)."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return not (len(body) == 1 and isinstance(body[0], ast.Expr))


def test_the_architecture_page_names_every_gateway_module() -> None:
    """docs/architecture.md's module table names every module under gateway/ by its path."""
    page = (REPO / "docs/architecture.md").read_text(encoding="utf-8")
    gateway = REPO / "gateway"
    modules = sorted(
        path.relative_to(gateway).as_posix()
        for path in gateway.rglob("*.py")
        if path.name != "__init__.py" or _has_code(path)
    )
    assert modules
    assert [module for module in modules if f"`{module}`" not in page] == []


def test_ratelimit_default_completion_tokens_still_loads_and_nothing_reads_it() -> None:
    """docs/vllm-compat.md: ``ratelimit.default_completion_tokens`` is no longer used, kept so
    configurations load."""
    loaded = Settings.model_validate({"ratelimit": {"default_completion_tokens": 99}})
    assert loaded.ratelimit.default_completion_tokens == 99
    readers = [
        path.relative_to(REPO).as_posix()
        for folder in ("gateway", "policies")
        for path in (REPO / folder).rglob("*.py")
        if "default_completion_tokens" in path.read_text(encoding="utf-8")
    ]
    assert readers == ["gateway/config/settings.py"]


def test_the_key_cache_and_feed_bounds_of_key_revocation_md() -> None:
    """docs/key-revocation.md: cache_ttl_s 30 s, unknown ids 10 s (at most 10,000), the key
    file checked every 1 s, 1 s trust without pub/sub, a PING after 5 s of silence."""
    auth = AuthSettings()
    assert (auth.cache_ttl_s, auth.unknown_key_cache_ttl_s) == (30.0, 10.0)
    assert auth.keys_reload_interval_s == 1.0
    assert inspect.signature(KeyCache).parameters["max_unknown"].default == 10_000
    assert DEGRADED_TTL_S == 1.0
    assert inspect.signature(KeyChangeFeed).parameters["ping_interval_s"].default == 5.0
    doc = _flat((REPO / "docs/key-revocation.md").read_text(encoding="utf-8"))
    for said in ("(30 s)", "(10 s)", "(1 s by default)", "at most 10,000", "after 5 s of silence"):
        assert said in doc


def test_the_example_file_of_configuration_md_is_a_valid_configuration() -> None:
    """docs/configuration.md's example YAML loads under the strict settings, values as written."""
    page = (REPO / "docs/configuration.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```yaml\n(.*?)```", page, flags=re.DOTALL)
    settings = Settings.model_validate(yaml.safe_load(block))
    assert set(settings.tiers) == {"fast", "precise"}
    assert settings.tiers["fast"].default_max_tokens == 1024
    assert settings.queue.batch_wait_s == 10


def test_the_fallback_of_an_explicit_tier_is_documented_for_a_full_tier_too() -> None:
    """`model: fast` falls back to precise when fast is full past its queue wait, not only when
    it has no healthy replica (tests/integration/test_faults.py::
    test_a_full_fast_tier_falls_back_to_precise); README's model table, docs/api.md's
    saturation row and the setting's description say both."""
    row = next(line for line in README.splitlines() if line.startswith("| a tier name"))
    assert "full" in row
    saturated = next(line for line in API_DOC.splitlines() if "every replica saturated" in line)
    assert "fallback_to_precise" in saturated
    description = RouterSettings.model_fields["fallback_to_precise"].description
    assert description is not None
    assert "full" in description


def test_the_existing_vllm_walkthrough_directory_keeps_its_secrets_out_of_git() -> None:
    """docs/existing-vllm.md works in `tiergate-prod/` inside the checkout and writes the admin
    token there: git must ignore it, or a `git add -A` commits the token."""
    doc = (REPO / "docs/existing-vllm.md").read_text(encoding="utf-8")
    made = re.search(r"mkdir -p (\S+) && cd \1", doc)
    assert made is not None
    secret = f"{made.group(1)}/admin-token"
    assert f"> {Path(secret).name}" in doc  # the walkthrough writes the token there
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", secret], cwd=REPO, check=False, capture_output=True
    )
    assert ignored.returncode == 0, f"{secret} is not git-ignored"


def test_the_calibrate_sample_format_is_shown_and_readable() -> None:
    """docs/router.md's share dial tells how to calibrate on `traffic.jsonl`: it must show what
    a line of that file looks like (the command reads `prompt` or `messages`), and every line it
    shows must be one the command accepts."""
    doc = (REPO / "docs/router.md").read_text(encoding="utf-8")
    section = doc[doc.index("## The share dial") : doc.index("## A dial per tenant")]
    sample = re.search(r"```jsonl\n(.*?)```", section, re.DOTALL)
    assert sample is not None, "no example of traffic.jsonl's lines"
    lines = [line for line in sample.group(1).splitlines() if line.strip()]
    assert {"prompt", "messages"} <= {key for line in lines for key in json.loads(line)}
    for line in lines:
        assert body_of(json.loads(line))


def test_the_deployment_blocks_set_every_variable_they_use() -> None:
    """docs/deployment.md's command blocks cannot be run as marked blocks (Docker, Helm), so
    check what a reader pasting them meets first: each `$NAME` a block reads is set in it
    (the compose block used to print the key, then curl `$KEY`, which nothing had set)."""
    doc = (REPO / "docs/deployment.md").read_text(encoding="utf-8")
    for block in re.findall(r"```(?:sh|bash)\n(.*?)```", doc, re.DOTALL):
        used = set(re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)", block))
        assigned = set(re.findall(r"(?:^|[\s;(])(?:export )?([A-Z_][A-Z0-9_]*)=", block, re.M))
        assert used <= assigned, (used - assigned, block)
