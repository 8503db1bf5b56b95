"""Exam-style multiple-choice questions, recall against calculation, in English, Chinese and
Japanese (router round 17, docs/router.md).

Labelling rule K makes a question simple when it asks to recall one fact (a year, a count, a
name, a term) and complex when its answer needs several computing steps (physics or chemistry
with given quantities, statistics, probability, algebra, interest, geometry). Both kinds here
have the same packaging: a lead drawn from one pool per language, the stem, four lettered
options in a layout drawn from one pool per language, and an answer instruction drawn from one
pool per language, so the packaging carries no label. Recall items live in
``phrases/exam_recall_<language>.txt`` (``stem | right | wrong | wrong | wrong``); the
calculation templates are ``exam_calcs.CALCS``, each with its own slots, its solution and the slips
that make its wrong options. Every fact and template is written for this project.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from random import Random
from typing import Final

from router_models.corpus.exam_calcs import CALCS, LANGUAGES, Calc, Number, Slots, show
from router_models.corpus.lexicon import one, phrases

__all__ = ["CALCS", "LANGUAGES", "Calc", "Question", "Slots", "calculation", "question", "recall"]

# fmt: off
LEADS: Final[Mapping[str, tuple[str, ...]]] = {
    "en": ("", "", "", "Question {n}. ", "Multiple choice: ", "Exam practice - question {n}: ",
           "Choose the correct answer.\n", "Q{n}. ", "Practice test, item {n}: "),
    "zh": ("", "", "", "单选题：", "第{n}题：", "选择题（本题{p}分）\n", "{n}．",
           "请回答下面的选择题。\n",
           "模拟考试第{n}题："),
    "ja": ("", "", "", "問{n}　", "【選択問題】", "次の問いに答えよ。\n", "第{n}問　", "（{p}点）",
           "練習問題{n}："),
}
LAYOUTS: Final[Mapping[str, tuple[str, ...]]] = {
    "en": ("\nA. {0}\nB. {1}\nC. {2}\nD. {3}", "\n(A) {0}\n(B) {1}\n(C) {2}\n(D) {3}",
           "\nA) {0}  B) {1}  C) {2}  D) {3}", " A. {0} B. {1} C. {2} D. {3}"),
    "zh": ("\nA. {0}\nB. {1}\nC. {2}\nD. {3}", "\nA．{0}　B．{1}　C．{2}　D．{3}",
           "\nA、{0}\nB、{1}\nC、{2}\nD、{3}", "（A）{0}（B）{1}（C）{2}（D）{3}"),
    "ja": ("\nA. {0}\nB. {1}\nC. {2}\nD. {3}", "\nA　{0}　B　{1}　C　{2}　D　{3}",
           "\n(A) {0}\n(B) {1}\n(C) {2}\n(D) {3}", "\nA：{0}\nB：{1}\nC：{2}\nD：{3}"),
}
INSTRUCTIONS: Final[Mapping[str, tuple[str, ...]]] = {
    "en": ("", "", "Answer with the letter only.", "Choose A, B, C or D.",
           "Reply with the correct option.", "Select one answer.", "Which option is correct?"),
    "zh": ("", "", "请选出正确答案。", "只需回答选项字母。", "从A、B、C、D中选择一项。",
           "请直接给出答案。", "正确的一项是？"),
    "ja": ("", "", "正しいものを一つ選びなさい。", "記号で答えてください。",
           "A〜Dから一つ選び、記号のみで答えよ。", "答えだけを書いてください。",
           "正しい選択肢はどれか。"),
}
_ROUNDING: Final[Mapping[str, Mapping[int, str]]] = {
    "en": {1: " Give the answer to one decimal place.",
           2: " Give the answer to two decimal places.",
           3: " Give the answer to three decimal places.",
           4: " Give the answer to four decimal places."},
    "zh": {1: "（结果保留一位小数）", 2: "（结果保留两位小数）", 3: "（结果保留三位小数）",
           4: "（结果保留四位小数）"},
    "ja": {1: "（小数第2位を四捨五入して答えよ）", 2: "（小数第3位を四捨五入して答えよ）",
           3: "（小数第4位を四捨五入して答えよ）", 4: "（小数第5位を四捨五入して答えよ）"},
}
# fmt: on


@dataclass(frozen=True)
class Question:
    """One question before layout: its stem, the four options shown and the right one's index."""

    stem: str
    options: tuple[str, str, str, str]
    answer: int


def _fallbacks(answer: Number, places: int) -> tuple[Number, ...]:
    """Wrong values to use when a template's slips coincide with the answer or each other."""
    if isinstance(answer, Fraction):
        p, q = answer.numerator, answer.denominator
        return tuple(Fraction(a, b) for a, b in ((p + 1, q), (max(p - 1, 1), q), (p, q + 1),
                                                 (p + 2, q), (1, q + 2), (p, q + 3)))  # fmt: skip
    step = max(abs(float(answer)) * 0.15, 10.0**-places)
    return tuple(float(answer) + k * step for k in (1, -1, 2, -2, 3, 4, 5))


def calculation(rng: Random, language: str) -> tuple[Calc, Slots, Question]:
    """A calculation question (complex) in ``language``, with its template and slots."""
    calc = one(rng, CALCS)
    slots = calc.draw(rng)
    answer = calc.solve(slots)
    unit = calc.unit[language]
    right = unit.format(show(answer, calc.places))
    options = [right]
    for value in (*calc.slips(slots), *_fallbacks(answer, calc.places)):
        text = unit.format(show(value, calc.places))
        if calc.low < float(value) <= calc.high and text not in options and len(options) < 4:
            options.append(text)
    rng.shuffle(options)
    shown = {k: show(v) for k, v in slots.items()}
    stem = calc.stems[language].format(**shown)
    if not isinstance(answer, Fraction) and show(answer, calc.places) != show(answer, 12):
        stem += _ROUNDING[language][calc.places]
    return (
        calc,
        slots,
        Question(stem, (options[0], options[1], options[2], options[3]), options.index(right)),
    )


def recall(rng: Random, language: str) -> Question:
    """A one-fact recall question (simple) in ``language``: its options shuffled."""
    stem, right, *wrong = one(rng, phrases(f"exam_recall_{language}")).split(" | ")
    options = [right, *wrong]
    rng.shuffle(options)
    return Question(stem, (options[0], options[1], options[2], options[3]), options.index(right))


def render(rng: Random, language: str, question: Question) -> str:
    """A question as an exam prints it: lead, stem, lettered options, answer instruction, each
    drawn from the language's pools (the same pools for both labels)."""
    lead = one(rng, LEADS[language]).format(n=rng.randint(1, 40), p=one(rng, (2, 3, 4, 5)))
    layout = one(rng, LAYOUTS[language]).format(*question.options)
    instruction = one(rng, INSTRUCTIONS[language])
    text = lead + question.stem + layout
    return text + "\n" + instruction if instruction else text


def question(rng: Random, language: str, kind: str) -> str:
    """An exam multiple-choice question in ``language`` (``en``, ``zh``, ``ja``): ``kind``
    ``recall`` asks for one fact (simple), ``calculation`` needs several computing steps
    (complex)."""
    if kind == "recall":
        return render(rng, language, recall(rng, language))
    return render(rng, language, calculation(rng, language)[2])
