"""Small claims in README.md and docs/ checked against the code that makes them true."""

from __future__ import annotations

from pathlib import Path

from gateway.context import request_id_from
from gateway.settings import ServerSettings
from policies.requests import COMPLETIONS_DEFAULT_MAX_TOKENS, default_max_tokens
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

