"""Hashed feature vectors as data: what a shadow record stores instead of the prompt.

``hashed_vector(body)`` is the router's own ``features.extract`` (the vector every artifact is
trained and scored on), as sorted index and value tuples plus the identifier of the feature
space they live in. A vector from another feature space (the feature code changed since it
was recorded) cannot be scored or trained on: ``feature_space()`` tells them apart.
``router_models.training.shadow_train`` trains and scores from stored vectors alone, no text needed.
Serving imports this module (no scipy, no scikit-learn here).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router_models.features import FEATURE_SPEC, extract


@dataclass(frozen=True, slots=True)
class HashedVector:
    """A sparse feature vector: strictly increasing ``index`` with one ``value`` each."""

    space: str
    index: tuple[int, ...]
    value: tuple[float, ...]


@functools.cache
def feature_space() -> str:
    """``<spec name>:<12 hex of the spec's digest>``: equal exactly when vectors are comparable."""
    canonical = json.dumps(FEATURE_SPEC, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:12]
    return f"{FEATURE_SPEC['name']}:{digest}"


def hashed_vector(body: Mapping[str, Any]) -> HashedVector:
    """The router's feature vector of an OpenAI chat or completion request body."""
    feats = extract(body)
    keys = sorted(feats)
    return HashedVector(feature_space(), tuple(keys), tuple(feats[k] for k in keys))
