"""Gang placement: a pure function from a state snapshot to a plan.

``schedule(state, now_ms)`` never changes ``state``. It walks the queue (priority, then
submission order) and places each gang whole or not at all. The package is split along these seams:

* :mod:`.capacity`: the free-capacity table, its views and the cache kept between passes;
* :mod:`.placement`: placing one gang (topology, locality wait, best fit, NVLink);
* :mod:`.reservation`: the reservations of the first gangs in line, and backfill;
* :mod:`.explainer`: why a gang waits, ``why_pending`` and ``explain``;
* :mod:`.plan` and :mod:`.passes`: the plan and the pass that makes it;
* :mod:`.incremental`: a planner that visits only the gangs whose outcome can have changed.

The scheduler plans; it never imports the state machine (an import-linter contract).
"""

from synapse_ha.core.scheduler.capacity import CapacityCache
from synapse_ha.core.scheduler.explainer import explain, why_pending
from synapse_ha.core.scheduler.incremental import IncrementalPlanner
from synapse_ha.core.scheduler.passes import schedule
from synapse_ha.core.scheduler.plan import Plan, Preemption, Reservation

__all__ = [
    "CapacityCache",
    "IncrementalPlanner",
    "Plan",
    "Preemption",
    "Reservation",
    "explain",
    "schedule",
    "why_pending",
]
