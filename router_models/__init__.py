"""The tier router: which requests need the precise tier.

Embedding API::

    import router_models

    router = router_models.load()             # the shipped artifact (or load(path))
    p = router.score({"messages": [{"role": "user", "content": "Prove that ..."}]})
    t = router.threshold_for_share(0.30)      # cost dial: 30 % to the precise tier
    tier = "precise" if p >= t else "fast"

``score`` takes an OpenAI chat or completion request body and returns the calibrated
probability that the request needs the precise tier.  No scikit-learn is imported at serve
time and no pickle is ever loaded.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from policies.threshold import threshold_for_share
from router_models.artifact import DEFAULT_ARTIFACT, ArtifactError, RouterModel
from router_models.artifact import load as load_model
from router_models.scorer import LeanScorer

__all__ = [
    "DEFAULT_ARTIFACT",
    "FAST",
    "PRECISE",
    "ArtifactError",
    "Router",
    "artifact_digest",
    "load",
]

PRECISE: Final = "precise"
FAST: Final = "fast"


class Router:
    """A loaded router artifact: scoring plus the share-to-threshold dial."""

    def __init__(self, model: RouterModel, artifact_id: str | None = None) -> None:
        self._model = model
        # ``sha256:<hex>`` of the artifact file's bytes (None for a model built in memory).
        self.artifact_id = artifact_id
        self._scorer = LeanScorer(model)
        quantiles = model.metadata.get("reference", {}).get("quantiles", [])
        self._quantiles: list[float] = [float(q) for q in quantiles]

    @property
    def metadata(self) -> Mapping[str, Any]:
        """Artifact metadata: version, data digest, feature set, default threshold, ..."""
        return self._model.metadata

    @property
    def default_threshold(self) -> float:
        """Threshold for the artifact's default target share on its reference sample."""
        return float(self._model.metadata["default_threshold"])

    def score(self, request_body: Mapping[str, Any]) -> float:
        """Probability in [0, 1] that ``request_body`` needs the precise tier."""
        return self._scorer.score(request_body)

    def tier(self, request_body: Mapping[str, Any], threshold: float | None = None) -> str:
        """``"precise"`` when the score reaches ``threshold`` (default threshold if None)."""
        limit = self.default_threshold if threshold is None else threshold
        return PRECISE if self.score(request_body) >= limit else FAST

    def threshold_for_share(self, share: float, sample: Sequence[float] | None = None) -> float:
        """Threshold sending ``share`` of traffic to the precise tier.

        With ``sample`` (scores of a sample of your own traffic) this is the exact
        ``1 - share`` quantile of that sample, which is what operators should use.  Without
        it, the quantile is interpolated from the artifact's reference distribution (the
        out-of-fold scores of the training corpus).
        """
        if sample is not None:
            return threshold_for_share(sample, share)
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"share must be within [0, 1], got {share!r}")
        if share == 0.0:
            return math.nextafter(1.0, math.inf)  # no score reaches it: nothing is sent
        if share == 1.0:
            return 0.0
        if not self._quantiles:
            raise ArtifactError("artifact has no reference quantiles")
        position = (1.0 - share) * (len(self._quantiles) - 1)
        low = int(position)
        high = min(low + 1, len(self._quantiles) - 1)
        frac = position - low
        return self._quantiles[low] * (1.0 - frac) + self._quantiles[high] * frac


def artifact_digest(path: Path) -> str:
    """``sha256:<hex>`` of a file's bytes: the id of the artifact it holds."""
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def load(path: str | Path | None = None) -> Router:
    """Load a router artifact (the shipped default when ``path`` is None)."""
    where = Path(path) if path is not None else DEFAULT_ARTIFACT
    return Router(load_model(where), artifact_digest(where))
