"""The messages of one iteration, typed once in the shared leaf: the in-flight marker that state.json
keeps, and the parts of a record (its change, decision, stop state and failure). Each is a frozen
dataclass whose `to_json` writes the very dict the run wrote before it was typed (a key left out where
it was left out) and whose `from_json` reads that dict back, from files of earlier runs too.

The orchestrator, the judge and the worker may all import this module: it imports nothing of tileloop.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Literal, get_args

# ------------------------------------------------------------------------------ the in-flight marker

# where an iteration is when state.json is written: the baseline starts (init) and is verified and
# measured; a candidate is swept, applied, committed, verified, measured, decided and recorded
Stage = Literal["start", "sweep", "apply", "commit", "verify", "measure", "decide", "record"]


@dataclass(frozen=True)
class Inflight:
    """The iteration in flight and its stage, so that `tileloop resume` after a kill at any point can
    finish or record it exactly once. The baseline's marker (iteration 0) names no candidate: its key,
    hypothesis and recipe are left out of the JSON; a candidate's marker always carries them (null
    where an agent's edit has none). `started` and `kind` are known from the commit stage (a sweep
    knows its kind), `commit` once the candidate is committed, `sweep` where a sweep chose the version."""

    iteration: int
    stage: Stage
    optimization: str = ""
    key: str | None = None
    hypothesis: str | None = None
    recipe: str | None = None
    started: str | None = None
    kind: str | None = None
    commit: str | None = None
    sweep: dict | None = None  # the record's sweep summary (`loop.run.sweep`)

    def at(self, stage: Stage, commit: str | None = None) -> "Inflight":
        """This marker at `stage` (with the candidate's commit, once it is made)."""
        return replace(self, stage=stage, commit=self.commit if commit is None else commit)

    def to_json(self) -> dict:
        d: dict = {"iteration": self.iteration, "stage": self.stage, "optimization": self.optimization}
        if self.iteration >= 1:
            d.update(key=self.key, hypothesis=self.hypothesis, recipe=self.recipe)
        d.update({k: v for k, v in (("started", self.started), ("kind", self.kind), ("commit", self.commit),
                                    ("sweep", self.sweep)) if v is not None})
        return dict(sorted(d.items()))  # state.json's order (it is written with sorted keys)

    @classmethod
    def from_json(cls, d: dict) -> "Inflight":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# ------------------------------------------------------------------------------------ the record's parts

# what differs between two versions of the target (`loop.target.change` finds them, `loop.decide.measurable`
# says which can show in a timing mode)
ChangeKind = Literal["formatting", "launch", "cache_hint", "autotune_configs", "persistent", "code"]
CHANGE_KINDS: tuple[str, ...] = get_args(ChangeKind)


@dataclass(frozen=True)
class Change:
    """The kinds of differences between two versions of the target and their details (the launch
    keywords or hints that differ, where a kind has any), e.g. kinds {"launch"}, details ("num_warps",);
    in a record, with whether it can show in the run's timing mode and why (`measurable`, `reason`:
    None and left out of the JSON before that is asked)."""

    kinds: frozenset[str]
    details: tuple[str, ...] = ()
    hint: str = ""  # what the recipe that made the candidate says it changes, where one did
    measurable: bool | None = None
    reason: str = ""

    def __post_init__(self):
        unknown = set(self.kinds) - set(CHANGE_KINDS)
        if unknown:
            raise ValueError(f"unknown change kind(s) {sorted(unknown)}; known: {', '.join(CHANGE_KINDS)}")

    def to_json(self) -> dict:
        d: dict = {"kinds": sorted(self.kinds, key=CHANGE_KINDS.index), "details": list(self.details), "hint": self.hint}
        if self.measurable is not None:
            d.update(measurable=self.measurable, reason=self.reason)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Change":
        return cls(frozenset(d.get("kinds", ())), tuple(d.get("details", ())), d.get("hint", ""), d.get("measurable"),
                   d.get("reason", ""))


Action = Literal["keep", "revert", "crash", "unmeasured", "remeasure"]
Verdict = Literal["baseline", "improved", "low_gain", "marginal", "within_noise", "regression", "incorrect",
                  "uncorroborated", "guard_failed", "unexercised", "suspicious", "compile_error", "runtime_error",
                  "timeout", "oom", "interrupted", "unmeasured", "void"]
Priority = Literal["normal", "low"]


@dataclass(frozen=True)
class Decision:
    """The keep / revert decision on one iteration (`loop.decide.rules`), as its record keeps it. The
    baseline's has no action (nothing was decided: the code as given) and is written as its verdict and
    reason only; `remeasured` is known to an iteration's decision (None and left out before it is)."""

    action: Action | None
    verdict: Verdict
    reason: str
    speedup: float | None = None
    lo: float | None = None
    hi: float | None = None
    priority: Priority = "normal"  # low: a kind kept at a low gain, tried last from now on
    stop_after: bool = False
    shapes: list[dict] = field(default_factory=list)  # the paired comparison of each shape (`ShapeComparison.to_json`)
    remeasured: bool | None = None

    def to_json(self) -> dict:
        if self.action is None:
            return {"verdict": self.verdict, "reason": self.reason}
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "remeasured"}
        d["shapes"] = [dict(s) for s in self.shapes]
        return d if self.remeasured is None else {**d, "remeasured": self.remeasured}

    @classmethod
    def from_json(cls, d: dict) -> "Decision":
        names = {f.name for f in fields(cls)}
        return cls(**{"action": None, **{k: v for k, v in d.items() if k in names}})


StopName = Literal["continue", "stop", "escalate"]
TimingMode = Literal["interpreter", "gpu", "harness"]  # how a run's iterations are timed


@dataclass(frozen=True)
class Stop:
    """Where the stop rules stand after an iteration: continue, stop (a rule fired) or escalate (a person
    is needed), why, and the timings the rules read (interpreter | gpu | harness; None and left out of
    the JSON in stop states written before it was kept)."""

    state: StopName
    reason: str
    timing: TimingMode | None = None

    def to_json(self) -> dict:
        d: dict = {"state": self.state, "reason": self.reason}
        return d if self.timing is None else {**d, "timing": self.timing}

    @classmethod
    def from_json(cls, d: dict) -> "Stop":
        return cls(d["state"], d["reason"], d.get("timing"))


@dataclass(frozen=True)
class Failure:
    """The target backend's failure: its typed status (compile_error, runtime_error, timeout, oom,
    incorrect, uncorroborated, fallback, interrupted, ...: an open set, a worker or harness may name its
    own) and what failed, in words."""

    status: str
    message: str

    def to_json(self) -> dict:
        return {"status": self.status, "message": self.message}

    @classmethod
    def from_json(cls, d: dict) -> "Failure":
        return cls(d["status"], d["message"])


# ------------------------------------------------------------------------ the judge's timing result
#
# What the judge writes under a result's `timing` (`loop.judge.run`, `loop.judge.bench`): per timed shape
# the method, each implementation's samples and their summary, the audits of what the timed calls wrote
# and the verdict of the judge's clock on the claims. An external harness's timing result
# (`loop.measure.external`) has the same layout with fewer keys (a shape's bench record, each side's
# samples only). Each part reads the dict as written and writes it back key for key, in the order read;
# keys it does not name are kept as they came (`extra`), so a newer judge's result reads too.


def _read(cls, d: dict, **convert):
    """An instance of the wire part `cls` from `d`: its named keys (converted where `convert` says how),
    the others kept in `extra`, the order of all of them in `keys`."""
    names = [f.name for f in fields(cls) if f.name not in ("extra", "keys")]
    missing = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING and f.name not in d]
    if missing:
        raise ValueError(f"a {cls.__name__} without {', '.join(missing)}: {str(d)[:200]}")
    given = {k: convert[k](v) if k in convert and v is not None else v for k, v in d.items() if k in names}
    return cls(**given, extra={k: v for k, v in d.items() if k not in names}, keys=tuple(d))


def _write(part, **convert) -> dict:
    """The dict `part` was read from (`_read`), or, for a part made here, its named keys that hold a value."""
    names = [f.name for f in fields(part) if f.name not in ("extra", "keys")]
    order = part.keys or tuple(n for n in names if getattr(part, n) is not None) + tuple(part.extra)
    out = {}
    for k in order:
        if k in part.extra:
            out[k] = part.extra[k]
        else:
            v = getattr(part, k)
            out[k] = convert[k](v) if k in convert and v is not None else v
    return out


@dataclass(frozen=True)
class ImplTiming:
    """One implementation's timing at one shape: its samples (ms, as taken) and their summary (median,
    interquartile range, mean, relative spread, extremes, count), GB/s and TFLOP/s at the median (None
    for a zero median), its timing process's peak memory (MB), the configs a run-time tuner picked and its
    fraction of the same-run copy bandwidth (where a clone was timed). An external harness's side has
    its samples only."""

    samples_ms: tuple[float, ...]
    median_ms: float | None = None
    iqr_ms: float | None = None
    mean_ms: float | None = None
    rel_std: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    nrep: int | None = None
    gbps: float | None = None
    tflops: float | None = None
    peak_mem_mb: float | None = None
    tuned: dict | list | None = None
    frac_clone_bw: float | None = None
    frac_matmul: float | None = None  # of the device's matmul rate, at a compute-bound shape
    extra: dict = field(default_factory=dict, compare=False, repr=False)
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def to_json(self) -> dict:
        return _write(self, samples_ms=list)

    @classmethod
    def from_json(cls, d: dict) -> "ImplTiming":
        return _read(cls, d, samples_ms=tuple)


@dataclass(frozen=True)
class Recheck:
    """The audits of one implementation's timed calls at one shape (`loop.judge.audit`): whether every
    output they wrote was right, how many were audited, and the first wrong one in words."""

    ok: bool
    audits: int | None = None
    reason: str | None = None
    extra: dict = field(default_factory=dict, compare=False, repr=False)
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def to_json(self) -> dict:
        return _write(self)

    @classmethod
    def from_json(cls, d: dict) -> "Recheck":
        return _read(cls, d)


@dataclass(frozen=True)
class Corroboration:
    """The judge's clock on one shape's claimed timings (`loop.judge.corroborate`): ok, or why not and
    the implementation refused (`label`); the method; per implementation the claimed and wall time of a
    request, the overhead and jitter of a round trip and what its audits saw (`labels`); with a pair, the
    claimed and the wall clock's speedup; `refused_before` where a first refusal was timed again."""

    ok: bool
    reason: str = ""
    method: str | None = None
    label: str | None = None
    labels: dict | None = None
    claimed_speedup: float | None = None
    wall_speedup: float | None = None
    refused_before: str | None = None
    extra: dict = field(default_factory=dict, compare=False, repr=False)
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def to_json(self) -> dict:
        return _write(self)

    @classmethod
    def from_json(cls, d: dict) -> "Corroboration":
        return _read(cls, d)


def _impls(d: dict) -> dict[str, ImplTiming]:
    return {label: ImplTiming.from_json(v) for label, v in d.items()}


def _rechecks(d: dict) -> dict[str, Recheck]:
    return {label: Recheck.from_json(v) for label, v in d.items()}


@dataclass(frozen=True)
class ShapeTiming:
    """One timed shape: the shape (an external harness's: its record's label, with the record), dtype,
    timing method (cuda_graph | cuda_events_l2_flush | interpreter_wallclock | harness) and calls per
    sample, the notes on how it was timed, each implementation's timing, the audits of what the timed
    calls wrote, the judge's clock's verdict, the spec's flops and bytes at the shape, the same-run
    copy bandwidth (`clone`, on a GPU) and, at a compute-bound shape, the device's matmul rate (`matmul`)."""

    shape: tuple
    impls: dict[str, ImplTiming]
    record: dict | None = None
    dtype: str | None = None
    method: str | None = None
    calls_per_sample: int | None = None
    notes: tuple[str, ...] | None = None
    recheck: dict[str, Recheck] | None = None
    corroboration: Corroboration | None = None
    flops: float | None = None
    bytes: float | None = None
    clone: dict | None = None
    matmul: dict | None = None  # the device's matmul rate at a compute-bound shape (`timing.device_matmul_rate`)
    extra: dict = field(default_factory=dict, compare=False, repr=False)
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def samples(self, label: str) -> tuple[float, ...]:
        """`label`'s samples at this shape (ms)."""
        if label not in self.impls:
            raise KeyError(f"no timing of {label} at {list(self.shape)}; timed: {', '.join(self.impls)}")
        return self.impls[label].samples_ms

    def to_json(self) -> dict:
        return _write(self, shape=list, notes=list, impls=lambda d: {k: v.to_json() for k, v in d.items()},
                      recheck=lambda d: {k: v.to_json() for k, v in d.items()},
                      corroboration=lambda c: c.to_json())

    @classmethod
    def from_json(cls, d: dict) -> "ShapeTiming":
        return _read(cls, d, shape=tuple, notes=tuple, impls=_impls, recheck=_rechecks,
                     corroboration=Corroboration.from_json)


@dataclass(frozen=True)
class Timing:
    """One judged measurement's timing result: the dtype and device it was timed in (a judge's) and each
    timed shape, in the order timed."""

    shapes: tuple[ShapeTiming, ...]
    dtype: str | None = None
    device: str | None = None
    extra: dict = field(default_factory=dict, compare=False, repr=False)
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def to_json(self) -> dict:
        return _write(self, shapes=lambda ss: [s.to_json() for s in ss])

    @classmethod
    def from_json(cls, d: dict) -> "Timing":
        return _read(cls, d, shapes=lambda ss: tuple(ShapeTiming.from_json(s) for s in ss))


# ------------------------------------------------------------------------------------ the judge's job
#
# What the orchestrator asks one judge for (`loop.measure.evaluate`, `compare`, the report's final
# measurement, decision-check), written as a job file and read by the judge (`loop.judge.entry`).


@dataclass(frozen=True)
class JobImpl:
    """One implementation the judge loads: its label (incumbent, candidate, baseline, sweep-<value>, ...)
    and the file that holds it."""

    label: str
    path: str

    def to_json(self) -> dict:
        return {"label": self.label, "path": self.path}

    @classmethod
    def from_json(cls, d: dict) -> "JobImpl":
        return cls(d["label"], d["path"])


def _job_impls(impls: list) -> tuple[JobImpl, ...]:
    return tuple(JobImpl.from_json(i) for i in impls)


@dataclass(frozen=True)
class JudgeJob:
    """One judged measurement as the orchestrator asks for it: the spec and the target's folder (and the
    target, which the spec must not import), the device and backend, the implementations, the labels
    whose correctness is checked, the seed, whether to time them (`bench`) and the timing plan's
    settings; optionally PyTorch's own baselines (`torch_providers`), the spec's references, whether the
    judge draws shapes of its own (`drawn`) or replays recorded draws (`draws`), the dtypes and
    correctness shapes (default: the spec's), the full benchmark shapes checked too, the benchmark dtype
    and shapes, the timing method asked for (graph | eager) and whether the copy bandwidth is timed
    beside (on a GPU). A job read from a file is written back key for key; one made here writes the keys
    every job has, then those it sets to other than their default."""

    spec: str
    target_dir: str
    device: str
    backend: str | None
    impls: tuple[JobImpl, ...]
    check: tuple[str, ...] = ()
    seed: int = 0
    target: str | None = None
    bench: bool = True
    timing: dict = field(default_factory=dict)  # the timing plan's settings (`loop.common.timing.TimingPlan`)
    torch_providers: tuple[str, ...] = ()
    references: bool = False
    drawn: bool = True
    draws: list | None = None
    dtypes: tuple[str, ...] | None = None
    correctness_shapes: tuple | None = None
    check_benchmark_shapes: bool = False
    bench_dtype: str | None = None
    bench_shapes: tuple | None = None
    method: str | None = None
    clone_bandwidth: bool = True
    extra: dict = field(default_factory=dict, compare=False, repr=False)
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)

    # written by `loop.measure.evaluate` whatever their value (the target may be None)
    WRITTEN = ("spec", "target_dir", "target", "device", "backend", "impls", "check", "seed", "bench", "timing")

    def labels(self) -> list[str]:
        """Every implementation's label, in the job's order."""
        return [i.label for i in self.impls]

    def to_json(self) -> dict:
        convert = dict(impls=lambda xs: [i.to_json() for i in xs], check=list, torch_providers=list, dtypes=list,
                       correctness_shapes=lambda ss: [list(s) for s in ss], bench_shapes=lambda ss: [list(s) for s in ss])
        if not self.keys:  # made here: the keys the orchestrator always writes, then those not at their default
            named = [f for f in fields(self) if f.name not in ("extra", "keys")]
            asked = [f.name for f in named if f.name not in self.WRITTEN
                     and getattr(self, f.name) != (f.default if f.default is not MISSING else f.default_factory())]
            return _write(replace(self, keys=self.WRITTEN + tuple(asked) + tuple(self.extra)), **convert)
        return _write(self, **convert)

    @classmethod
    def from_json(cls, d: dict) -> "JudgeJob":
        shapes = lambda ss: tuple(tuple(s) for s in ss)  # noqa: E731
        return _read(cls, d, impls=_job_impls, check=tuple, torch_providers=tuple, dtypes=tuple,
                     correctness_shapes=shapes, bench_shapes=shapes)
