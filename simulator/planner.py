"""Turn a request body into a plan: prompt tokens, the reply pieces and the finish reason."""

from __future__ import annotations

import random
from dataclasses import dataclass

import msgspec

from simulator.judge import verdict
from simulator.prefix_cache import chain_seed
from simulator.quality import QualityModel
from simulator.schemas import (
    ChatRequest,
    CompletionRequest,
    SimError,
    chat_decoder,
    completion_decoder,
)
from simulator.tokenize import content_text, count_tokens, render_chat, split_pieces, tokenize

_VOCABULARY = (
    "the",
    "model",
    "answers",
    "with",
    "a",
    "short",
    "plausible",
    "sentence",
    "about",
    "tiers",
    "routing",
    "cache",
    "and",
    "latency",
    "while",
    "every",
    "token",
    "arrives",
    "at",
    "its",
    "own",
    "pace",
    "so",
    "gateways",
    "can",
    "measure",
    "time",
    "to",
    "first",
    "throughput",
    "queueing",
    "aborts",
    "retries",
    "streaming",
    "behaviour",
    "under",
    "load",
)


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """What the planner needs to know about the served model."""

    model: str
    max_model_len: int
    num_blocks: int
    block_size: int
    output_tokens: int | None
    echo: bool
    quality: QualityModel | None = None
    # Prepended to every generated reply (the demo: "[simulated reply]"); no extra tokens.
    label: str = ""


@dataclass(slots=True)
class Plan:
    """Everything the serving code needs to run one request."""

    chat: bool
    stream: bool
    include_usage: bool
    prompt_tokens: list[str]
    pieces: list[str]
    output_tokens: list[str]
    finish_reason: str
    chain_seed: int
    total_blocks: int


class Planner:
    """Validates requests the way vLLM does and decides each reply deterministically."""

    def __init__(self, config: PlannerConfig, seed: int) -> None:
        self.config = config
        self._rng = random.Random(seed)  # noqa: S311 - simulation draws, not security

    def plan(self, body: bytes, *, chat: bool) -> Plan:
        """Decode and validate ``body``; raises SimError with vLLM's status and message."""
        try:
            request = chat_decoder.decode(body) if chat else completion_decoder.decode(body)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise SimError(400, f"Invalid request body: {exc}") from exc
        if request.stream_options is not None and not request.stream:
            raise SimError(
                400, "Stream options can only be defined when `stream=True`.", "stream_options"
            )
        if request.n not in (None, 1):
            raise SimError(400, "The simulator only supports n=1.", "n")
        if request.model is not None and request.model != self.config.model:
            raise SimError(404, f"The model `{request.model}` does not exist.", "model")
        if isinstance(request, ChatRequest):
            prompt, echo_text, max_tokens = self._chat_prompt(request)
        else:
            prompt, echo_text, max_tokens = self._completion_prompt(request)
        prompt_tokens = tokenize(prompt)
        room = self._check_context(len(prompt_tokens), max_tokens)
        rng = self._rng if request.seed is None else random.Random(request.seed)  # noqa: S311 - simulation
        if self.config.quality is not None:  # the reply is a function of the prompt
            rng = random.Random(self.config.quality.seed(echo_text))  # noqa: S311 - simulation
        graded = _graded(request) if isinstance(request, ChatRequest) else None
        if graded is not None:  # the gateway's judge call: a verdict, not an answer
            pieces, output, reason = _echo(graded, max_tokens, room)
        elif self.config.echo:
            pieces, output, reason = _echo(echo_text, max_tokens, room)
        else:
            count, reason = self._length(max_tokens, room, rng, request)
            pieces, output = _words(count, rng)
        if self.config.label and pieces:
            pieces = [f"{self.config.label} {pieces[0].lstrip()}", *pieces[1:]]
        total_blocks = -(-(len(prompt_tokens) + len(output)) // self.config.block_size)
        if total_blocks > self.config.num_blocks:
            raise SimError(
                400,
                f"The request needs {total_blocks} KV-cache blocks but the "
                f"cache has only {self.config.num_blocks}.",
            )
        options = request.stream_options
        return Plan(
            chat=chat,
            stream=bool(request.stream),
            include_usage=bool(request.stream and options and options.include_usage),
            prompt_tokens=prompt_tokens,
            pieces=pieces,
            output_tokens=output,
            finish_reason=reason,
            chain_seed=chain_seed(self.config.model, request.cache_salt),
            total_blocks=total_blocks,
        )

    @staticmethod
    def _chat_prompt(request: ChatRequest) -> tuple[str, str, int | None]:
        prompt = render_chat(
            [(m.role, m.content, m.tool_calls) for m in request.messages], request.tools
        )
        last_user = next((m for m in reversed(request.messages) if m.role == "user"), None)
        echo_text = content_text(last_user.content) if last_user is not None else ""
        max_tokens = request.max_completion_tokens or request.max_tokens
        return prompt, echo_text, max_tokens

    @staticmethod
    def _completion_prompt(request: CompletionRequest) -> tuple[str, str, int | None]:
        prompt = request.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1 and not all(isinstance(t, int) for t in prompt):
                raise SimError(400, "The simulator supports one prompt per request.", "prompt")
            if prompt and isinstance(prompt[0], str):
                prompt = prompt[0]
            else:
                prompt = " ".join(str(t) for t in prompt)
        return prompt, prompt, request.max_tokens

    def _check_context(self, prompt_len: int, max_tokens: int | None) -> int:
        limit = self.config.max_model_len
        if prompt_len >= limit:
            raise SimError(
                400,
                f"This model's maximum context length is {limit} tokens. "
                f"However, your request has {prompt_len} input tokens. "
                "Please reduce the length of the input messages.",
            )
        if max_tokens is not None and prompt_len + max_tokens > limit:
            raise SimError(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: "
                f"{max_tokens}. This model's maximum context length is {limit} "
                f"tokens and your request has {prompt_len} input tokens "
                f"({max_tokens} > {limit} - {prompt_len}).",
            )
        return limit - prompt_len

    def _length(
        self,
        max_tokens: int | None,
        room: int,
        rng: random.Random,
        request: ChatRequest | CompletionRequest,
    ) -> tuple[int, str]:
        if max_tokens is None:
            wanted = self.config.output_tokens
            if wanted is None:  # vLLM's default: the rest of the context
                return room, "length"
            return (wanted, "stop") if wanted < room else (room, "length")
        if request.ignore_eos:
            return max_tokens, "length"
        low = min(max((max_tokens + 1) // 2, request.min_tokens or 0, 1), max_tokens)
        count = low + int(rng.random() * (max_tokens - low + 1))
        return count, "length" if count == max_tokens else "stop"


def _graded(request: ChatRequest) -> str | None:
    """The judge verdict when the chat is a rubric call (``simulator.judge``), else None."""
    messages = request.messages
    if len(messages) < 2 or messages[0].role != "system" or messages[-1].role != "user":
        return None
    return verdict(content_text(messages[0].content), content_text(messages[-1].content))


def _echo(text: str, max_tokens: int | None, room: int) -> tuple[list[str], list[str], str]:
    limit = room if max_tokens is None else max_tokens
    pieces, tokens = split_pieces(text, limit)
    truncated = len(tokens) == limit and count_tokens(text) > limit
    return pieces, tokens, "length" if truncated else "stop"


def _word_stream(length: int) -> tuple[list[str], list[str]]:
    """A fixed pseudo-random text; replies are slices of it (cheaper than drawing words)."""
    draw = random.Random(0)  # noqa: S311 - simulation text, not security
    words = [draw.choice(_VOCABULARY) for _ in range(length)]
    return words, [f" {word}" for word in words]


_STREAM_WORDS, _STREAM_PIECES = _word_stream(8192)


def _words(count: int, rng: random.Random) -> tuple[list[str], list[str]]:
    """``count`` words from a seeded offset: (pieces with leading spaces, tokens)."""
    if count <= 0:
        return [], []
    words: list[str] = []
    pieces: list[str] = []
    while len(words) < count:
        start = int(rng.random() * len(_STREAM_WORDS))
        take = min(count - len(words), len(_STREAM_WORDS) - start)
        words += _STREAM_WORDS[start : start + take]
        pieces += _STREAM_PIECES[start : start + take]
    pieces[0] = words[0]
    return pieces, words
