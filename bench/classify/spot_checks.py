"""Scores of a few hand-picked prompts (the issue's failure shapes) under two artifacts.

Usage: ``.venv/bin/python bench/classify/spot_checks.py OLD.npz [NEW.npz]`` (NEW defaults to
the shipped artifact).  Prints a Markdown table.  The prompts were written here to name each
shape; they are not from any dataset and say nothing about quality on their own.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import router_models  # noqa: E402 - after the path setup above

PROMPTS = (
    "hi! how are you today?",
    "Prove that there are infinitely many primes.",
    "Write a Python function to merge two sorted lists.",
    "What is the capital of France?",
    "I buy an apple for $0.75 and pay with $5. How much change do I get?",
    "小明有5个苹果，又买了3个，然后吃了2个，又分给同学一半，还剩几个？",  # noqa: RUF001
    "你好，今天天气怎么样？",  # noqa: RUF001
    "用Python写一个快速排序。",
    "次の文章を読んで質問に答えてください。太郎は東京に住んでいる。質問：太郎はどこに住んでいますか？",  # noqa: RUF001
    "Write a 1,000-word report analysing the causes of the 2008 financial crisis.",
    "Return the result as JSON with keys name and age: John is 31.",
)


def main() -> int:
    """Print the table."""
    old = router_models.load(sys.argv[1])
    new = router_models.load(sys.argv[2] if len(sys.argv) > 2 else None)
    print("| prompt | old | new |")
    print("|---|---:|---:|")
    for prompt in PROMPTS:
        body = {"messages": [{"role": "user", "content": prompt}]}
        print(f"| {prompt} | {old.score(body):.3f} | {new.score(body):.3f} |")
    print(
        f"| (default threshold) | {old.metadata['default_threshold']:.3f} | "
        f"{new.metadata['default_threshold']:.3f} |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
