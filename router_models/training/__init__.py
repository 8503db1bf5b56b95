"""Build-time half of the router: training, evaluation, learning from shadow records, and the
external training sources with their labels and builders.

It needs scikit-learn (and scipy), the ``train`` extra; nothing here is imported by the serving
path (the gateway, ``router_models.scorer`` / ``artifact`` / ``features``), which stays
numpy-only (an import-linter contract in pyproject.toml). ``tiergate router train`` and
``tiergate router eval --held-out`` import it when they run.
``python -m router_models.training.build`` rebuilds
``router_models/training/data/external-train.jsonl`` from fetched copies of the source
repositories; ``docs/router-data.md`` holds one data card per source and ``docs/router.md``
the labelling rules that every builder applies (``rules.py``).
"""

from pathlib import Path
from typing import Final

# The rule-labelled public sources, as built by ``router_models.training.build``. Not in the
# shipped artifact's training data (issue 35: the candidate trained on them regressed on
# held-out sets; docs/router.md, "Public both-label sources").
EXTERNAL_TRAIN: Final = Path(__file__).resolve().parent / "data" / "external-train.jsonl"
# FollowBench's rule-C rows (stacked constraints, en + zh), in a file of their own: measured
# beside external-train.jsonl, in no artifact (docs/router-data.md, "followbench").
FOLLOWBENCH_TRAIN: Final = EXTERNAL_TRAIN.with_name("followbench.jsonl")
# Rule-S rows (stated reasoning steps: StepGame's hop count, Multi-LogiEval's deduction depth),
# each in a file of its own: measured beside the others, in no artifact (docs/router-data.md).
STEPGAME_TRAIN: Final = EXTERNAL_TRAIN.with_name("stepgame.jsonl")
MULTI_LOGIEVAL_TRAIN: Final = EXTERNAL_TRAIN.with_name("multi_logieval.jsonl")
RULE_LABELLED_SOURCES: Final = frozenset(
    ("ape210k", "aqua", "dm_mathematics", "jmmlu", "svamp", "tal_scq5k")
)
