"""The gateway's own count of a stream (what a cut stream or a server without usage is charged),
against the simulator's streams: a chunk of one token counts 1, whatever its text."""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.upstream.stream_tally import StreamTally
from tests.simulator.procs import SimulatorProcess

# A served name as long as a Hugging Face id: vLLM's chunks of one token then pass 256 bytes,
# so the first is decoded and its text estimated (it still counts 1); the later ones, of about
# its size, are not decoded.
MODEL = "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4"


@pytest.mark.parametrize(
    ("path", "body", "long"),
    [  # chat chunks are long enough to be decoded; completion chunks are shorter
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "A story."}]}, True),
        ("/v1/completions", {"prompt": "Once upon a time"}, False),
    ],
)
def test_the_count_of_a_simulator_stream_is_its_reported_usage(
    path: str, body: dict[str, object], long: bool
) -> None:
    """Up to 300 tokens streamed one a chunk (words up to a dozen characters, as vLLM sends them):
    the gateway's count of the relayed chunks is the simulator's own usage, not more."""
    request = {
        **body,
        "model": MODEL,
        "max_tokens": 300,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with SimulatorProcess("--model", MODEL, "--latency-scale", "0", "--health-delay", "0") as sim:
        text = httpx.post(sim.url + path, json=request, timeout=20).text
    tally = StreamTally(
        strip_usage=False, prompt_tokens=0, max_tokens=None, capture=False, choices=1
    )
    usage = None
    long_chunks = 0
    for event in text.split("\n\n"):
        if not event.startswith("data: {"):
            continue
        data = json.loads(event[6:])
        if data.get("usage"):
            usage = data["usage"]
        if data["choices"]:
            chunk = data
            tally._chunk(event.encode())
            long_chunks += len(event) > 256
    assert usage is not None
    assert usage["completion_tokens"] > 100
    assert (long_chunks > 100) is long
    assert tally._count_usage().completion_tokens == usage["completion_tokens"]
    # Then a chunk like the stream's own with 200 characters of text: 50 tokens more, though
    # chunks of its envelope were no longer decoded.
    choice = chunk["choices"][0]
    if "delta" in choice:
        choice["delta"] = {"content": "abcd" * 50}
    else:
        choice["text"] = "abcd" * 50
    tally._chunk(b"data: " + json.dumps(chunk, separators=(",", ":")).encode())
    assert tally._count_usage().completion_tokens == usage["completion_tokens"] + 50
