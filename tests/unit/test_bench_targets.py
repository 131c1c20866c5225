"""Every target of the bench is against a system cugraphrt does not build (GPU-free)."""

from __future__ import annotations

import pytest

from cugraphrt.bench.runner import WORKLOADS
from cugraphrt.bench.spec import Target, Workload


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_no_target_compares_cugraphrt_with_itself(workload):
    for target in workload.targets:
        assert target.reference not in workload.own, (target.system, target.reference)
        assert target.system in workload.own, f"{target.system} is not one of cugraphrt's"


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_every_system_named_after_cugraphrt_is_declared_its_own(workload):
    named = {s for s in workload.systems if s.startswith("cugraphrt")}
    assert named <= set(workload.own), sorted(named - set(workload.own))


def test_a_target_against_cugraphrt_itself_is_refused():
    with pytest.raises(ValueError, match="compares cugraphrt with itself"):
        Workload("w", "d", ("ours", "bound"), "bound", (Target("ours", "bound", 1.0),),
                 lambda ctx: None, own=("ours", "bound"))
    with pytest.raises(ValueError, match="does not have"):
        Workload("w", "d", ("ours",), "ours", (Target("ours", "theirs", 1.0),),
                 lambda ctx: None, own=("ours",))
