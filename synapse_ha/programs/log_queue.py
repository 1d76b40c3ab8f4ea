"""Logging that never blocks the thread that logs: a record is put on a queue by the
thread that makes it (a gRPC handler's audit line, the Raft thread's warning) and written
to stderr by one listener thread, so a slow or full stderr (a busy journal) holds up no
call. A line is written within moments of its record; a process killed in between loses
the lines still queued (the writes they describe are in the Raft log and the history)."""

from __future__ import annotations

import logging
import logging.handlers
import queue
import sys
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def queued_logging(level: int = logging.INFO, stream: TextIO | None = None) -> logging.Handler:
    """Route every record of the root logger through a queue to ``stream`` (stderr);
    the listener runs until :func:`stop_queued_logging`. The queue handler is returned."""
    writer = logging.StreamHandler(sys.stderr if stream is None else stream)
    writer.setFormatter(logging.Formatter(FORMAT))
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    handler = logging.handlers.QueueHandler(records)
    listener = logging.handlers.QueueListener(records, writer, respect_handler_level=False)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    handler.listener = listener  # type: ignore[attr-defined]
    listener.start()
    return handler


def stop_queued_logging(handler: logging.Handler) -> None:
    """Write what is still queued, stop the listener and detach the handler."""
    listener = getattr(handler, "listener", None)
    if listener is not None:
        listener.stop()
    logging.getLogger().removeHandler(handler)
