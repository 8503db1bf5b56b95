"""Parsing of targets, grids, loads and SLOs: bad values are refused with a clear message."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from loadgen.spec import (
    SpecError,
    grid,
    parse_concurrency,
    parse_lengths,
    parse_rates,
    parse_slo,
    parse_target,
)


def test_target_with_key_from_env_never_shows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key is read from the named variable and kept out of repr and the public view."""
    monkeypatch.setenv("BENCH_KEY", "sk-very-secret")
    target = parse_target(
        "name=gw,url=http://127.0.0.1:8080/v1/,model=fast,api-key-env=BENCH_KEY", None, None, None
    )
    assert target.url == "http://127.0.0.1:8080"
    assert target.api_key == "sk-very-secret"
    assert "sk-very-secret" not in repr(target)
    assert "sk-very-secret" not in str(target.public())
    assert target.public()["auth"] == "bearer"


def test_target_key_from_file_and_defaults(tmp_path: Path) -> None:
    """A key file is read and stripped; --model and the global key source are defaults."""
    key = tmp_path / "key"
    key.write_text("sk-file\n")
    target = parse_target("name=d,url=http://127.0.0.1:1", "precise", None, str(key))
    assert (target.model, target.api_key) == ("precise", "sk-file")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("url=http://127.0.0.1:1,model=m", "needs name= and url="),
        ("name=a,url=http://127.0.0.1:1", "needs model="),
        ("name=a,url=ftp://x,model=m", "not an http"),
        ("name=a,url=http://u:p@127.0.0.1:1,model=m", "credentials"),
        ("name=a,url=http://127.0.0.1:1,model=m,colour=red", "unknown field"),
        ("name=a,url=http://127.0.0.1:1,model=m,api-key-env=NO_SUCH_VAR_X", "NO_SUCH_VAR_X"),
        ("name=a,url=http://127.0.0.1:1,model=m,api-key-file=/no/such/file", "cannot read key"),
        ("name a", "key=value"),
    ],
)
def test_bad_targets_are_refused(spec: str, message: str) -> None:
    """Each malformed target names what is wrong."""
    with pytest.raises(SpecError, match=message):
        parse_target(spec, None, None, None)


def test_lengths_named_or_plain() -> None:
    """``short=128,long=1024`` keeps the names; plain numbers name themselves."""
    assert parse_lengths("short=128,long=1024", "x") == [("short", 128), ("long", 1024)]
    assert parse_lengths("64", "x") == [("64", 64)]
    for bad in ("short=0", "short=abc", "a=1,a=2", ""):
        with pytest.raises(SpecError):
            parse_lengths(bad, "--prompt-tokens")


def test_grid_is_every_prompt_by_every_output() -> None:
    """Two prompt lengths and two output lengths make four shapes; a file makes one per output."""
    shapes = grid([("short", 8), ("long", 64)], [("short", 4), ("long", 32)])
    assert [s.label for s in shapes] == ["short/short", "short/long", "long/short", "long/long"]
    assert [s.label for s in grid(None, [("o", 4)])] == ["file/o"]


def test_loads_and_slo() -> None:
    """Concurrency 0 means no cap, rate inf means all at once; SLO keys are checked."""
    assert parse_concurrency("1, 4,0") == [1, 4, None]
    assert parse_rates("inf,2.5") == [math.inf, 2.5]
    assert parse_slo("ttft_ms=500,tpot_ms=50").as_dict() == {"ttft_ms": 500, "tpot_ms": 50}
    for bad in ("ttft=500", "ttft_ms=-1", "ttft_ms=nan", "ttft_ms"):
        with pytest.raises(SpecError):
            parse_slo(bad)
    with pytest.raises(SpecError):
        parse_rates("0")
    with pytest.raises(SpecError):
        parse_concurrency("-2")
