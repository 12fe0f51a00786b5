"""Many targets tuned unattended (runner.py; worktrees.py finds where each run lives) and summarised
in one table (summary.py)."""
