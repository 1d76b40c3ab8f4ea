"""The scheduler's logging (programs/log_queue.py): records made on any thread are
queued and written by one listener, formatted, none lost by the time it stops."""

from __future__ import annotations

import io
import logging
import threading

from synapse_ha.programs.log_queue import queued_logging, stop_queued_logging


def test_records_of_every_thread_are_written_by_the_listener_and_none_is_lost() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    before = list(root.handlers), root.level
    handler = queued_logging(logging.INFO, stream)
    try:
        log = logging.getLogger("synapse_ha.audit")
        writers = []
        for t in range(4):
            thread = threading.Thread(
                target=lambda t=t: [log.info("call %d of thread %d", i, t) for i in range(50)]
            )
            writers.append(thread)
            thread.start()
        for thread in writers:
            thread.join()
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("a failure")
        logging.getLogger("quiet").debug("below the level: not written")
    finally:
        stop_queued_logging(handler)
        for old in before[0]:
            root.addHandler(old)
        root.setLevel(before[1])
    lines = stream.getvalue().splitlines()
    calls = [line for line in lines if " INFO synapse_ha.audit: call " in line]
    assert len(calls) == 200
    for t in range(4):
        mine = [line for line in calls if line.endswith(f"of thread {t}")]
        assert [int(line.split(" call ")[1].split()[0]) for line in mine] == list(range(50))
    assert any(" ERROR synapse_ha.audit: a failure" in line for line in lines)
    assert "ValueError: boom" in stream.getvalue()
    assert "below the level" not in stream.getvalue()
    assert handler not in root.handlers
