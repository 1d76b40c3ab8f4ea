"""Health: GPU and node fitness, node checks, hang detection and pre-start checks."""
