"""Build-time half of the router: external training sources, their labels, their builders.

Nothing here is imported by the serving path (``router_models.scorer`` / ``artifact``), which
stays numpy-only.  ``python -m router_models.training.build`` rebuilds
``router_models/training/data/external-train.jsonl`` from fetched copies of the source
repositories; ``docs/router-data.md`` holds one data card per source and ``docs/router.md``
the labelling rules that every builder applies (``rules.py``).
"""
