"""How a request's admission ends: settled with what the request is charged, or withdrawn.

What the pipeline (gateway/http/proxy.py) charges when the backend reported no usage (the
reservation) or the client left before its answer (nothing, the prompt estimate, or the
reservation); an admission settled before a whole answer went out (:data:`SETTLED`); an
admission already granted, awaited like one in flight (:func:`ready`); one given back whole
when the request is refused before it is forwarded (:func:`withdraw`); and, once a whole
answer went out, the settlement before the shadow's start (:func:`after_complete`).
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.http.shadow_sample import Shadow
from gateway.pipeline.eager import Eager
from gateway.pipeline.events import Usage
from gateway.pipeline.usage_bound import UsageBound
from gateway.routing.shadow import answer_text
from policies.errors import TierGateError
from policies.ports import Admission
from policies.requests import RequestSummary

_NO_HEADERS: Mapping[str, str] = {}


def abandoned_usage(summary: RequestSummary, bound: UsageBound, tier: str | None) -> Usage | None:
    """What a request the client left before its answer is charged, on its tier's price, by
    the token limits, the budget and the usage report alike (``None``: nothing).

    Nothing when no backend was asked yet (``tier`` is the tier of the last attempt). A
    stream's first event is read before it is answered, so no token had come out: its prompt
    estimate. A non-streaming answer comes whole at the end, so the backend may have generated
    up to ``max_tokens`` (it is aborted now; how far it got is unknown): its whole reservation.
    """
    if tier is None:
        return None
    if summary.stream:
        return Usage(prompt_tokens=summary.prompt_token_estimate)
    return reserved_usage(summary, bound)


def reserved_usage(summary: RequestSummary | None, bound: UsageBound) -> Usage:
    """The usage a request reserved: its prompt estimate, and ``max_tokens`` per completion."""
    prompt = summary.prompt_token_estimate if summary is not None else 0
    return Usage(prompt_tokens=prompt, completion_tokens=bound.completion)


async def after_complete(
    admission: Admission, used: int | None, shadow: Shadow | None, raw: bytes
) -> None:
    """After a non-streaming answer was sent: settle the limits, then start any shadow."""
    await admission.settle(used)
    if shadow is not None:
        text = answer_text(raw)
        if text is not None:
            shadow.submit(text)


class Settled:
    """An admission already settled: nothing is left to do after the answer."""

    headers: Mapping[str, str] = _NO_HEADERS
    settles = False
    settle_first = False

    async def settle(self, used_tokens: int | None) -> None:
        """Done before the answer."""

    async def withdraw(self) -> None:
        """Never withdrawn: it was forwarded."""


SETTLED = Settled()


async def ready(admission: Admission) -> Admission:
    """An admission already granted, to await like one in flight."""
    return admission


async def withdraw(admitting: Eager[Admission]) -> None:
    """The request was refused before forwarding: give back all the limiter took (request,
    tokens, slot), so refusals such as 403/404/400 never consume a key's limits."""
    try:
        admission = await admitting
    except TierGateError:
        return  # refused by the limits too; the earlier error is the one the caller sees
    await admission.withdraw()
