"""Reading labelled or unlabelled JSONL records and turning them into request bodies."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

LABELS: Final = {"simple": 0, "complex": 1}
# Fields of a record that belong to the request body (everything else is annotation).
BODY_FIELDS: Final = (
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "response_format",
    "tools",
    "functions",
    "temperature",
)


class RecordError(ValueError):
    """A JSONL line that cannot be used."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every non-blank line of ``path`` as a JSON object."""
    records: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RecordError(f"{path}:{number}: invalid JSON: {exc}") from exc
            if not isinstance(record, dict):
                raise RecordError(f"{path}:{number}: expected a JSON object")
            records.append(record)
    return records


def body_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI request body described by a record (``prompt`` or ``messages`` + fields)."""
    if "prompt" not in record and "messages" not in record:
        raise RecordError(f"record {record.get('id', '?')!r} has neither prompt nor messages")
    return {k: record[k] for k in BODY_FIELDS if k in record}


def label_of(record: Mapping[str, Any]) -> int:
    """1 for ``complex``, 0 for ``simple``."""
    label = record.get("label")
    if label not in LABELS:
        raise RecordError(f"record {record.get('id', '?')!r} has label {label!r}")
    return LABELS[str(label)]


def load_labelled(paths: Sequence[Path]) -> tuple[list[dict[str, Any]], list[int]]:
    """Records and labels from one or more labelled JSONL files, in file order."""
    records = [r for p in paths for r in read_jsonl(p)]
    return records, [label_of(r) for r in records]


def data_digest(paths: Iterable[Path]) -> str:
    """``sha256:<hex>`` over the bytes of the training files, in order."""
    digest = hashlib.sha256()
    for path in paths:
        content = path.read_bytes()
        digest.update(len(content).to_bytes(8, "big"))
        digest.update(content)
    return "sha256:" + digest.hexdigest()
