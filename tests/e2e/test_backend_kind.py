"""The llama.cpp tiers on the default config: detected, probed on a route they have, served."""

from __future__ import annotations

import httpx
import openai

from tests.e2e.conftest import ADMIN_TOKEN
from tests.integration.gateway_proc import GatewayProcess


def test_defaults_detect_llama_cpp(gateway: GatewayProcess, client: openai.OpenAI) -> None:
    """Kind auto finds llama.cpp on both tiers, probes /docs, and model=fast answers."""
    raw = client.chat.completions.with_raw_response.create(
        model="fast", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4
    )
    assert raw.headers["x-tiergate-tier"] == "fast"
    view = httpx.get(
        gateway.url + "/admin/backends",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=10,
    ).json()
    for tier in ("fast", "precise"):
        replica = view["tiers"][tier]["replicas"][0]
        assert replica["healthy"]
        assert replica["backend"]["kind"] == "llamacpp"
        assert replica["backend"]["probe_path"] == "/docs"
