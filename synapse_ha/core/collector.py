"""The cyclic garbage collector paused around work that builds many objects that live on.

Decoding or encoding a whole state and a full scheduling pass each build hundreds of
thousands of containers. The collections their allocations trigger walk those young
objects again and again and find no garbage: a third of a large state's encoding, two
fifths of a cold pass at 10,000 nodes. Nothing computed depends on the collector; what
it would have found is collected after the pause, by the next collection.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the collector for the block; enable it again after only if it was enabled
    before (a pause inside a pause leaves it paused)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
