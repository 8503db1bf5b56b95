"""The per-tier upstream API key: where it comes from, and that it never shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.composition import build_backends
from gateway.config.settings import Settings, load_settings
from gateway.config.tier_settings import TierSettings
from gateway.upstream.keys import UpstreamKeys, every_key_refused

SECRET = "upstream-secret-0123456789"


def _tier(**options: object) -> TierSettings:
    return TierSettings.model_validate(
        {"model": "m", "replicas": ["http://127.0.0.1:1"], **options}
    )


def test_key_from_setting_is_masked_in_repr_and_dumps() -> None:
    """The key is read back for the Authorization header but never shown in repr or dumps."""
    tier = _tier(api_key=SECRET)
    assert tier.read_api_key() == SECRET
    assert SECRET not in repr(tier)
    assert SECRET not in tier.model_dump_json()
    assert SECRET not in str(tier.model_dump())


def test_key_from_file(tmp_path: Path) -> None:
    """api_key_file is read (stripped); an empty file means no key."""
    path = tmp_path / "key"
    path.write_text(SECRET + "\n", encoding="utf-8")
    assert _tier(api_key_file=str(path)).read_api_key() == SECRET
    path.write_text("\n", encoding="utf-8")
    assert _tier(api_key_file=str(path)).read_api_key() is None


def test_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """TIERGATE_TIERS__<TIER>__API_KEY sets a tier's key over the YAML defaults."""
    monkeypatch.setenv("TIERGATE_TIERS__FAST__API_KEY", SECRET)
    monkeypatch.setenv("TIERGATE_TIERS__FAST__MODEL", "tiergate-fast")
    monkeypatch.setenv("TIERGATE_TIERS__FAST__REPLICAS", '["http://127.0.0.1:1"]')
    monkeypatch.setenv("TIERGATE_TIERS__PRECISE__MODEL", "tiergate-precise")
    monkeypatch.setenv("TIERGATE_TIERS__PRECISE__REPLICAS", '["http://127.0.0.1:2"]')
    settings = load_settings()
    assert settings.tiers["fast"].read_api_key() == SECRET
    assert settings.tiers["precise"].read_api_key() is None
    assert SECRET not in repr(settings)


def test_routes_carry_the_bearer_header_only_where_configured() -> None:
    """Each tier's route sends 'Authorization: Bearer <key>' only when it has a key."""
    settings = Settings(tiers={"fast": _tier(api_key=SECRET), "precise": _tier()})
    _, routes, _ = build_backends(settings.tiers, settings.health, settings.balancing)
    assert routes["fast"].upstream_headers == {"Authorization": f"Bearer {SECRET}"}
    assert routes["precise"].upstream_headers == {}
    assert SECRET not in repr(routes["fast"])


@pytest.mark.parametrize("bad", ["two words", "line\r\nX-Injected: 1", "tab\there", "é"])
def test_keys_that_cannot_be_a_header_are_refused_without_echo(bad: str) -> None:
    """A key with spaces or control characters fails at start-up, not on every request."""
    with pytest.raises(ValueError, match="printable ASCII") as info:
        _tier(api_key=bad).read_api_key()
    assert bad not in str(info.value)


def test_a_list_of_keys_from_yaml_file_or_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """api_key takes a list (YAML, or a JSON list in the environment), api_key_file one a line;
    a single string, digits included, stays one key."""
    assert _tier(api_key=["new-key", "old-key"]).read_api_keys() == ("new-key", "old-key")
    assert _tier(api_key=["new-key", "old-key"]).read_api_key() == "new-key"
    path = tmp_path / "keys"
    path.write_text("new-key\n\nold-key\n", encoding="utf-8")
    assert _tier(api_key_file=str(path)).read_api_keys() == ("new-key", "old-key")
    for raw, keys in (('["a-1", "b-2"]', ("a-1", "b-2")), ("12345", ("12345",)), ("1e5", ("1e5",))):
        monkeypatch.setenv("TIERGATE_TIERS__FAST__API_KEY", raw)
        monkeypatch.setenv("TIERGATE_TIERS__FAST__MODEL", "tiergate-fast")
        monkeypatch.setenv("TIERGATE_TIERS__FAST__REPLICAS", '["http://127.0.0.1:1"]')
        monkeypatch.setenv("TIERGATE_TIERS__PRECISE__MODEL", "tiergate-precise")
        monkeypatch.setenv("TIERGATE_TIERS__PRECISE__REPLICAS", '["http://127.0.0.1:2"]')
        assert load_settings().tiers["fast"].read_api_keys() == keys


def test_a_list_of_keys_is_masked_and_checked_like_one() -> None:
    """Keys of a list never show in repr or dumps, and a bad one fails without echo."""
    tier = _tier(api_key=[SECRET, "second-secret"])
    assert SECRET not in repr(tier)
    assert "second-secret" not in tier.model_dump_json()
    with pytest.raises(ValueError, match="printable ASCII") as info:
        _tier(api_key=["fine", "not fine"]).read_api_keys()
    assert "not fine" not in str(info.value)


def test_routes_rotate_only_with_several_keys() -> None:
    """One key: the route's fixed header; several: the route carries them for rotation."""
    settings = Settings(
        tiers={"fast": _tier(api_key=[SECRET, "second-secret"]), "precise": _tier(api_key=SECRET)}
    )
    _, routes, monitor = build_backends(settings.tiers, settings.health, settings.balancing)
    fast = routes["fast"].keys
    assert fast is not None
    assert routes["fast"].upstream_headers == {"Authorization": f"Bearer {SECRET}"}
    assert routes["precise"].keys is None
    assert monitor.keys == {"fast": fast}
    assert SECRET not in repr(fast)
    assert repr(fast) == "UpstreamKeys(2 keys)"


def test_rotation_moves_a_replica_to_the_next_key_until_all_were_refused() -> None:
    """Each refusal moves on; refusing every key since the last success is misconfiguration."""
    keys = UpstreamKeys(["a", "b", "c"])
    url, other = "http://r1", "http://r2"
    assert keys.for_replica(url) == {"Authorization": "Bearer a"}
    assert not every_key_refused(keys, url)  # a refused: b next
    assert keys.for_replica(url) == {"Authorization": "Bearer b"}
    assert keys.for_replica(other) == {"Authorization": "Bearer a"}  # per replica
    keys.accepted(url)  # b works: a later refusal starts a fresh count
    assert not every_key_refused(keys, url)
    assert not every_key_refused(keys, url)
    assert every_key_refused(keys, url)  # c, a, b refused in a row
    keys.use(url, 2)  # a re-check found c accepted
    assert keys.for_replica(url) == {"Authorization": "Bearer c"}
    assert every_key_refused(None, url)
    assert every_key_refused(UpstreamKeys(["only"]), url)
