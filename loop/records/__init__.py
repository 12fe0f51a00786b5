"""What a run leaves behind: one record per iteration (results.py), perf_results.md (perf_table.py),
the commit trailers and the history rebuilt from git alone (history.py), git itself (gitops.py), the
report (report.py), and the experience that outlives runs (experience.py)."""
