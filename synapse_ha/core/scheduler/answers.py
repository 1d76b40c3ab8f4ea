"""What a pass already worked out per gang shape (:class:`Answers`)."""

from __future__ import annotations

from collections.abc import Callable

from synapse_ha.core.model import ClusterState, JobSpec
from synapse_ha.core.scheduler.capacity import View
from synapse_ha.core.scheduler.placement import (
    Gang,
    fits,
    locality_depths,
    place,
    search_depths,
)
from synapse_ha.core.scheduler.plan import Reservation
from synapse_ha.core.scheduler.reservation import Running, reserve


class Answers:
    """What this pass already worked out for a gang shape on a version of a view.

    Whether a gang fits, where ``place`` finds no room and where the reservation search
    finds no start depend only on the gang's shape (per-member request, member count,
    whether it needs image support), the depths searched and the free capacity the view
    shows, which the view and the table's version name exactly (``Table.version``). A
    long queue of alike gangs, the common case under a stream of submissions, therefore
    costs one search per shape and capacity change instead of one per gang. Only answers
    that leave the table as it was are kept (no room, fits or not, no reservation): a
    placement changes the version. ``enabled=False`` keeps nothing.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.no_room: set[tuple[object, ...]] = set()
        self.fit: dict[tuple[object, ...], bool] = {}
        self.no_start: set[tuple[object, ...]] = set()
        self.searched: dict[tuple[str, str], tuple[list[int], list[int] | None]] = {}

    @staticmethod
    def _key(gang: Gang, view: View, depths: list[int]) -> tuple[object, ...]:
        # Plain ints, not the Resources value: they hash and compare without Python code.
        req = gang.req
        return (
            req.gpu,
            req.cpu_milli,
            req.memory_mib,
            gang.n,
            bool(gang.spec.image),
            gang.avoid,
            gang.must,
            gang.room,
            tuple(depths),
            view,
            view.version,
        )

    def depths(
        self, state: ClusterState, spec: JobSpec, levels: int
    ) -> tuple[list[int], list[int] | None]:
        """The depths a gang searches and those it searches while it waits for locality
        (:func:`search_depths`, :func:`locality_depths`), per topology request. The lists
        are shared: callers do not change them."""
        key = (spec.topology_required, spec.topology_preferred)
        hit = self.searched.get(key) if self.enabled else None
        if hit is None:
            depths = search_depths(state, spec, levels)
            hit = (depths, locality_depths(state, spec, depths))
            if self.enabled:
                self.searched[key] = hit
        return hit

    def place(self, gang: Gang, view: View, depths: list[int]) -> list[tuple[str, int]] | None:
        if not self.enabled:
            return place(gang, view, depths)
        key = self._key(gang, view, depths)
        if key in self.no_room:
            return None
        hosts = place(gang, view, depths)
        if hosts is None:
            self.no_room.add(key)
        return hosts

    def fits(self, gang: Gang, view: View, depths: list[int]) -> bool:
        if not self.enabled:
            return fits(gang, view, depths)
        key = self._key(gang, view, depths)
        hit = self.fit.get(key)
        if hit is None:
            hit = self.fit[key] = fits(gang, view, depths)
        return hit

    def reserve(
        self,
        gang: Gang,
        view: View,
        depths: list[int],
        running: dict[str, Running],
        empty_view: Callable[[], View],
    ) -> Reservation | None:
        """:func:`reserve`; a shape that found no start finds none again until the
        capacity changes (which is also when the running gangs change: a placement)."""
        if not self.enabled:
            return reserve(gang, view, depths, running, empty_view)
        key = self._key(gang, view, depths)
        if key in self.no_start:
            return None
        made = reserve(gang, view, depths, running, empty_view)
        if made is None:
            self.no_start.add(key)  # the search undid its changes: the same version
        return made
