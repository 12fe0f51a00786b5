"""The judge: the trusted process of a measurement. It never imports the target.

The orchestrator starts `python -m loop.judge --job JOB.json --result RESULT.json` for every
measurement of an iteration (the baseline, each candidate against the incumbent, `report --measure`,
`compare`). The judge starts the kernel process (`python -m loop.worker --serve`), the only process
that imports the implementations, and talks to it over a pair of pipes. The judge makes every input
from the spec, keeps its own copies, computes every reference and compares every output on memory
it owns (`loop.common.arena`: CUDA IPC or a shared file, no copies through disk); the kernel
process only runs the implementations on that memory, writes their outputs into the judge's slots,
and reports timings, which the judge checks against its own clock (`corroborate`). What the
candidate replaces in its own process (the comparison, the reference, the tolerances, torch's
functions, the timer) cannot reach a verdict. The result file has the schema of a worker's.

Nothing here imports the orchestrator or the worker: only `loop.common`.
"""
