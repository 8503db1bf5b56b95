"""Sample questions from DeepMind's mathematics generator (PyPI ``mathematics_dataset``).

Run with an interpreter that has the package (it is not a project dependency)::

    python -m venv /tmp/md && /tmp/md/bin/pip install mathematics_dataset==1.0.1
    /tmp/md/bin/python router_models/training/gen_mathematics.py --per-module 120 > dm.jsonl

It prints one ``{"module", "question"}`` line per question from the generator's
``interpolate`` (test) regime, for the modules named by the labelling rules, seeded so the
same version gives the same lines.  Standalone: it imports nothing of this project.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

MODULES = (
    "algebra__linear_2d",
    "arithmetic__add_or_sub",
    "arithmetic__add_sub_multiple",
    "arithmetic__div",
    "arithmetic__mixed",
    "arithmetic__mul",
    "arithmetic__mul_div_multiple",
    "comparison__pair",
    "comparison__pair_composed",
    "measurement__conversion",
    "numbers__div_remainder",
    "numbers__div_remainder_composed",
    "numbers__is_factor",
    "numbers__is_factor_composed",
    "numbers__place_value",
    "numbers__place_value_composed",
    "numbers__round_number",
    "numbers__round_number_composed",
)


def main() -> int:
    """Print the sampled questions as JSONL."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--per-module", type=int, default=120)
    parser.add_argument("--seed", type=int, default=20261206)
    args = parser.parse_args()
    import numpy as np  # noqa: PLC0415 - the generator's environment, not this project's
    from absl import flags  # type: ignore[import-not-found]  # noqa: PLC0415
    from mathematics_dataset import generate  # type: ignore[import-not-found]  # noqa: PLC0415

    if not hasattr(np, "object"):  # the 1.0.1 release predates numpy 1.24
        np.object = object  # type: ignore[attr-defined]
    flags.FLAGS(["gen_mathematics"])
    generate.init_modules(train_split=False)
    modules = generate.filtered_modules["interpolate"]
    for name in MODULES:
        random.seed(f"{args.seed}-{name}")
        np.random.seed(args.seed % (2**32))
        seen: set[str] = set()
        tries = 0
        while len(seen) < args.per_module and tries < args.per_module * 5:
            tries += 1
            problem, _ = generate.sample_from_module(modules[name])
            question = str(problem.question)
            if question in seen:
                continue
            seen.add(question)
            sys.stdout.write(json.dumps({"module": name, "question": question}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
