"""Leader-only control loops and read projections, over the core through small Protocols."""
