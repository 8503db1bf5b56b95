"""``tiergate simulate`` / ``python -m simulator``: run one simulated vLLM replica."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from aiohttp import web

from simulator.app import build_app
from simulator.faults import FaultRates
from simulator.flavors import FLAVORS
from simulator.profiles import PROFILES
from simulator.quality import QualityModel
from simulator.serial import SERIAL_MODES
from simulator.state import VLLM_VERSIONS, SimConfig, SimState

_FAULT_OPTIONS = (
    "fail_429",
    "fail_400",
    "fail_404",
    "fail_500",
    "fail_503",
    "fail_refuse",
    "fail_reset",
    "stall_first_byte",
    "stall_mid_stream",
    "drop_mid_stream",
    "error_mid_stream",
)


def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a probability in [0, 1]")
    return value


def _bounded(low: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = float(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{text} must be >= {low}")
        return value

    return parse


def _count(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{text} must be >= {low}")
        return value

    return parse


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        # The socket layer would take it modulo 65536 (70000 would listen on 4464).
        raise argparse.ArgumentTypeError(f"{text} is not a port number (0-65535)")
    return value


def _add_server_options(parser: argparse.ArgumentParser) -> None:
    """Address, model, capacity, latency and the replies' text."""
    add = parser.add_argument
    add("--host", default="127.0.0.1")
    add("--port", type=_port, default=8000, help="0-65535; 0 picks a free port")
    add("--profile", choices=sorted(PROFILES), default="fast")
    add("--model", help="served model name (default tiergate-<profile>)")
    add("--replica-name", help="value of x-sim-replica (default sim-<profile>-<port>)")
    add("--seed", type=int, default=0)
    add("--max-num-seqs", type=_count(1), default=64, help="running slots")
    add("--max-queue", type=_count(0), default=None, help="waiting-queue bound (default none)")
    add("--queue-full-status", type=int, choices=(429, 503), default=503)
    add("--kv-blocks", type=_count(1), default=2048, help="GPU KV blocks of 16 tokens")
    add("--max-model-len", type=_count(2), default=8192)
    add("--latency-scale", type=_bounded(0.0), default=1.0, help="0 disables every delay")
    add("--time-factor-under-load", type=_bounded(1.0), default=2.0)
    add(
        "--jitter",
        type=_bounded(0.0),
        default=0.2,
        help="std of the latency noise, as a fraction of the mean (0: exact latencies)",
    )
    add(
        "--decode-tokens-per-s",
        type=_bounded(1.0),
        default=None,
        help="decode speed of one sequence (default: the profile's); a slower tier's knob",
    )
    add(
        "--deferred-s",
        type=_bounded(0.0),
        default=0.0,
        metavar="SECONDS",
        help="every request first waits this long as 'deferred' (vLLM: grammar compile, "
        'remote KV), counted in vllm:num_requests_waiting_by_reason{reason="deferred"}',
    )
    add("--echo", action="store_true", help="reply with the last user message / the prompt")
    add(
        "--output-tokens",
        type=_count(0),
        default=None,
        help="reply length when a chat request sets no max_tokens (default: as vLLM, the "
        "rest of the context)",
    )
    add(
        "--label",
        default="",
        help="text put before every reply, e.g. '[simulated reply]' (no tokens counted)",
    )


def _add_flavour_options(parser: argparse.ArgumentParser) -> None:
    """Which server the simulator answers as: health, metrics, serial generation."""
    add = parser.add_argument
    add(
        "--flavor",
        choices=sorted(FLAVORS),
        default="vllm",
        help="which server to answer as: health, metrics, stream usage, ids, error bodies",
    )
    add(
        "--health-delay",
        type=_bounded(0.0),
        default=None,
        metavar="SECONDS",
        help="how long the health route takes (default: the flavour's; sglang 1 s)",
    )
    add(
        "--metrics",
        choices=("auto", "on", "off"),
        default="auto",
        help="serve /metrics (auto: as the server does by default; sglang/llamacpp: off)",
    )
    add(
        "--serial",
        choices=SERIAL_MODES,
        default="off",
        help="one generation at a time, as llama-cpp-python's server: other requests and "
        "/v1/models wait behind it; 'interrupt' (that server's default) also ends the "
        "running stream with [DONE] and no finish_reason when a request waits",
    )
    add(
        "--legacy-metrics",
        action="store_true",
        help="also emit the deprecated vllm:gpu_cache_usage_perc",
    )


def _add_fault_options(parser: argparse.ArgumentParser) -> None:
    """Injected faults and prompt-dependent answer quality."""
    add = parser.add_argument
    for name in _FAULT_OPTIONS:
        add("--" + name.replace("_", "-"), type=_probability, default=0.0, metavar="RATE")
    add("--stall-seconds", type=_bounded(0.0), default=5.0)
    add(
        "--quality-file",
        type=Path,
        default=None,
        help="JSONL of {prompt, label}: replies become a function of the prompt",
    )
    add(
        "--weak",
        action="store_true",
        help="with --quality-file: answer 'complex' prompts differently (a weaker model)",
    )


def _add_vllm_options(parser: argparse.ArgumentParser) -> None:
    """vLLM's own behaviour: release quirks, API keys, dev-mode and gated routes, usage details."""
    add = parser.add_argument
    add(
        "--vllm-version",
        choices=VLLM_VERSIONS,
        default="current",
        help="reproduce this vLLM release where releases differ (duplicate request ids)",
    )
    add(
        "--api-key",
        nargs="+",
        action="extend",
        default=None,
        help="as vLLM's --api-key: /v1/* needs 'Authorization: Bearer KEY' with one of the keys "
        "(several may follow the option; default: the VLLM_API_KEY environment variable)",
    )
    add(
        "--dev-mode",
        action="store_true",
        help="as vLLM with VLLM_SERVER_DEV_MODE=1: serve /sleep, /wake_up, /is_sleeping, "
        "/reset_prefix_cache and /server_info, without authentication",
    )
    add(
        "--enable-gated-routes",
        action="store_true",
        help="serve vLLM's flag-gated open routes: /start_profile, /stop_profile, "
        "/tokenizer_info, /fault_tolerance/apply and /fault_tolerance/status",
    )
    add(
        "--enable-server-load-tracking",
        action="store_true",
        help="as vLLM: GET /load answers the requests in flight (otherwise always 0)",
    )
    add(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="as vLLM: report usage.prompt_tokens_details.cached_tokens",
    )
    add(
        "--reasoning-tokens",
        type=int,
        default=0,
        metavar="N",
        help="as a reasoning model behind vLLM's --reasoning-parser: the first N output tokens "
        "of each chat answer are thinking, sent as reasoning_content (--vllm-version 0.11) or "
        "reasoning (current) instead of content; usage counts them",
    )


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        prog="tiergate simulate",
        description="Simulated OpenAI-compatible inference server (vLLM by default; see --flavor).",
    )
    _add_server_options(parser)
    _add_flavour_options(parser)
    _add_fault_options(parser)
    _add_vllm_options(parser)
    return parser


def _api_keys(given: list[str] | None) -> tuple[str, ...]:
    """The keys of ``--api-key``, else of ``VLLM_API_KEY`` (as vLLM reads it), else none."""
    if given:
        return tuple(given)
    from_env = os.environ.get("VLLM_API_KEY", "")
    return (from_env,) if from_env else ()


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """A SimConfig from parsed arguments (the replica name is fixed once the port is known)."""
    profile = PROFILES[args.profile]
    if args.decode_tokens_per_s is not None:
        profile = replace(profile, inter_token_s=1.0 / args.decode_tokens_per_s)
    rates = FaultRates(
        stall_seconds=args.stall_seconds, **{name: getattr(args, name) for name in _FAULT_OPTIONS}
    )
    return SimConfig(
        profile=profile,
        model=args.model or profile.default_model,
        replica=args.replica_name or "",
        seed=args.seed,
        max_num_seqs=args.max_num_seqs,
        max_queue=args.max_queue,
        queue_full_status=args.queue_full_status,
        kv_blocks=args.kv_blocks,
        max_model_len=args.max_model_len,
        latency_scale=args.latency_scale,
        time_factor_under_load=args.time_factor_under_load,
        jitter=args.jitter,
        deferred_s=args.deferred_s,
        server_load_tracking=args.enable_server_load_tracking,
        echo=args.echo,
        output_tokens=args.output_tokens,
        legacy_metrics=args.legacy_metrics,
        faults=rates,
        vllm_version=args.vllm_version,
        api_keys=_api_keys(args.api_key),
        dev_mode=args.dev_mode,
        gated_routes=args.enable_gated_routes,
        prompt_tokens_details=args.enable_prompt_tokens_details,
        reasoning_tokens=max(0, args.reasoning_tokens),
        quality=(
            QualityModel.load(args.quality_file, weak=args.weak)
            if args.quality_file is not None
            else None
        ),
        label=args.label,
        flavor=args.flavor,
        health_delay_s=args.health_delay,
        metrics=args.metrics,
        serial=args.serial,
    )


async def serve(config: SimConfig, host: str, port: int) -> None:
    """Run until SIGINT or SIGTERM."""
    state = SimState(config)
    # handler_cancellation: a client that disconnects cancels its handler, which is how the
    # simulator notices aborted non-streaming requests (vLLM frees the slot the same way).
    runner = web.AppRunner(build_app(state), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=2048)
    await site.start()
    bound_port = int(runner.addresses[0][1])
    if not config.replica:
        state.rename(f"sim-{config.profile.name}-{bound_port}")
        state.config = replace(config, replica=state.replica)
    print(f"simulator listening on http://{host}:{bound_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    args = build_parser().parse_args(argv)
    config = config_from_args(args)
    try:
        import uvloop  # noqa: PLC0415 - optional speed-up, absent on some platforms
    except ImportError:
        loop_factory = None
    else:
        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve(config, args.host, args.port))
    return 0
