"""Job history, GPU accounting and the event stream of one replica.

Derived from applied commands only (:mod:`.tracker`), so every replica holds the same
history (:mod:`.store`, SQLite in the data directory) and streams the same events with
the same indexes (:mod:`.events`). :mod:`.recorder` is the Raft apply observer that ties
them together; :mod:`.submissions` keeps the submitted commands whose bytes a finished
job's row stores as its spec. An adapter package: it reads the core's model, the core
never imports it.
"""
