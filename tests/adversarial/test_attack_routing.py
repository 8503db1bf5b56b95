"""Attacks on where a request goes: the classifier's path, the tier rules, replica choice.

Each test runs real parts: a real ``tiergate serve`` process in front of simulator processes,
the official ``openai`` client where a well-behaved client is measured. A hostile request is
one a client may send without any special scope.

One fast and one precise simulator serve the whole module; a test about one replica's
behaviour starts that replica (or two) beside them, and only reads or kills its own. The
gateways are forked from a pre-imported fork server (tests/integration/forked_gateway.py):
no test here is about a gateway's start.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import openai
import pytest

from tests.integration.forked_gateway import ForkedGateway
from tests.simulator.procs import SimulatorProcess
from tests.stack import (
    CHAT_PATH,
    FAST_SIM,
    PRECISE_SIM,
    Backends,
    Configure,
    Stack,
    gateway_in_front,
    running_backends,
)

pytestmark = pytest.mark.slow

# Just under the default long-prompt rule (6,000 estimated tokens, four ASCII characters a
# token), so the classifier, not the rule, decides these requests.
SCORED_CHARS = 23_000
# Room for every hostile prompt here: the backend answers them, so only routing is measured.
LONG_CONTEXT = ("--max-model-len", "131072")


@pytest.fixture(scope="module")
def backends() -> Iterator[Backends]:
    """Two zero-latency simulators (fast, precise) with room for every hostile prompt, shared
    by the module's gateways (no test sets a fault on them or reads their counters)."""
    with running_backends(sims=(FAST_SIM + LONG_CONTEXT, PRECISE_SIM + LONG_CONTEXT)) as running:
        yield running


@pytest.fixture(scope="module")
def stack(backends: Backends) -> Iterator[Stack]:
    """The two simulators behind one gateway, auth off."""
    with gateway_in_front(backends, gateway_type=ForkedGateway) as running:
        yield running


@contextlib.contextmanager
def _beside(backends: Backends, *extra: Sequence[str], configure: Configure) -> Iterator[Stack]:
    """A gateway (``configure``-d) in front of the module's fast simulator, one of its own per
    ``extra`` argument list, then the module's precise one: ``stack.sims`` in that order."""
    with contextlib.ExitStack() as started:
        own = tuple(started.enter_context(SimulatorProcess(*args)) for args in extra)
        sims = Backends((backends.fast, *own, backends.precise))
        yield started.enter_context(
            gateway_in_front(sims, configure=configure, gateway_type=ForkedGateway)
        )


def _user(text: str) -> dict[str, Any]:
    return {"model": "auto", "max_tokens": 4, "messages": [{"role": "user", "content": text}]}


def _normal_latency(
    stack: Stack, hostile: dict[str, Any], copies: int, answered: frozenset[int] = frozenset({200})
) -> float:
    """Seconds a well-behaved client waits for a short answer while ``copies`` of
    ``hostile`` are being routed by the same gateway process (each answered with a status in
    ``answered``)."""
    statuses: list[int] = []

    def send() -> None:
        reply = httpx.post(stack.gateway.url + CHAT_PATH, json=hostile, timeout=120)
        statuses.append(reply.status_code)

    senders = [threading.Thread(target=send) for _ in range(copies)]
    for sender in senders:
        sender.start()
    time.sleep(0.2)  # the hostile bodies (23 KB) are in and being scored
    client = openai.OpenAI(base_url=stack.gateway.url + "/v1", api_key="none", max_retries=0)
    started = time.perf_counter()
    client.chat.completions.create(
        model="auto", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
    )
    waited = time.perf_counter() - started
    for sender in senders:
        sender.join()
    assert len(statuses) == copies
    assert set(statuses) <= answered, statuses  # hostile, but valid: answered, never a 500
    return waited


def test_latex_openers_without_closers_do_not_stall_other_clients(stack: Stack) -> None:
    """A prompt of 11,000 ``\\[`` openers with no ``\\]`` does not hold the event loop.

    ``router_models.packaging`` looks for LaTeX blocks with a lazy ``\\[.+?\\]``: every
    opener scanned to the end of the text, quadratic in its length (about 2 s for one 23 KB
    prompt on this machine). Three such requests must not keep a short request waiting.
    """
    waited = _normal_latency(stack, _user("\\[" * (SCORED_CHARS // 2)), copies=3)
    assert waited < 1.0, f"a short request waited {waited:.2f}s behind three hostile ones"


def _no_long_prompt_rule(config: dict[str, Any], _: object) -> None:
    config["router"] = {"long_prompt_tokens": None}


def test_megabyte_prompts_without_the_long_prompt_rule_do_not_stall_other_clients(
    backends: Backends,
) -> None:
    """With ``router.long_prompt_tokens: null`` (documented: "no such rule") every prompt is
    scored; a 1 MB one must not hold the event loop for long.

    The scorer reads only the text's first 4,000 and last 2,000 characters, but the packaging
    pass before it ran its regexes over the whole text: about 1.4 s a megabyte here.
    """
    with gateway_in_front(
        backends, configure=_no_long_prompt_rule, gateway_type=ForkedGateway
    ) as stack:
        # The gateway refuses a prompt beyond the replicas' context (400, nothing forwarded:
        # only the gateway's work is measured; 500,000 words are far beyond even 131,072
        # tokens); routing ran before that.
        waited = _normal_latency(stack, _user("a " * 500_000), 3, frozenset({200, 400}))
    assert waited < 1.0, f"a short request waited {waited:.2f}s behind three 1 MB prompts"


def _route(reply: httpx.Response) -> tuple[str | None, str | None]:
    return reply.headers.get("x-tiergate-tier"), reply.headers.get("x-tiergate-route-reason")


def test_a_long_chat_of_short_turns_meets_the_long_prompt_rule(stack: Stack) -> None:
    """docs/router.md: prompts over ``router.long_prompt_tokens`` (6,000) go precise by rule.
    A chat of 3,000 short turns is a prompt the backend itself counts far above that."""
    turns = [{"role": ("user", "assistant")[i % 2], "content": "ok"} for i in range(3_001)]
    client = openai.OpenAI(base_url=stack.gateway.url + "/v1", api_key="none", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="auto",
        max_tokens=4,
        messages=turns,  # type: ignore[arg-type]
    )
    usage = raw.parse().usage
    assert usage is not None
    assert usage.prompt_tokens > 6_000  # the backend's own count
    assert raw.headers.get("x-tiergate-route-reason") == "rule:long_prompt"


def test_a_json_schema_in_vllm_fields_meets_the_structured_output_rule(stack: Stack) -> None:
    """A JSON schema constrains the answer alike in ``response_format`` and in vLLM's own
    ``structured_outputs`` / ``guided_json``: the structured-output rule sends all three
    precise."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    named = {"name": "c", "schema": schema}
    formats: list[dict[str, Any]] = [
        {"response_format": {"type": "json_schema", "json_schema": named}},
        {"structured_outputs": {"json": schema}},
        {"guided_json": schema},
        {"json_schema": schema},  # llama.cpp's own field
    ]
    routes = [_route(stack.post({**_user("Name a city."), **extra})) for extra in formats]
    assert routes == [("precise", "rule:json_schema")] * 4, routes


def test_a_choice_list_or_a_regex_is_left_to_the_classifier(stack: Stack) -> None:
    """Only a JSON schema meets the rule: a choice list (a classification) or a regex in vLLM's
    fields is routed by the classifier like any other request."""
    formats: list[dict[str, Any]] = [
        {"guided_choice": ["yes", "no"]},
        {"structured_outputs": {"regex": "[0-9]+"}},
        {"structured_outputs": {"json": None}},
    ]
    routes = [_route(stack.post({**_user("Name a city."), **extra})) for extra in formats]
    assert [reason for _tier, reason in routes] == ["classifier"] * 3, routes


def test_odd_request_shapes_are_routed_or_refused_never_a_server_error(stack: Stack) -> None:
    """Content arrays of thousands of tiny parts, empty or null content, no user message, tool
    messages with parts, non-string ``name``s, untyped parts, 10,000 messages, lone surrogates
    and invalid UTF-8 in JSON strings: each is routed (200) or refused (400), never a 5xx."""
    user = {"role": "user", "content": "hi"}
    shapes: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 5_000}]},
        {"messages": [{"role": "user", "content": []}]},
        {"messages": [{"role": "user", "content": None}]},
        {"messages": [{"role": "system", "content": "only a system prompt"}]},
        {"messages": [{"role": "assistant", "content": "only an answer"}]},
        {"messages": [user, {"role": "tool", "tool_call_id": "1", "content": [{"text": "r"}]}]},
        {"messages": [{**user, "name": 5}, {**user, "name": {"a": [1]}}]},
        {"messages": [{"role": "user", "content": [{"text": "hi", "extra": 1}, {"type": 3}]}]},
        {"messages": [user] * 10_000},
        {"messages": [user], "tools": [], "tool_choice": "none"},
    ]
    statuses = [stack.post({"model": "auto", "max_tokens": 4, **s}).status_code for s in shapes]
    assert all(status in (200, 400) for status in statuses), statuses
    prefix = b'{"model": "auto", "messages": [{"role": "user", "content": "'
    for text in (b"\\ud800", b"a\\udc00b", b"\\ud800\\ud800", b"\xff\xfe", b"\xed\xa0\x80"):
        raw = prefix + text + b'"}]}'
        reply = httpx.post(
            stack.gateway.url + CHAT_PATH,
            content=raw,
            headers={"content-type": "application/json"},
            timeout=10,
        )
        assert reply.status_code == 400, (text, reply.status_code, reply.text[:200])


def _replica_tiers(fast: list[str], precise: list[str]) -> dict[str, Any]:
    """Auth off, quick health rounds; fast on ``fast``, precise on ``precise``."""
    return {
        "auth": {"enabled": False},
        "telemetry": {"access_log": False},
        "health": {"interval_s": 0.25},
        "tiers": {
            "fast": {"model": "tiergate-fast", "replicas": fast},
            "precise": {"model": "tiergate-precise", "replicas": precise},
        },
    }


def _two_fast(config: dict[str, Any], backends: Backends) -> None:
    """The fast tier on the first two simulators, precise on the last."""
    sims = backends.sims
    config.update(_replica_tiers([sims[0].url, sims[1].url], [sims[-1].url]))


def _received(url: str) -> int:
    return int(httpx.get(url + "/sim/stats", timeout=5).json()["requests_total"])


def test_a_replica_that_answers_500_to_everything_is_ejected_and_costs_no_errors(
    backends: Backends,
) -> None:
    """docs/replicas.md: one retry for a 500 on another replica, and 5 consecutive 5xx eject
    a replica (2 s, doubling). A replica whose health route is fine but whose every answer is
    500 costs the clients nothing and sees few of 60 requests sent over about 2 s."""
    bad = (*FAST_SIM, "--fail-500", "1.0")
    with _beside(backends, bad, configure=_two_fast) as stack:
        stack.gateway.wait_until_ready()
        client = openai.OpenAI(base_url=stack.gateway.url + "/v1", api_key="x", max_retries=0)
        for i in range(60):
            client.chat.completions.create(
                model="fast",
                max_tokens=4,
                messages=[{"role": "user", "content": f"question {i}: what is {i} + 1?"}],
            )
            time.sleep(0.03)
        seen_by_bad = _received(stack.sims[1].url)
    assert seen_by_bad <= 15, f"the failing replica was sent {seen_by_bad} of 60 requests"


def _stalling_first_byte(config: dict[str, Any], backends: Backends) -> None:
    _two_fast(config, backends)
    config["tiers"]["fast"]["timeouts"] = {"first_byte_s": 1.0}


def test_a_replica_that_never_starts_its_streams_is_ejected(backends: Backends) -> None:
    """docs/replicas.md: a stream's first-token timeout is retried on another replica, and
    counts like a connection failure. A replica whose health route answers but whose streams
    never start costs each client one timeout at most, and is ejected after 5 of them."""
    stalls = (*FAST_SIM, "--stall-first-byte", "1.0", "--stall-seconds", "30")
    with _beside(backends, stalls, configure=_stalling_first_byte) as st:
        st.gateway.wait_until_ready()
        client = openai.OpenAI(base_url=st.gateway.url + "/v1", api_key="x", max_retries=0)
        waits = []
        for i in range(16):
            started = time.perf_counter()
            stream = client.chat.completions.create(
                model="fast",
                max_tokens=4,
                stream=True,
                messages=[{"role": "user", "content": f"question {i}: what is {i} + 1?"}],
            )
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            waits.append(time.perf_counter() - started)
        seen_by_stalling = _received(st.sims[1].url)
    assert max(waits) < 5.0, waits  # one first-token timeout, then another replica
    assert seen_by_stalling <= 6, f"the stalling replica was sent {seen_by_stalling} of 16"


HOT_SYSTEM = "You are the support assistant of one shop. " * 60  # one shared 2.6 KB prefix
HOT_CLIENTS = 40


def _hot_prefix_tier(config: dict[str, Any], backends: Backends) -> None:
    _two_fast(config, backends)
    config["tiers"]["fast"]["max_concurrency"] = 64


def test_one_hot_prefix_from_many_clients_is_spread_by_the_load_bound(backends: Backends) -> None:
    """docs/settings.md ``balancing.load_factor`` / ``load_slack``: a replica is preferred
    while its in-flight count stays within 1.25 times the mean plus 4. Forty concurrent
    clients sharing one system prompt (one prefix key) must not all land on one replica:
    the preferred one holds at most 1.25 x 41 / 2 + 4 = 29 in flight, the other the rest.

    The bound is on requests in flight, not on requests received: on a loaded machine the
    forty arrive over seconds, early answers finish, and the preferred replica takes more
    than 29 in all without ever holding more than 29 at once (CI saw 32 of 40). So each
    simulator is read while it has finished no answer yet: all it received is in flight."""
    slow = (*FAST_SIM[:-1], "30")  # latency scale 30: an answer takes about 6 s
    with (
        SimulatorProcess(*slow) as one,
        SimulatorProcess(*slow) as two,
        gateway_in_front(
            Backends((one, two, backends.precise)),
            configure=_hot_prefix_tier,
            gateway_type=ForkedGateway,
        ) as st,
    ):
        st.gateway.wait_until_ready()
        body = {"model": "fast", "max_tokens": 48}

        def ask(i: int) -> int:
            messages = [
                {"role": "system", "content": HOT_SYSTEM},
                {"role": "user", "content": f"Where is my order {i}?"},
            ]
            reply = st.post({**body, "messages": messages}, timeout=120)
            return reply.status_code

        statuses: list[int] = []
        threads = [
            threading.Thread(target=lambda i=i: statuses.append(ask(i))) for i in range(HOT_CLIENTS)
        ]
        for thread in threads:
            thread.start()
        held = _held_before_any_answer([sim.url for sim in st.sims[:2]], threads)
        counts = [_received(sim.url) for sim in st.sims[:2]]
    assert statuses == [200] * HOT_CLIENTS
    assert sum(counts) == HOT_CLIENTS, counts
    assert max(held) <= 1.25 * (HOT_CLIENTS + 1) / 2 + 4, (held, counts)
    assert sum(held) > 1.25 * (HOT_CLIENTS + 1) / 2 + 4, (held, counts)  # enough to spill
    assert min(held) >= 1, (held, counts)  # and it did


def _held_before_any_answer(urls: list[str], clients: list[threading.Thread]) -> list[int]:
    """For each simulator, the most requests it was seen holding before it finished its first
    answer (all it had received, each in flight), read until the ``clients`` are done."""
    held = [0] * len(urls)
    with httpx.Client(timeout=5) as client:
        while any(thread.is_alive() for thread in clients):
            for place, url in enumerate(urls):
                stats = client.get(url + "/sim/stats").json()
                if not sum(stats["finished"].values()):
                    held[place] = max(held[place], stats["requests_total"])
            time.sleep(0.02)
    for thread in clients:
        thread.join()
    return held


def test_a_replica_killed_and_restarted_again_and_again_costs_no_errors(
    backends: Backends,
) -> None:
    """docs/replicas.md: a refused connection is retried on another replica at once and never
    charged. A fast replica that is ``kill -9``-ed and restarted on its port four times while a
    client sends non-streaming requests costs that client no error."""
    with _beside(backends, FAST_SIM, configure=_two_fast) as st:
        st.gateway.wait_until_ready()
        victim = st.sims[1]
        port = str(victim.port)
        failures: list[str] = []
        done = threading.Event()

        def client_loop() -> None:
            client = openai.OpenAI(base_url=st.gateway.url + "/v1", api_key="x", max_retries=0)
            i = 0
            while not done.is_set():
                i += 1
                try:
                    client.chat.completions.create(
                        model="fast",
                        max_tokens=4,
                        messages=[{"role": "user", "content": f"flap {i}"}],
                    )
                except openai.APIError as exc:
                    failures.append(repr(exc)[:200])

        loop = threading.Thread(target=client_loop)
        loop.start()
        restarted: list[SimulatorProcess] = []
        try:
            for _ in range(4):
                time.sleep(0.5)
                (restarted[-1] if restarted else victim).kill()
                time.sleep(0.3)
                restarted.append(SimulatorProcess(*FAST_SIM, "--port", port).start())
            time.sleep(1.0)
        finally:
            done.set()
            loop.join()
            for sim in restarted:
                sim.stop()
    assert failures == []
