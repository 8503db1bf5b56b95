"""docs/overload.md's defaults and bounds: the queue settings, the key fields, Retry-After's
range, the once-a-spell shedding line, the /admin/queue document and the overhead buckets."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace
from typing import cast

import pytest
from pydantic import ValidationError
from structlog.testing import capture_logs

from gateway.config.settings import QueueSettings
from gateway.config.tier_settings import TierSettings
from gateway.http.admin_backends import queue_body
from gateway.telemetry.metrics import OVERHEAD_BUCKETS
from gateway.upstream.fair_queue import Ticket
from gateway.upstream.forwarding import TierRoute
from gateway.upstream.replicas import SHED_QUIET_S, QueueSetup, ReplicaPool
from policies.keys import policy_from_dict
from policies.principal import KeyPolicy

URL = "http://10.0.0.1:8000"


def test_the_queue_settings_and_key_fields_default_as_the_tables_say() -> None:
    """policy fair, 1,024 waiters, class waits from the tier's 1 s, no batch cap (0 < s <= 1);
    a key is interactive with weight 1."""
    queue = QueueSettings()
    assert (queue.policy, queue.max_length, queue.batch_max_share) == ("fair", 1024, 1.0)
    assert queue.interactive_wait_s is None
    assert queue.batch_wait_s is None
    assert TierSettings.model_fields["max_queue_wait_s"].default == 1.0
    pool = ReplicaPool("fast", [URL], 1, 1.0, queue=QueueSetup(waits=queue.waits()))
    assert pool.class_waits == {"interactive": 1.0, "batch": 1.0}
    assert QueueSettings(batch_max_share=1).batch_max_share == 1
    for bad in (0, 1.01):
        with pytest.raises(ValidationError):
            QueueSettings(batch_max_share=bad)
    assert (KeyPolicy().priority, KeyPolicy().queue_weight) == ("interactive", 1.0)


@pytest.mark.parametrize("weight", [0.001, 1000])
def test_a_keys_queue_weight_may_be_0_001_to_1000(weight: float) -> None:
    """Both ends are accepted; just outside them is refused."""
    assert policy_from_dict({"queue_weight": weight}).queue_weight == weight
    outside = weight * 0.999 if weight < 1 else weight * 1.001
    with pytest.raises(ValueError, match="queue_weight"):
        policy_from_dict({"queue_weight": outside})


def test_retry_after_without_recent_hand_overs_is_the_longest_wait_within_1_to_60() -> None:
    """Nothing handed over lately: the longest configured class wait, rounded up, 1 to 60 s;
    the drain rate is taken over the last 64 hand-overs."""
    assert (
        ReplicaPool("f", [URL], 1, 1.0, queue=QueueSetup(waits={"batch": 7.2})).retry_after() == 8
    )
    assert ReplicaPool("f", [URL], 1, 0.05).retry_after() == 1
    assert ReplicaPool("f", [URL], 1, 500.0).retry_after() == 60
    assert ReplicaPool("f", [URL], 1, 1.0)._drained.maxlen == 64


def test_a_shedding_tier_logs_one_warning_a_spell() -> None:
    """``tier.shedding`` with tier, reason, waiters and in flight, once until 30 s pass
    without shedding."""
    assert SHED_QUIET_S == 30.0
    pool = ReplicaPool("fast", [URL], 1, 1.0)
    with capture_logs() as logs:
        for _ in range(3):
            pool.overloaded(Ticket("acme"), "full")
        pool._shed_at -= SHED_QUIET_S + 1  # the last shed was over 30 s ago
        pool.overloaded(Ticket("acme"), "deadline")
    lines = [line for line in logs if line["event"] == "tier.shedding"]
    assert [line["reason"] for line in lines] == ["full", "deadline"]
    assert lines[0]["log_level"] == "warning"
    assert {"tier", "reason", "waiting", "in_flight"} <= set(lines[0])


def test_the_admin_queue_document_has_what_the_doc_lists() -> None:
    """Per tier: policy, waiters, each class's longest wait, the Retry-After now, sheds by
    class and reason, and the top 10 tenants by wait and by refusals."""
    pool = ReplicaPool("fast", [URL], 1, 2.0)
    for index in range(12):
        pool.queue_stats.refused(Ticket(f"t{index}"), "full")
        pool.queue_stats.waited(Ticket(f"t{index}"), 0.1 * (index + 1))
    route = cast(TierRoute, SimpleNamespace(pool=pool))
    fast = json.loads(queue_body({"fast": route}))["tiers"]["fast"]
    assert fast["policy"] == "fair"
    assert fast["waiting"] == 0
    assert fast["max_wait_s"] == {"interactive": 2.0, "batch": 2.0}
    assert fast["retry_after_s"] == 2
    assert fast["shed"] == {"interactive/full": 12}
    assert len(fast["top_tenants"]["by_wait"]) == 10
    assert len(fast["top_tenants"]["by_refusals"]) == 10
    assert fast["top_tenants"]["by_wait"][0]["tenant"] == "t11"


def test_the_overhead_histogram_reaches_5_s() -> None:
    """``tiergate_overhead_seconds`` has buckets up to 5 s."""
    assert max(OVERHEAD_BUCKETS) == 5.0
    assert math.isfinite(OVERHEAD_BUCKETS[-1])
