"""The verify and measure stages, on the orchestrator's side of the trust boundary: a worker started
per backend (launch.py: own process group, hard timeout, own caches, result read from its file),
its result turned into typed measurements (evaluate.py), the ahead-of-time compile gate, the
environment probe, and the external harness (a repository's own test and bench commands)."""
