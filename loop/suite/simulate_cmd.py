"""`python -m loop.suite.simulate_cmd`: the simulation of `simulate` on its own, from a suite's
entries (as `suite summarize` reads them) or from a published results list."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from loop.common.errors import UserError
from loop.suite import simulate
from loop.suite.summary import load_entries


def main(argv: list[str] | None = None) -> int:
    """`python -m loop.suite.simulate_cmd PATH... [--driver-s S]`: the simulation's table of a suite's
    output folders or entry files (as `suite summarize` reads them) or of a published results list,
    with the driver's cost per task measured elsewhere (`--driver-s`, e.g. the median `driver_s` of a
    `--ray` suite's entries) where the runs did not go through Ray."""
    parser = argparse.ArgumentParser(prog="python -m loop.suite.simulate_cmd", description=main.__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="suite output folders, entry files, or a published results list (.json)")
    parser.add_argument("--driver-s", type=float, help="the driver's seconds per task (default: the entries' own, else 0)")
    parser.add_argument("--json", action="store_true", help="print the simulation as JSON")
    args = parser.parse_args(argv)
    try:
        lists = [json.loads(Path(p).read_text()) for p in args.paths if Path(p).is_file() and p.endswith(".json")]
        if lists and all(isinstance(d, list) for d in lists):
            sim = simulate.simulate_runs([run for d in lists for run in simulate.published_runs(d)], [], None,
                                         per_task_s=args.driver_s)
        else:
            sim = simulate.simulate(load_entries([Path(p) for p in args.paths]), per_task_s=args.driver_s)
    except (UserError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(sim, indent=1) if args.json else "\n".join(simulate.markdown(sim)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
