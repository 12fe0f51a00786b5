"""The run lifecycle: init (branch + baseline), the stages of one iteration (integrity, commit,
measure, decide, record, keep|revert), the unattended loop, resume, and the run's state.
`experiment.py` says which module owns which stage."""
