"""Rate limits and budgets: per-key rpm/tpm/concurrency, Redis and in-memory limiters, spend
and usage.
"""
