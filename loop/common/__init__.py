"""The shared leaf: what both sides of the trust boundary (the orchestrator and the worker
subprocess) and the playbook use. It imports nothing else of tileloop.

errors     user errors (one line, a hint, exit 2) and tileloop's own failures in a worker
settings   the one reader of the variables a user sets to change tileloop (TILELOOP_*)
files      atomic writes
stats      summary and paired statistics of timing samples
jobs       the worker job/result file protocol: schema, seeds, shared constants
language   which language a kernel file is written in (from its imports)
arena      memory the judge owns and the kernel process writes (a CUDA IPC block or a shared file)
ipc        a kernel process's CUDA tensor named to the judge by IPC handle, as checked JSON
"""
