"""Arithmetic word problems by their number of operations, in English, Chinese and Japanese.

The labelling rules (docs/router.md) make a word problem simple when one arithmetic operation
answers it (a sum, a difference, a product, a share, change from a payment, a percentage of a
number), however many digits, decimals or currency signs it carries, and complex when it
needs three or more. The corpus's multi-step family (``math_problems``) is English and
complex only, so until these families a prompt that looked like a word problem was complex
by its look. Here both sides share the same stories, names, numbers, leads and endings in
each language, and the Chinese and Japanese multi-step problems give those languages the
complex side. Every template is written for this project.
"""

from __future__ import annotations

from random import Random

from router_models.corpus.lexicon import FOODS, NAMES, one, phrases, some

# fmt: off
_EN_LEADS = ("", "", "", "", "Math question: ", "Help with homework - ", "Can you solve this? ",
             "Problem: ", "Quick one: ", "Question: ")
_EN_ENDINGS = ("", "", "", "", " Show your work.", " Explain step by step.",
               " Give the final answer at the end.", " Please explain how you got the answer.")

_ZH_NAMES = ("小明", "小红", "王芳", "李华", "张伟", "刘洋", "陈静", "赵磊", "小丽", "小刚")
_ZH_ITEMS = ("书包", "文具盒", "足球", "台灯", "水杯", "雨伞", "字典", "玩具车")
_ZH_FOODS = ("苹果", "橘子", "鸡蛋", "面包", "饼干", "铅笔", "气球", "本子")
_ZH_LEADS = ("", "", "", "数学题：", "请帮我做这道题：", "应用题：", "请解答：")
_ZH_ENDINGS = ("", "", "", "请写出算式。", "请一步一步地解答。", "请写出解题过程。")

_JA_NAMES = ("田中", "佐藤", "鈴木", "高橋", "山本", "中村", "小林", "加藤", "吉田", "山田")
_JA_ITEMS = ("筆箱", "サッカーボール", "電気スタンド", "水筒", "かさ", "辞書", "おもちゃ")
_JA_FOODS = ("りんご", "みかん", "たまご", "パン", "クッキー", "えんぴつ", "ふうせん", "ノート")
_JA_LEADS = ("", "", "", "算数の問題です。", "この問題を解いてください：", "問題：",
             "宿題です。")
_JA_ENDINGS = ("", "", "", "式も書きなさい。", "考え方も説明してください。",
               "途中の計算も書いてください。")
# fmt: on


def _slots(rng: Random, names: tuple[str, ...], items: tuple[str, ...],
           foods: tuple[str, ...]) -> dict[str, object]:  # fmt: skip
    """Every slot the templates use, drawn so that each template's answer makes sense: shares
    divide exactly, differences, change and remainders stay positive, money and pages cover
    what is spent and read (``tests/router_models/test_arithmetic_attack.py``)."""
    k, m, n1, t1 = rng.randint(2, 12), rng.randint(2, 15), rng.randint(12, 900), rng.randint(-5, 20)
    total = k * rng.randint(3, 250)
    n2 = rng.randint(1, min(n1, total) - 1)  # fewer absent than students; a shorter width
    p = rng.randint(3, 95)
    q = rng.randint(2, min(40, p - 1))  # a discount below the price
    h = rng.randint(2, 9)
    d1, d2 = rng.randint(2 * h, 42), rng.randint(2 * h, 42)  # together they need h days or more
    cents = rng.randint(100, 48000) if rng.random() < 0.5 else 100 * rng.randint(3, 480)
    price = f"{cents // 100}.{cents % 100:02d}" if cents % 100 else str(cents // 100)
    bill = one(rng, [b for b in (5, 10, 20, 50, 100, 200, 500, 1000) if 100 * b > cents])
    a, b = some(rng, names, 2)
    return {
        "a": a, "b": b, "item": one(rng, items), "food": one(rng, foods),
        "price": price, "bill": bill, "n1": n1, "n2": n2, "k": k, "m": m, "p": p, "q": q,
        "total": total, "t1": t1, "t2": t1 + rng.randint(2, 15), "d1": d1, "d2": d2,
        "s1": rng.randint(40, 320), "s2": rng.randint(30, 120), "h": h, "h2": rng.randint(2, 6),
        "w": rng.randint(15, 90), "w2": rng.randint(5, 14), "p1": rng.randint(60, 900),
        "p2": rng.randint(5, 59), "big": rng.randint(n1 + 1, n1 + 9000),
        "rows": rng.randint(8, 40), "seats": rng.randint(10, 36),
        "money": k * p + q + rng.randint(10, 500), "paid": k * rng.randint(3, 60),
        "pages": m * k + n2 % 40 * rng.randint(2, 20) + 40,
    }  # fmt: skip


_LANGUAGES: dict[str, tuple[tuple[str, ...], ...]] = {
    "en": (NAMES, ("notebook", "lamp", "umbrella", "backpack", "mug"), FOODS, _EN_LEADS,
           _EN_ENDINGS),
    "zh": (_ZH_NAMES, _ZH_ITEMS, _ZH_FOODS, _ZH_LEADS, _ZH_ENDINGS),
    "ja": (_JA_NAMES, _JA_ITEMS, _JA_FOODS, _JA_LEADS, _JA_ENDINGS),
}  # fmt: skip


def problem(rng: Random, language: str, steps: str) -> str:
    """A word problem in ``language`` (``en``, ``zh``, ``ja``): ``steps`` ``one`` is answered by
    one arithmetic operation (simple), ``multi`` needs three or more (complex; Chinese and
    Japanese only, the English ones are ``math_problems.word_problem``)."""
    names, items, foods, leads, endings = _LANGUAGES[language]
    slots = _slots(rng, names, items, foods)
    lead = one(rng, leads)  # drawn in this order: lead, template, ending
    text = one(rng, phrases(f"arith_{steps}_{language}")).format(**slots)
    return lead + text + one(rng, endings)
