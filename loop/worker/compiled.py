"""torch.compile of the spec's reference, the baseline that `report --measure` and `compare` time as
"torch.compile": compiled code at every shape and dtype it is called at, or a failure that says why,
never a silent eager run.

Dynamo compiles a function once per set of guards (with `dynamic=False`: once per shape and dtype)
and, past its recompile limit (8 per code object by default, shared by every torch.compile wrapper
of the same function), runs the function eagerly without a word. The judge calls the baseline at
every correctness and benchmark shape and dtype, more than eight pairs for many specs. So here:

- the recompile limits are raised to cover the spec's shape x dtype pairs with room to spare, and a
  hit of the limit raises (`fail_on_recompile_limit_hit`) instead of running eagerly;
- the backend is inductor behind a counter: every compiled graph counts its runs, and a call that
  ran no compiled graph (the limit, a frame dynamo skipped, anything else) is a failure of the
  baseline (`compile_error`, with the reason), which `report --measure` and `compare` turn into
  `unavailable: <why>` for torch.compile;
- what was compiled for each shape (graphs per call: more than one is a graph break, with dynamo's
  reasons) is kept where the judge asks for run-time picks after timing a shape (`_TUNED`, read by
  `loop.worker.bench.tuned_configs`), so the result says so beside the time;
- inductor compiles in this process (`compile_threads = 1`): its pool of compile workers would live on
  in the kernel process's tree and use CPU while the judge holds the process stopped between its
  requests, which the judge refuses as work outside its reach (on an H200 that made torch.compile
  `unavailable: uncorroborated` at every shape of a suite op).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

from loop.worker.failures import KernelFailure

LABEL = "torch_compile"
LIMIT_FLOOR = 64  # recompiles per code object at least (dynamo's default is 8)


def recompile_limit(pairs: int) -> int:
    """Recompiles allowed per code object for a spec with `pairs` shape x dtype pairs: every pair
    twice (strides or input placement may differ between the checks and the timing) plus room for
    the shapes the judge draws."""
    return max(LIMIT_FLOOR, 2 * pairs + 32)


def spec_pairs(spec) -> int:
    """Every shape x dtype pair the judge may call the reference at."""
    shapes = {tuple(s) for s in [*spec.correctness_shapes, *spec.benchmark_shapes, *spec.interpreter_shapes]}
    return len(shapes) * max(1, len(spec.dtypes))


class CompiledReference(SimpleNamespace):
    """`run(**inputs)`: the compiled function, proven to have run compiled code at every call.
    (A SimpleNamespace, as the other stand-ins that are not kernel modules: no backend proof, no
    launch recording.)"""

    def __init__(self, torch, fn: Callable[..., Any], pairs: int, backend: str | Callable = "inductor"):
        super().__init__()
        dynamo = torch._dynamo
        self.limit = recompile_limit(pairs)
        dynamo.config.recompile_limit = max(dynamo.config.recompile_limit, self.limit)
        dynamo.config.accumulated_recompile_limit = max(dynamo.config.accumulated_recompile_limit, 4 * self.limit)
        dynamo.config.fail_on_recompile_limit_hit = True
        if backend == "inductor":
            from torch._inductor import config as inductor_config

            inductor_config.compile_threads = 1  # no pool of compile workers beside the kernel process
        self.torch = torch
        self.graph_runs = 0  # calls of compiled graphs, all signatures together
        self.graphs_compiled = 0
        self.seen: dict[tuple, str] = {}  # shapes and dtypes of a call's tensors -> what ran there
        self._TUNED: dict[str, tuple[str]] = {}  # signature -> (what ran there,), for `tuned_configs`
        inner = dynamo.lookup_backend(backend) if isinstance(backend, str) else backend

        def counted(gm, example_inputs):
            self.graphs_compiled += 1
            compiled = inner(gm, example_inputs)

            def run(*args):
                self.graph_runs += 1
                return compiled(*args)

            return run

        self.compiled = torch.compile(fn, dynamic=False, backend=counted)

    def run(self, **inputs):
        key = tuple((k, tuple(v.shape), v.dtype) for k, v in inputs.items() if isinstance(v, self.torch.Tensor))
        first = key not in self.seen
        runs, compiled, breaks = self.graph_runs, self.graphs_compiled, self._breaks() if first else {}
        try:
            out = self.compiled(**inputs)
        except self.torch._dynamo.exc.FailOnRecompileLimitHit as exc:
            raise KernelFailure("compile_error", LABEL,
                              f"torch.compile hit dynamo's recompile limit "
                              f"({self.torch._dynamo.config.recompile_limit}) at {signature(self.torch, inputs)}: it "
                              f"would have run the reference eagerly ({exc})") from exc
        ran = self.graph_runs - runs
        if ran == 0:
            raise KernelFailure("compile_error", LABEL,
                              f"torch.compile ran no compiled graph at {signature(self.torch, inputs)}: dynamo ran the "
                              f"reference eagerly ({self._why_eager()})")
        if first:
            new = {r: n for r, n in self._breaks().items() if n > breaks.get(r, 0)}
            what = f"compiled: {ran} graph{'s' if ran > 1 else ''} per call"
            if ran > 1 or new:
                what += f" (graph breaks: {'; '.join(sorted(new)) or 'as compiled at an earlier shape'})"[:280]
            if self.graphs_compiled == compiled:
                what += ", graphs of an earlier signature"
            self.seen[key] = what
            self._TUNED[signature(self.torch, inputs)] = (what,)
        return out

    def _breaks(self) -> dict[str, int]:
        from torch._dynamo.utils import counters

        return {str(reason).strip().splitlines()[0][:160]: int(n) for reason, n in counters["graph_break"].items()
                if str(reason).strip()}

    def _why_eager(self) -> str:
        from torch._dynamo.utils import counters

        skipped = [str(r).strip().splitlines()[0][:160] for r in counters["unimplemented"] if str(r).strip()]
        return "; ".join(skipped[-3:]) or "no graph captured: the frame was skipped or disabled"


def signature(torch, inputs: dict) -> str:
    """The shapes and dtypes of a call's tensor inputs, as a record reads them."""
    parts = [f"{k}={tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" for k, v in inputs.items()
             if isinstance(v, torch.Tensor)]
    return ", ".join(parts) or "no tensor inputs"
