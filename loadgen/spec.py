"""What a run measures: targets, prompt/output shapes, load levels and SLOs, parsed from text."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit


class SpecError(ValueError):
    """A command-line value that cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Target:
    """One leg of a run: a server, the model asked of it, and its key (never shown)."""

    name: str
    url: str
    model: str
    api_key: str | None = field(default=None, repr=False, compare=False)
    vs: str | None = None  # the target this one is compared with

    def endpoint(self, path: str) -> str:
        """The full URL of ``path`` (``/v1/chat/completions``...)."""
        return self.url + path

    def public(self) -> dict[str, str]:
        """What reports may show: name, URL and model, never the key."""
        shown = {
            "name": self.name,
            "url": self.url,
            "model": self.model,
            "auth": "bearer" if self.api_key else "none",
        }
        if self.vs:
            shown["vs"] = self.vs
        return shown


@dataclass(frozen=True, slots=True)
class Shape:
    """One prompt length x output length cell of the grid."""

    prompt_name: str
    prompt_tokens: int | None  # None: prompts come from the user's file
    output_name: str
    output_tokens: int

    @property
    def label(self) -> str:
        """``short/long``: prompt length name, then output length name."""
        return f"{self.prompt_name}/{self.output_name}"


@dataclass(frozen=True, slots=True)
class Load:
    """How requests arrive: a concurrency cap and/or a request rate (inf: all at once)."""

    concurrency: int | None
    rate: float
    arrival: str = "poisson"

    @property
    def label(self) -> str:
        """``c=4 rate=inf``."""
        conc = "unbounded" if self.concurrency is None else str(self.concurrency)
        rate = "inf" if math.isinf(self.rate) else f"{self.rate:g}/s"
        return f"c={conc} rate={rate}"


@dataclass(frozen=True, slots=True)
class Slo:
    """Per-request limits for goodput, in milliseconds; None: not constrained."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def is_set(self) -> bool:
        """True when at least one limit is given."""
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2el_ms))

    def as_dict(self) -> dict[str, float]:
        """The limits that are set."""
        values = {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2el_ms": self.e2el_ms}
        return {k: v for k, v in values.items() if v is not None}


def _pairs(text: str, what: str) -> list[tuple[str, str]]:
    pairs = []
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise SpecError(f"{what}: expected key=value[,key=value...], got {text!r}")
        pairs.append((key.strip(), value.strip()))
    return pairs


def _positive_number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SpecError(f"{what}: {text!r} is not a number") from None
    if not value > 0 or math.isnan(value):
        raise SpecError(f"{what}: {text!r} must be > 0")
    return value


def _positive_int(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise SpecError(f"{what}: {text!r} is not a whole number") from None
    if value < 1:
        raise SpecError(f"{what}: {text!r} must be >= 1")
    return value


def parse_lengths(text: str, what: str) -> list[tuple[str, int]]:
    """``short=128,long=1024`` (or plain ``128,1024``) as named token counts."""
    lengths: list[tuple[str, int]] = []
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep:
            name, value = item.strip(), item
        if not name.strip():
            raise SpecError(f"{what}: empty entry in {text!r}")
        lengths.append((name.strip(), _positive_int(value.strip(), what)))
    names = [n for n, _ in lengths]
    if len(set(names)) != len(names):
        raise SpecError(f"{what}: names repeat in {text!r}")
    return lengths


def parse_concurrency(text: str) -> list[int | None]:
    """``1,4,16``; ``0`` or ``inf`` means no cap (use it with a request rate)."""
    levels: list[int | None] = []
    for item in (part.strip() for part in text.split(",")):
        if item in ("0", "inf", "unbounded"):
            levels.append(None)
        else:
            levels.append(_positive_int(item, "--concurrency"))
    return levels


def parse_rates(text: str) -> list[float]:
    """``inf`` (all at once, the default) or requests per second, e.g. ``2,8``."""
    rates = []
    for item in (part.strip() for part in text.split(",")):
        rates.append(math.inf if item == "inf" else _positive_number(item, "--request-rate"))
    return rates


def parse_slo(text: str) -> Slo:
    """``ttft_ms=500,tpot_ms=50,e2el_ms=10000`` (any subset)."""
    values: dict[str, float] = {}
    for key, value in _pairs(text, "--slo"):
        if key not in ("ttft_ms", "tpot_ms", "e2el_ms"):
            raise SpecError(f"--slo: unknown limit {key!r} (use ttft_ms, tpot_ms, e2el_ms)")
        values[key] = _positive_number(value, f"--slo {key}")
    return Slo(**values)


def normalise_url(text: str, what: str) -> str:
    """``http://host:port`` with any trailing ``/`` and ``/v1`` removed; only http(s)."""
    parts = urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SpecError(f"{what}: {text!r} is not an http:// or https:// URL")
    if parts.username or parts.password:
        raise SpecError(f"{what}: put credentials in --api-key-env/--api-key-file, not the URL")
    url = text.strip().rstrip("/")
    return url.removesuffix("/v1")


def read_api_key(env: str | None, path: str | None, what: str) -> str | None:
    """The key from an environment variable or a file; errors name the source, never a value."""
    if env and path:
        raise SpecError(f"{what}: give api-key-env or api-key-file, not both")
    if env:
        value = os.environ.get(env, "").strip()
        if not value:
            raise SpecError(f"{what}: environment variable {env} is not set or empty")
        return value
    if path:
        try:
            value = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise SpecError(f"{what}: cannot read key file {path}: {exc.strerror}") from None
        if not value:
            raise SpecError(f"{what}: key file {path} is empty")
        return value
    return None


def parse_target(
    text: str, default_model: str | None, default_env: str | None, default_file: str | None
) -> Target:
    """``name=gw,url=http://127.0.0.1:8080[,model=fast][,vs=direct][,api-key-env=VAR|...]``."""
    fields = dict(_pairs(text, "--target"))
    unknown = set(fields) - {"name", "url", "model", "vs", "api-key-env", "api-key-file"}
    if unknown:
        raise SpecError(f"--target: unknown field(s) {', '.join(sorted(unknown))}")
    if "url" not in fields or "name" not in fields:
        raise SpecError(f"--target: needs name= and url=, got {text!r}")
    model = fields.get("model") or default_model
    if not model:
        raise SpecError(f"--target {fields['name']}: needs model= (or --model)")
    env, path = fields.get("api-key-env"), fields.get("api-key-file")
    if env is None and path is None:
        env, path = default_env, default_file
    what = f"--target {fields['name']}"
    return Target(
        name=fields["name"],
        url=normalise_url(fields["url"], what),
        model=model,
        api_key=read_api_key(env, path, what),
        vs=fields.get("vs"),
    )


def grid(prompts: list[tuple[str, int]] | None, outputs: list[tuple[str, int]]) -> list[Shape]:
    """Every prompt length x output length; ``prompts`` None means the user's file."""
    if prompts is None:
        return [Shape("file", None, name, tokens) for name, tokens in outputs]
    return [Shape(p, pt, o, ot) for p, pt in prompts for o, ot in outputs]
