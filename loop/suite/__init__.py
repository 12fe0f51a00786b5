"""Many targets tuned unattended (runner.py; worktrees.py finds where each run lives; engines.py is the
seam to what runs them: on this host, or on a Ray cluster in ray_engine.py) and summarised in one table
(summary.py)."""
