"""Jobs tied to other jobs or to time: arrays, dependencies, windows, checkpoints."""
