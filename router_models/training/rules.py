"""The labelling rules of docs/router.md ("Labelling rules"), as code every builder calls.

*complex*: the task needs several reasoning or computation steps, code written or fixed,
strictly structured output, or long analytical writing.  *simple*: one operation, a look-up
over given text or recall of one fact, a short rewrite, a classification: however many numbers
or how much pasted material the prompt carries.  A source field that does not decide between
the two drops the row (``None``); nothing is guessed.
"""

from __future__ import annotations

import re
from typing import Final, Literal

Label = Literal["simple", "complex"]

# A number written as a fraction, a percentage or a mixed number is one operand, not an
# operation: ``(3/5)``, ``\frac{1}{2}``, ``25%``.
_FRACTION: Final = re.compile(r"\(\s*\d+(?:\.\d+)?\s*/\s*\d+(?:\.\d+)?\s*\)|\\frac\{\d+\}\{\d+\}")
_LATEX_OPS: Final = (
    ("\\times", "*"),
    ("\\div", "/"),
    ("\\cdot", "*"),
    ("\u00d7", "*"),  # multiplication sign
    ("\u00f7", "/"),  # division sign
)
# A binary operator between two operands (a digit, a bracket or a single-letter unknown).
_OPERATION: Final = re.compile(r"(?<=[\d)\]}a-zA-Z])\s*[-+*/^]\s*(?=[\d(\[{a-zA-Z])")


def count_operations(expression: str) -> int:
    """Binary arithmetic operations in an equation or worked solution.

    ``x=6000/(1+(3/5))`` has 2 (the fraction is one number), ``( 76.0 - 25.0 )`` has 1.
    """
    text = expression
    for latex, plain in _LATEX_OPS:
        text = text.replace(latex, plain)
    text = _FRACTION.sub("1", text)
    text = re.sub(r"^\s*[a-zA-Z]\s*=", "", text)  # the unknown on the left of ``x=...``
    return len(_OPERATION.findall(text))


SEVERAL_STEPS: Final = 3


def label_from_operations(operations: int) -> Label | None:
    """Rule M (maths): one operation is simple, three or more steps are complex; none (nothing
    to count) and exactly two (neither one step nor several) are dropped."""
    if operations == 1:
        return "simple"
    if operations >= SEVERAL_STEPS:
        return "complex"
    return None


# Rule K (knowledge exams, MMLU-style subjects).  A subject is complex when its questions are
# mostly solved by computing or deriving (several steps), simple when they are mostly recall
# of one fact.  Subjects that mix both (elementary maths holds one-operation sums and
# multi-step problems; econometrics, astronomy, law, philosophy mix recall and derivation) are
# dropped, not guessed.
COMPUTE_SUBJECTS: Final = frozenset(
    (
        "abstract_algebra",
        "college_chemistry",
        "college_computer_science",
        "college_mathematics",
        "college_physics",
        "formal_logic",
        "high_school_chemistry",
        "high_school_computer_science",
        "high_school_mathematics",
        "high_school_physics",
        "high_school_statistics",
        "machine_learning",
    )
)
RECALL_SUBJECTS: Final = frozenset(
    (
        "anatomy",
        "clinical_knowledge",
        "global_facts",
        "high_school_biology",
        "high_school_geography",
        "high_school_psychology",
        "human_aging",
        "human_sexuality",
        "management",
        "marketing",
        "medical_genetics",
        "miscellaneous",
        "nutrition",
        "prehistory",
        "public_relations",
        "sociology",
        "virology",
        "world_religions",
    )
)


def label_from_subject(subject: str) -> Label | None:
    """Rule K: the exam subject's usual task (derive vs recall), or ``None`` when it mixes."""
    if subject in COMPUTE_SUBJECTS:
        return "complex"
    if subject in RECALL_SUBJECTS:
        return "simple"
    return None


def label_from_difficulty(difficulty: int, solution_operations: int) -> Label | None:
    """Rule M with the source's own difficulty grade as a second witness.

    Easiest grade (0) *and* a worked solution of exactly one operation: simple.  Grade 2 or
    above *and* a solution of three or more operations: complex.  Anything else disagrees
    with itself (or has nothing to count) and is dropped.
    """
    steps = label_from_operations(solution_operations)
    if difficulty == 0 and steps == "simple":
        return "simple"
    if difficulty >= 2 and steps == "complex":
        return "complex"
    return None


# Rule M for the DeepMind mathematics generator: a module that asks for one operation is
# simple; the module composed from several (``*_composed``: the answer of one sub-problem feeds
# the next) or one that is several steps by definition (mixed arithmetic, a 2x2 linear system)
# is complex.
ONE_OPERATION_MODULES: Final = frozenset(
    (
        "arithmetic__add_or_sub",
        "arithmetic__div",
        "arithmetic__mul",
        "comparison__pair",
        "measurement__conversion",
        "numbers__div_remainder",
        "numbers__is_factor",
        "numbers__place_value",
        "numbers__round_number",
    )
)
SEVERAL_STEP_MODULES: Final = frozenset(
    (
        "algebra__linear_2d",
        "arithmetic__add_sub_multiple",
        "arithmetic__mixed",
        "arithmetic__mul_div_multiple",
        "comparison__pair_composed",
        "numbers__div_remainder_composed",
        "numbers__is_factor_composed",
        "numbers__place_value_composed",
        "numbers__round_number_composed",
    )
)


def label_from_module(module: str) -> Label | None:
    """Rule M on a generator module name."""
    if module in ONE_OPERATION_MODULES:
        return "simple"
    if module in SEVERAL_STEP_MODULES:
        return "complex"
    return None


def label_from_hops(question_type: str) -> Label | None:
    """Rule R (multi-hop questions): a bridge through an unnamed entity is complex; a
    comparison of two named entities' facts is two look-ups and simple (a weak mapping)."""
    if question_type == "compositional":
        return "complex"
    if question_type == "comparison":
        return "simple"
    return None


# Rule C (stacked constraints): a task that is simple by itself (a short rewrite, a summary, a
# translation, a short story, a short answer) carrying four or more stacked constraints on
# its output (length, format, words, order, tone, language) is strictly structured output and
# complex; the same task with at most one constraint stays simple; two or three are neither.
SIMPLE_CONSTRAINTS: Final = 1
SEVERAL_CONSTRAINTS: Final = 4


def label_from_constraints(level: int) -> Label | None:
    """Rule C on a source's own count of constraints added to a simple base task."""
    if 0 <= level <= SIMPLE_CONSTRAINTS:
        return "simple"
    if level >= SEVERAL_CONSTRAINTS:
        return "complex"
    return None


# Rule S (stated reasoning steps): a source that builds each item from a known number of
# inference steps or hops over the facts it states (a spatial relation chained over k agents,
# a deduction of depth d) gives that count in its own field.  One step is a look-up of a
# stated fact or a single deduction: simple, however many distracting sentences surround it.
# Three or more chained steps are a chain of deductions: complex.  Two are neither (as in
# rule M) and are dropped.
def label_from_steps(steps: int) -> Label | None:
    """Rule S on a source's own count of reasoning steps (hops, deduction depth): the same
    count-to-label mapping as rule M's operations."""
    return label_from_operations(steps)
