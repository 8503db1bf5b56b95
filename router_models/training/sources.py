"""One reader per external training source: the fetched repository's files to labelled rows.

Every reader takes a ``Repo`` (a git directory and the commit pinned in ``PINS``), reads the
source's own files with ``git show`` and yields ``Row``s whose label comes from a rule in
``rules.py`` applied to the source's own fields.  The data cards (docs/router-data.md) say
which field each reader uses.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from router_models.training import rules


@dataclass(frozen=True, slots=True)
class Pin:
    """Where a source lives: repository, pinned commit, licence (as read from its files)."""

    repo: str
    commit: str
    licence: str


PINS: Final = {
    "jmmlu": Pin("nlp-waseda/JMMLU", "762cbf192c9e4588b574d718f95afd64c96fcbf4", "CC BY-SA 4.0"),
    "tal_scq5k": Pin("math-eval/TAL-SCQ5K", "8a66d6e14c65ba002beda39747e6b7c43bd2d472", "MIT"),
    "ape210k": Pin(
        "Chenny0808/ape210k", "52c52ebb517fdcd3dc69e908cc45f8bb0a121094", "MIT (README)"
    ),
    "jemhopqa": Pin("aiishii/JEMHopQA", "fed5024f4f39f02727e699cb7ccb67935a779a5a", "CC BY-SA 4.0"),
    "aqua": Pin("google-deepmind/AQuA", "26b64ed1f22208c6742f47df547dfd65088ec30d", "Apache-2.0"),
    "svamp": Pin("arkilpatel/SVAMP", "689d7ccac74b9983a2ac7cc3b264f441b99e7c53", "MIT"),
    "followbench": Pin(
        "YJiangcm/FollowBench", "6278f4c1377b4eafab737267b8b21acd52ea0e52", "Apache-2.0"
    ),
    "stepgame": Pin("ZhengxiangShi/StepGame", "5e6aff1563a6d7f46ee1f1aeff98b94e68c29005", "MIT"),
    "multi_logieval": Pin(
        "Mihir3009/Multi-LogiEval", "6d55ade5dfcc35e1382bf62335df3a061bc4c781", "MIT"
    ),
    "dm_mathematics": Pin(
        "google-deepmind/mathematics_dataset", "PyPI mathematics_dataset==1.0.1", "Apache-2.0"
    ),
}


@dataclass(frozen=True, slots=True)
class Row:
    """One labelled prompt of a source."""

    id: str
    source: str
    category: str  # the source's own field value, then ``/<lang>``
    label: str
    prompt: str

    def as_record(self) -> dict[str, Any]:
        """The JSONL form the trainer reads (``features.extract`` sees ``prompt`` only)."""
        return {
            "id": self.id,
            "source": self.source,
            "category": self.category,
            "label": self.label,
            "prompt": self.prompt,
        }


@dataclass(frozen=True, slots=True)
class Repo:
    """A fetched bare repository and the commit to read."""

    git_dir: Path
    commit: str

    def raw(self, path: str) -> bytes:
        """The file at ``path`` in the pinned commit, as bytes."""
        out = subprocess.run(  # noqa: S603 - fixed argv, no shell
            ["git", "--git-dir", str(self.git_dir), "show", f"{self.commit}:{path}"],  # noqa: S607
            check=True,
            capture_output=True,
        )
        return out.stdout

    def show(self, path: str) -> str:
        """The file at ``path`` in the pinned commit, as text."""
        return self.raw(path).decode("utf-8-sig")

    def paths(self, prefix: str) -> list[str]:
        """Tracked paths under ``prefix`` in the pinned commit, sorted."""
        out = subprocess.run(  # noqa: S603 - fixed argv, no shell
            ["git", "--git-dir", str(self.git_dir), "ls-tree", "-r", "--name-only", self.commit],  # noqa: S607
            check=True,
            capture_output=True,
            text=True,
        )
        return sorted(p for p in out.stdout.splitlines() if p.startswith(prefix))


def _choices(question: str, options: Sequence[str], letters: str = "ABCDE") -> str:
    lines = [question.strip()]
    lines += [f"{letters[i]}. {opt.strip()}" for i, opt in enumerate(options)]
    return "\n".join(lines)


# JMMLU: japanese_history and world_history carry non-commercial terms (README); the
# JMMLU_NC_ND folder is non-commercial, no-derivatives.  Neither is read.
_JMMLU_EXCLUDED: Final = frozenset(("japanese_history", "world_history"))


def jmmlu(repo: Repo) -> Iterator[Row]:
    """JMMLU (ja): rule K on the subject file's name."""
    for path in repo.paths("JMMLU/"):
        subject = Path(path).stem
        if not path.endswith(".csv") or subject in _JMMLU_EXCLUDED:
            continue
        label = rules.label_from_subject(subject)
        if label is None:
            continue
        for n, cells in enumerate(csv.reader(io.StringIO(repo.show(path)))):
            if len(cells) < 5 or not cells[0].strip():
                continue
            yield Row(
                f"jmmlu-{subject}-{n}",
                "jmmlu",
                f"{subject}/ja",
                label,
                _choices(cells[0], cells[1:5]),
            )


# TAL-SCQ5K rows taken from reserved competitions (AMC, AIME, gaokao, olympiads) are dropped
# by their ``competition_source_list``; the English half is not used at all (its rows name no
# competition, so AMC items cannot be told apart).
_TAL_RESERVED: Final = ("AMC", "AIME", "高考", "奥林匹克", "奥数", "olymp", "IMO")


def tal_scq5k(repo: Repo) -> Iterator[Row]:
    """TAL-SCQ5K, Chinese half: ``difficulty`` with the worked solution's operation count."""
    for path in repo.paths("ch_single_choice_constructed_5K/"):
        for line in repo.show(path).splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            sources = " ".join(item.get("competition_source_list") or [])
            if any(k.lower() in sources.lower() for k in _TAL_RESERVED):
                continue
            steps = rules.count_operations(" ".join(item.get("answer_analysis") or []))
            label = rules.label_from_difficulty(int(item["difficulty"]), steps)
            if label is None:
                continue
            options = [
                f"{o[0]['aoVal']}. {o[0]['content'].strip()}"
                for o in item["answer_option_list"]
                if o
            ]
            yield Row(
                f"tal_scq5k-{item['queId']}",
                "tal_scq5k",
                f"difficulty{item['difficulty']}/zh",
                label,
                "\n".join([item["problem"].strip(), *options]),
            )


def ape210k(repo: Repo) -> Iterator[Row]:
    """Ape210K (zh): rule M on the operations of the source's own ``equation``."""
    for path in ("data/valid.ape.json", "data/test.ape.json"):
        for line in repo.show(path).splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            ops = rules.count_operations(item["equation"])
            label = rules.label_from_operations(ops)
            if label is None:
                continue
            yield Row(
                f"ape210k-{item['id']}",
                "ape210k",
                f"ops{min(ops, 5)}/zh",
                label,
                item["original_text"],
            )


def jemhopqa(repo: Repo) -> Iterator[Row]:
    """JEMHopQA (ja): rule R on the question ``type``."""
    for path in ("corpus_ver1.2/train_ver1.2.json", "corpus_ver1.2/dev_ver1.2.json"):
        for item in json.loads(repo.show(path)):
            label = rules.label_from_hops(str(item.get("type")))
            if label is None:
                continue
            yield Row(
                f"jemhopqa-{item['qid']}",
                "jemhopqa",
                f"{item['type']}/ja",
                label,
                item["question"],
            )


def aqua(repo: Repo) -> Iterator[Row]:
    """AQuA-RAT (en, dev + test; the train files are absent from the snapshot): rule M on the
    operations of the source's own ``rationale``."""
    for path in ("dev.json", "test.json"):
        for n, line in enumerate(repo.show(path).splitlines()):
            if not line.strip():
                continue
            item = json.loads(line)
            ops = rules.count_operations(item["rationale"])
            label = rules.label_from_operations(ops)
            if label is None:
                continue
            options = [o.split(")", 1)[-1] for o in item["options"]]
            yield Row(
                f"aqua-{Path(path).stem}-{n}",
                "aqua",
                f"ops{min(ops, 5)}/en",
                label,
                _choices(item["question"], options, "ABCDE"),
            )


def svamp(repo: Repo) -> Iterator[Row]:
    """SVAMP (en): rule M on the operations of the source's own ``Equation``."""
    for item in json.loads(repo.show("SVAMP.json")):
        ops = rules.count_operations(item["Equation"])
        label = rules.label_from_operations(ops)
        if label is None:
            continue
        yield Row(
            f"svamp-{item['ID']}",
            "svamp",
            f"{item['Type'].lower()}/en",
            label,
            f"{item['Body'].strip()} {item['Question'].strip()}",
        )


def dm_mathematics(lines: Sequence[str]) -> Iterator[Row]:
    """DeepMind mathematics (en): rule M on the generator ``module`` (``gen_mathematics.py``
    writes the lines)."""
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        item = json.loads(line)
        label = rules.label_from_module(item["module"])
        if label is None:
            continue
        yield Row(
            f"dm_mathematics-{item['module']}-{n}",
            "dm_mathematics",
            f"{item['module']}/en",
            label,
            item["question"],
        )


# FollowBench base tasks kept: those whose base instruction is simple by itself and whose
# original dataset is not reserved.  Dropped: AlpacaEval's subsets (helpful_base, oasst,
# koala, vicuna), Quora question pairs (GLUE's QQP), and every dataset of the P3/T0 mixture
# (t0_zsnoopt_data, cnn_dailymail, xsum, samsum, gigaword, ROCStories/StoryCloze, E2E,
# CoNLL-2003); synthetic_data_generation (its constraints ask for structured output, rule C's
# complex side at any level).  The situation, style, format and example files are not read:
# their bases are code, reserved puzzles or AlpacaEval prompts, or their level counts
# examples, not constraints.
FOLLOWBENCH_FILES: Final = ("content_constraints.json", "mixed_constraints.json")
FOLLOWBENCH_BASES: Final = frozenset(
    (
        "COGNAC",
        "WIKIEVENTS",
        "sharegpt",
        "reddit",
        "text_editing",
        "NewsCommentary",
        "Tedtalks",
        "WritingPrompts",
        "Open Subtitles",
        "arxiv",
    )
)


def followbench(repo: Repo) -> Iterator[Row]:
    """FollowBench (en, zh): rule C on the row's own ``level`` (constraints added)."""
    for folder, lang in (("data", "en"), ("data_zh", "zh")):
        for name in FOLLOWBENCH_FILES:
            kind = name.split("_", 1)[0]  # the file is the constraint type
            for item in json.loads(repo.show(f"{folder}/{name}")):
                label = rules.label_from_constraints(int(item["level"]))
                prompt = str(item["instruction"]).strip()
                if label is None or not prompt or item["source"] not in FOLLOWBENCH_BASES:
                    continue
                yield Row(
                    f"followbench-{lang}-{kind}-{item['example_id']}-{item['level']}",
                    "followbench",
                    f"{kind}-level{item['level']}/{lang}",
                    label,
                    prompt,
                )


# StepGame: the noisy CompleteVersion's validation files (1,000 items per hop count k; the
# larger train and test files of k >= 4 are absent from the snapshot).  Noise sentences about
# other agents surround the chain.  The story grows with k (median 3 sentences at k = 1, 6 at
# k = 3, 9 at k = 4, 18 at k = 10), so only k = 3 and 4 are read for the complex side: the
# length gap to k = 1 stays as small as the rule allows.
STEPGAME_HOPS: Final = (1, 3, 4)


def stepgame(repo: Repo) -> Iterator[Row]:
    """StepGame (en): rule S on the hop count ``k`` of the file (``qa<k>_valid.json``)."""
    for k in STEPGAME_HOPS:
        label = rules.label_from_steps(k)
        if label is None:
            continue
        items = json.loads(repo.show(f"Dataset/CompleteVersion/noise/qa{k}_valid.json"))
        for key, item in items.items():
            story = " ".join(s.strip() for s in item["story"])
            yield Row(
                f"stepgame-k{k}-{key}",
                "stepgame",
                f"hop{k}/en",
                label,
                f"{story}\n{item['question'].strip()}",
            )


def _utf8_or_cp1252(raw: bytes) -> str:
    """Text of a file saved as UTF-8 or, as three Multi-LogiEval files are, as Windows-1252
    (``d\xe9cor``, a curly apostrophe)."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return raw.decode("cp1252")


def multi_logieval(repo: Repo) -> Iterator[Row]:
    """Multi-LogiEval (en): rule S on each file's own ``depth`` (``d1`` .. ``d5``)."""
    for path in repo.paths("data/d"):
        item = json.loads(_utf8_or_cp1252(repo.raw(path)))
        depth = int(str(item["depth"]).lstrip("d"))
        label = rules.label_from_steps(depth)
        if label is None:
            continue
        for sample in item["samples"]:
            yield Row(
                f"multi_logieval-{item['logic']}-{item['rule']}-d{depth}-{sample['id']}",
                "multi_logieval",
                f"{item['logic']}-d{depth}/en",
                label,
                f"{sample['context'].strip()}\n{sample['question'].strip()}",
            )


READERS: Final = {
    "jmmlu": jmmlu,
    "tal_scq5k": tal_scq5k,
    "ape210k": ape210k,
    "aqua": aqua,
    "svamp": svamp,
    "followbench": followbench,
    "stepgame": stepgame,
    "multi_logieval": multi_logieval,
}
