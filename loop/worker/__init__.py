"""The untrusted side: everything that imports or runs kernel code, in a worker subprocess.

The orchestrator starts `python -m loop.worker --job JOB.json --result RESULT.json` (see
`loop.measure.launch`) and reads back the one result file the worker writes; it never imports this
package. Nothing here imports the orchestrator: only `loop.common`.
"""
