"""A fast, faithful simulator of vLLM's OpenAI-compatible server (for tests, demos, benchmarks).

Run it with ``python -m simulator --port 0`` or ``tiergate simulate``; see ``simulator.cli``.
The gateway never imports this package.
"""
