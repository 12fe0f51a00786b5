"""tileloop: tune one GPU kernel by disciplined experiment.

The package, by role (docs/architecture.md draws the data flow):

    worker/    UNTRUSTED: the subprocess that imports and runs kernel code (python -m loop.worker);
               the rest of tileloop never imports it and reads only the result file it writes
    common/    the shared leaf both sides and the playbook use: errors, settings, files, statistics,
               the worker job protocol, language detection
    backends/  ptx, tileir, cutile, interpreter: each backend's environment and availability
    target/    the kernel contract: a target and its spec, found and checked without importing them
    measure/   launching workers (launch.py) and turning their results into typed measurements, the
               compile gate, the environment probe, the external harness (a repository's own commands)
    decide/    pure keep/revert/stop rules and their statistics; decision-check's verdicts
    records/   results.jsonl, perf_results.md, commit trailers and history, git, report, experience
    run/       the run lifecycle: init, baseline, one iteration's stages, the unattended loop, resume
    tools/     doctor, compile, compare, profile (ncu), decision-check, the final measurement
    suite/     many runs: suite run and summarize
    cli/       the command line, one module per command group; main(argv)
"""

__version__ = "0.1.0"
