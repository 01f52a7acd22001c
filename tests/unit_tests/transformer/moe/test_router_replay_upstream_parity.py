"""Routing replay off, or on with no replay action set, equals pristine upstream
(patches moe-routing-replay-skip-mtp and moe-routing-replay-hardening)."""

import pytest

from tests.unit_tests.upstream_oracle import MOE, MOE_MTP, MTP, gpt_spec


@pytest.mark.slow
def test_replay_off_equals_pristine_upstream(upstream_oracle):
    upstream_oracle.compare([MOE_MTP])


@pytest.mark.slow
def test_replay_enabled_but_idle_equals_pristine_upstream(upstream_oracle):
    upstream_oracle.compare([gpt_spec("MoE+MTP, replay enabled", **MOE, **MTP, moe_enable_routing_replay=True)])
