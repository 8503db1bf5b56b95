"""Hashed feature vectors: the router's own features, scorable without the text."""

from __future__ import annotations

import math
from typing import Any

import router_models
from router_models.artifact import load as load_model
from router_models.features import FEATURE_SPEC, extract
from router_models.training.shadow_train import scores, to_csr
from router_models.vectors import feature_space, hashed_vector

BODIES: list[dict[str, Any]] = [  # request bodies: arbitrary JSON
    {"messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"prompt": "Prove that there are infinitely many primes, step by step.", "max_tokens": 9},
    {"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": ""}]},
]


def test_vector_is_extract_sorted() -> None:
    """The vector is ``features.extract`` as increasing indices with their values."""
    for body in BODIES:
        vector = hashed_vector(body)
        feats = extract(body)
        assert list(vector.index) == sorted(feats)
        assert vector.value == tuple(feats[i] for i in vector.index)
        assert vector.space == feature_space()


def test_feature_space_names_the_spec_and_is_stable() -> None:
    """The space id starts with the spec's name and is the same on every call."""
    space = feature_space()
    assert space.startswith(str(FEATURE_SPEC["name"]) + ":")
    assert len(space.split(":")[1]) == 12
    assert feature_space() == space


def test_scores_from_vectors_match_the_lean_scorer() -> None:
    """Scoring stored vectors gives the serving scorer's probability, without the text."""
    router = router_models.load()
    model = load_model(router_models.DEFAULT_ARTIFACT)
    from_vectors = scores(model, to_csr([hashed_vector(b) for b in BODIES]))
    for body, value in zip(BODIES, from_vectors, strict=True):
        assert math.isclose(router.score(body), float(value), abs_tol=1e-9)


def test_the_loaded_router_carries_its_file_digest() -> None:
    """``load`` names the artifact by the sha256 of its bytes."""
    router = router_models.load()
    assert router.artifact_id == router_models.artifact_digest(router_models.DEFAULT_ARTIFACT)
    assert router.artifact_id is not None
    assert router.artifact_id.startswith("sha256:")
