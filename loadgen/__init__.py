"""``tiergate bench``: a load generator that measures what users feel (TTFT, TPOT, ITL, E2E).

It talks to any OpenAI-compatible server over HTTP, the gateway or a backend directly, and
imports nothing from the gateway.
"""
