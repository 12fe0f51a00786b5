"""Checks on inputs the candidate cannot predict. The spec's correctness shapes and `make_inputs` are
known to whoever writes the candidate; a kernel can be right on every one of them and wrong
elsewhere (a loop that drops its mask at widths the spec never lists, a softmax that overflows on
large logits). So each measurement the judge also draws, from the system's random source:

- shapes (`DRAWS` per dtype): per dimension, within the spec's `DRAWN_SHAPES` or between the
  smallest and largest value its shapes use; one dimension per draw larger than any block size the
  implementations' sources name (the largest power of two from 16 up among their integer constants),
  sizes of 16 and more off multiples of 16 where the range and the budget leave room; the whole bounded by the largest shape checked (its
  element count and flops; on a GPU `GPU_GROWTH` times that, never beyond the benchmark shapes);
- transformed inputs: for each of the spec's `TRANSFORMS` (default x*10, x*100, x+90), the spec's
  floating inputs (never integer ones, never the output buffers) scaled or shifted at a shape chosen
  among the checked and drawn ones (under the interpreter those no larger than the median checked
  shape), compared where the reference (fp32 or better) is finite and
  within the output dtype's range, normwise (TRANSFORM_RTOL of the reference's peak, or the spec's
  tolerance grown with the outputs and inputs, whichever is looser); an output that is NaN or inf there fails.

Every implementation the job names is checked on the same draws (the incumbent first: an
incumbent that fails one is named, `failed_impl: incumbent`). A shape the spec's `make_inputs` or
reference cannot take is skipped with a note, charged to no one. The draws (seed, shape, dtype,
transform) are in the judge's result, so a failure can be replayed (the job's `draws`)."""

from __future__ import annotations

import ast
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from loop.common.harness import Harness, KernelCall
from loop.common.jobs import shape_text
from loop.common.messages import JudgeJob
from loop.common.outputs import as_outputs, check_inputs_unchanged, compare_outputs
from loop.common.spec import Spec, transforms_of
from loop.judge.bridge import Bridge
from loop.judge.checks import remote_call
from loop.judge.kernel_process import KernelProcess

DRAWS = 2  # drawn shapes per dtype
GPU_GROWTH = 64  # on a GPU, drawn shapes up to this many times the largest checked shape
BLOCKS = (16, 1 << 16)  # the powers of two in the sources read as block sizes
FOCUS_SPAN = 3  # under the interpreter, a dimension drawn above the block size stays within this many blocks
CPU_GROWTH = 8  # ... and within this many times the largest value the checked shapes give it


@dataclass(frozen=True)
class Draw:
    """One drawn check: make_inputs(shape, dtype, seed), then `transform` ("x*100") when there is one."""

    index: int
    shape: tuple
    dtype: str
    seed: int
    transform: str | None = None

    def text(self) -> str:
        return (f"drawn check {self.index} ({shape_text(self.shape)} {self.dtype}, seed {self.seed}, "
                f"{self.transform or 'no transform'})")


def block_size(paths: list[str]) -> int:
    """The largest power of two in BLOCKS among the integer constants of the sources (`1 << k` and
    `2 ** k` too); 0 when none. Read as text: the judge never imports an implementation."""
    most = 0
    for path in paths:
        try:
            tree = ast.parse(Path(path).read_text())
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            value = None
            if isinstance(node, ast.Constant) and type(node.value) is int:
                value = node.value
            elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.LShift, ast.Pow)) and all(
                    isinstance(n, ast.Constant) and type(n.value) is int for n in (node.left, node.right)):
                if 0 <= node.right.value <= 30:
                    value = node.left.value << node.right.value if isinstance(node.op, ast.LShift) else node.left.value ** node.right.value
            if value and BLOCKS[0] <= value <= BLOCKS[1] and value & (value - 1) == 0:
                most = max(most, value)
    return most


def dimensions(spec: Spec) -> tuple[list[tuple] | None, str]:
    """Per dimension ("range", lo, hi, step) or ("values", (v, ...)), from DRAWN_SHAPES or the spec's
    shapes (a derived range steps by the greatest common divisor of the values listed there);
    (None, why) when there is nothing to draw."""
    drawn = spec.drawn_shapes
    if drawn.off:
        return None, f"drawn shapes off in the spec: {drawn.off}"
    listed = spec.correctness_shapes + spec.benchmark_shapes + spec.interpreter_shapes
    rank = len(spec.correctness_shapes[0])
    if any(len(s) != rank for s in listed):
        return None, "the spec's shapes differ in rank: DRAWN_SHAPES = {\"dims\": [...]} says what to draw"
    out = []
    for i, dim in enumerate(drawn.dims or [None] * rank):
        values = sorted({s[i] for s in listed})
        if dim is None:  # derived: a dimension the spec only lists in powers of two from 16 is a set of sizes
            pow2 = all(v >= 16 and v & (v - 1) == 0 for v in values)
            dim = (("values", tuple(values)) if pow2 or len(values) == 1
                   else ("range", values[0], values[-1], max(math.gcd(*values), 1)))  # all even: drawn even
        elif dim[0] == "listed":
            dim = ("values", tuple(values))
        elif dim[0] == "value":
            dim = ("values", (dim[1],))
        elif dim[0] == "range":
            dim = (*dim, 1)
        out.append(dim)
    return out, ""


def size(shape) -> int:
    return math.prod(max(int(d), 1) for d in shape)


class Budget:
    """How large a drawn shape may be: its element count (the product of its dimensions) and its
    flops at most those of the largest shape checked, times GPU_GROWTH on a GPU (never beyond the
    largest benchmark shape). Under the interpreter a kernel's cost is mostly its programs and loop
    trips, not its elements: there each dimension also stays within the largest value the checked
    shapes use, the one drawn above the block size within FOCUS_SPAN blocks and CPU_GROWTH times
    that value (a dimension that cannot pass the block within them is not drawn above it)."""

    def __init__(self, spec: Spec, dtype: str, device: str, checked: list[tuple]):
        self.spec, self.dtype = spec, dtype
        grow = GPU_GROWTH if device == "cuda" else 1
        rank = len(checked[0])
        self.dims = None if device == "cuda" else [max(s[i] for s in checked if len(s) == rank) for i in range(rank)]
        self.elements = self._cap([size(s) for s in checked], [size(s) for s in spec.benchmark_shapes], grow)
        flops = [self.flops(s) for s in checked]
        self.most_flops = None if None in flops else self._cap(flops, [self.flops(s) for s in spec.benchmark_shapes], grow)

    @staticmethod
    def _cap(checked: list, bench: list, grow: int):
        most = max(checked)
        return most if grow == 1 else min(most * grow, max([most] + [b for b in bench if b is not None]))

    def high(self, i: int, hi: int, block: int, focus: bool) -> int:
        """The largest size dimension `i` may take, its range ending at `hi`."""
        if self.dims is None:
            return hi
        return min(hi, max(self.dims[i], min(FOCUS_SPAN * block, CPU_GROWTH * self.dims[i]) if focus else 0))

    def flops(self, shape) -> float | None:
        try:
            return self.spec.flops(shape, self.dtype)
        except Exception:  # noqa: BLE001 - the spec's flops at a shape it never listed: bound by elements alone
            return None

    def fits(self, shape) -> bool:
        if size(shape) > self.elements:
            return False
        flops = self.flops(shape) if self.most_flops is not None else None
        return flops is None or flops <= self.most_flops


def _pick(rng: random.Random, lo: int, hi: int) -> int:
    """A size in [lo, hi], log-uniform where the range is wide."""
    if hi - lo < 16:
        return rng.randint(lo, hi)
    return min(hi, max(lo, int(math.exp(rng.uniform(math.log(max(lo, 1)), math.log(hi + 1))))))


def draw_shape(dims: list[tuple], budget: Budget, block: int, focus: int | None, rng: random.Random) -> tuple | None:
    """One shape: dimension `focus` above `block` where its range allows, the others drawn, then the
    largest shrunk (the focus last) until the shape fits the budget; sizes from 16 up moved off
    multiples of 16 (a dimension whose listed values share a divisor keeps it). None when nothing in
    the ranges fits."""
    shape, floor, lows, step = [], {}, {}, {}
    for i, dim in enumerate(dims):
        if dim[0] == "values":
            shape.append(rng.choice(dim[1]))
            continue
        g = step[i] = dim[3]
        lows[i] = -(-dim[1] // g) * g
        hi = max(lows[i], budget.high(i, dim[2], block, i == focus) // g * g)
        floor[i] = max(lows[i], (block // g + 1) * g) if i == focus and block < hi else lows[i]
        shape.append(_pick(rng, floor[i] // g, hi // g) * g)
    for floors in (floor, lows):  # the focus kept above the block first
        while not budget.fits(shape):
            movable = [i for i in floor if shape[i] > floors[i] and i != focus] or [i for i in floor if shape[i] > floors[i]]
            if not movable:
                break
            i = max(movable, key=lambda j: shape[j] / max(floors[j], 1))
            shape[i] = max(floors[i], min(shape[i] - step[i], int(shape[i] * 0.8) // step[i] * step[i]))
        if budget.fits(shape):
            break
    for i, g in step.items():  # off multiples of 16 where the range and the budget leave room
        v = shape[i]
        if v >= 16 and v % 16 == 0 and g < 16:
            for w in (v - g, v + g):
                if lows[i] <= w <= dims[i][2] and budget.fits(shape[:i] + [w] + shape[i + 1:]):
                    shape[i] = w
                    break
    return tuple(shape) if budget.fits(shape) else None


def plan(spec: Spec, device: str, dtypes: list[str], checked: list[tuple], sources: list[str],
         rng: random.Random | None = None) -> tuple[list[Draw], dict]:
    """The draws of one measurement, and what bounded them (for the record)."""
    rng = rng or random.SystemRandom()
    dims, why = dimensions(spec)
    block = block_size(sources)
    transforms = spec.transforms
    draws: list[Draw] = []
    notes = [why] if why else []
    if transforms.off:
        notes.append(f"transforms off in the spec: {transforms.off}")
    budgets = {}
    for dtype in dtypes:
        budgets[dtype] = budget = Budget(spec, dtype, device, checked)
        focusable = [i for i, d in enumerate(dims or []) if d[0] == "range" and budget.high(i, d[2], block, True) > block]
        start = rng.randrange(len(focusable)) if focusable else 0
        if dims and block and not focusable:
            notes.append(f"{dtype}: no dimension can pass the block size {block} within the ranges and the budget")
        shapes = []
        for k in range(DRAWS if dims else 0):
            focus = focusable[(start + k) % len(focusable)] if focusable else None
            shape = draw_shape(dims, budget, block, focus, rng)
            if shape is None:
                notes.append(f"{dtype}: no shape within the ranges fits the budget of {budget.elements} elements")
                break
            if focus is not None and shape[focus] <= block:
                notes.append(f"{dtype}: {shape_text(shape)}: dimension {focus} could not pass the block size {block} "
                             "within the budget")
            shapes.append(shape)
            draws.append(Draw(len(draws), shape, dtype, rng.randrange(1 << 31)))
        among = list(checked) + shapes
        if device != "cuda":  # a transform tests magnitudes, not sizes: under the interpreter at the smaller shapes
            middle = sorted(size(s) for s in checked)[len(checked) // 2]
            among = [s for s in among if size(s) <= middle]
        for _, text, _ in transforms.ops:
            draws.append(Draw(len(draws), tuple(rng.choice(among)), dtype, rng.randrange(1 << 31), text))
    bounds = {"dims": [{"values": list(d[1])} if d[0] == "values" else {"range": [d[1], d[2]], "step": d[3]}
                       for d in dims or []], "block": block,
              "max_elements": {d: b.elements for d, b in budgets.items()},
              "max_flops": {d: b.most_flops for d, b in budgets.items()}}
    return draws, {"notes": notes, "bounds": bounds}


def replayed(raw: list[dict]) -> list[Draw]:
    """The draws a job names (a recorded failure replayed), in the record's form."""
    return [Draw(i, tuple(d["shape"]), d["dtype"], int(d["seed"]), d.get("transform")) for i, d in enumerate(raw)]


def transformed(torch, spec: Spec, inputs: dict, text: str) -> dict:
    """`inputs` with the spec's floating inputs (not the output buffers; only those TRANSFORMS names,
    when it names some) scaled or shifted as `text` says, computed in fp32 or better."""
    ((kind, _, amount),) = transforms_of([text]).ops  # from its text: a replayed draw need not be in TRANSFORMS
    names = spec.transforms.inputs
    out = dict(inputs)
    for name, value in inputs.items():
        if (isinstance(value, torch.Tensor) and value.is_floating_point() and name not in spec.outputs
                and (names is None or name in names)):
            wide = value.to(torch.float64 if value.dtype == torch.float64 else torch.float32)
            out[name] = (wide * amount if kind == "scale" else wide + amount).to(value.dtype)
    return out


# A transformed draw asks whether a kernel stays finite and close where its reference does (a softmax
# without its maximum overflows at x+90), not whether it keeps the spec's precision at magnitudes the
# spec never uses: an honest one-pass fp32 variance of x+90 is off by ~(90/sigma)^2 * 6e-8 relative.
# The draws of new shapes, untransformed, keep the spec's own tolerances.
TRANSFORM_RTOL = 1e-2


def _floating_inputs(torch, inputs: dict, outputs) -> list:
    """The floating inputs (never an output buffer), as `as_outputs` lists outputs: (name, tensor)."""
    return [(k, v) for k, v in inputs.items() if k not in outputs and isinstance(v, torch.Tensor) and v.is_floating_point()]


def _peak(torch, refs: list) -> float:
    peaks = [float(r.detach().abs()[torch.isfinite(r)].max()) for _, r in refs
             if isinstance(r, torch.Tensor) and r.is_floating_point() and bool(torch.isfinite(r).any())]
    return max(peaks, default=0.0)


def compare_where_finite(torch, got: list, refs: list, atol: float, rtol: float, dtype) -> dict:
    """The comparison restricted to the elements whose reference is finite and within the range of the
    output dtype `dtype` (an overflow the output dtype cannot hold is no kernel's fault; the judge reads
    outputs in a wide type, so the dtype is the spec's); NaN or inf in the output there is a mismatch.
    `compared` says how many elements that left."""
    if len(got) == len(refs) and all(n and not n.startswith("output ") for n, _ in refs) and {n for n, _ in got} == {n for n, _ in refs}:
        lookup = dict(got)
        got = [(n, lookup[n]) for n, _ in refs]
    kept_got, kept_ref, compared = [], [], 0
    for (name, out), (ref_name, ref) in zip(got, refs):
        if (isinstance(out, torch.Tensor) and isinstance(ref, torch.Tensor) and out.is_floating_point()
                and tuple(out.shape) == tuple(ref.shape)):
            keep = torch.isfinite(ref) & (ref.abs() <= torch.finfo(dtype).max)
            out, ref = out[keep.to(out.device)], ref[keep]
        compared += int(ref.numel()) if isinstance(ref, torch.Tensor) else 1
        kept_got.append((name, out))
        kept_ref.append((ref_name, ref))
    if len(got) != len(refs):
        kept_got = got
    return {**compare_outputs(torch, kept_got, kept_ref, atol, rtol), "compared": compared}


def check_drawn(harness: Harness, calls: dict[str, KernelCall], draws: list[Draw]) -> tuple[list[dict], dict | None]:
    """Every implementation (label -> its call, in order) on every draw, on the same inputs. Returns
    (one entry per draw, the first failure as {label, reason} or None)."""
    torch, spec = harness.torch, harness.spec
    entries = []
    for draw in draws:
        entry = {**asdict(draw), "shape": list(draw.shape), "labels": {}}
        entries.append(entry)
        try:
            inputs = harness.make_inputs(draw.shape, draw.dtype, draw.seed)
            atol, rtol = harness.tolerance(draw.dtype)
            if draw.transform:
                plain = _peak(torch, as_outputs(harness.reference(inputs)))
                plain_in = _peak(torch, _floating_inputs(torch, inputs, harness.outputs))
                inputs = transformed(torch, spec, inputs, draw.transform)
            refs = as_outputs(harness.reference(inputs))
        except Exception as exc:  # noqa: BLE001 - the spec's make_inputs or reference cannot take this draw
            entry["skipped"] = f"the spec cannot make this draw: {type(exc).__name__}: {str(exc)[:200]}"
            continue
        if draw.transform:
            # the absolute tolerance grows with the outputs (a sum of x*100 is 100 times larger) and with the
            # inputs: an honest fp32 computation loses precision in proportion to its inputs' magnitude (a
            # one-pass variance of x+90 cancels ~90^2 against ~90^2: on an H100 the suite's Triton layernorm was
            # off by ~1e-3 at x+90, beyond fp32's atol); a NaN or inf where the reference is finite fails anyway
            grown = _peak(torch, _floating_inputs(torch, inputs, harness.outputs))
            atol *= max(1.0, _peak(torch, refs) / plain if plain > 0 else 1.0, grown / plain_in if plain_in > 0 else 1.0)
            # normwise: within TRANSFORM_RTOL of the largest output (cancellation costs an honest kernel relative
            # precision as the square of the shift, in its intermediates as much as in its outputs)
            atol, rtol = max(atol, TRANSFORM_RTOL * _peak(torch, refs)), max(rtol, TRANSFORM_RTOL)
        entry.update(atol=atol, rtol=rtol)
        buffers = [v for k, v in inputs.items() if k in harness.outputs and isinstance(v, torch.Tensor) and v.is_floating_point()]
        out_dtype = buffers[0].dtype if buffers else spec.torch_dtype(draw.dtype)  # what the outputs are stored in
        for label in calls:
            mine = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
            snapshot = {k: v.clone() for k, v in mine.items() if isinstance(v, torch.Tensor) and k not in harness.outputs}
            harness.prepare_call(mine)
            got = calls[label](mine, refs)
            rec = (compare_where_finite(torch, got, refs, atol, rtol, out_dtype) if draw.transform
                   else compare_outputs(torch, got, refs, atol, rtol))
            if rec["ok"] and (msg := check_inputs_unchanged(torch, mine, snapshot)):
                rec.update(ok=False, reason=msg)
            entry["labels"][label] = {k: rec[k] for k in ("ok", "reason", "max_abs_err", "mismatched", "compared") if k in rec}
            if rec.get("compared") == 0:  # a transform that took every output past its dtype: nothing was compared
                entry["labels"][label]["max_abs_err"] = None
            if not rec["ok"]:
                return entries, {"label": label, "reason": f"wrong on {draw.text()}: {rec.get('reason')} (a check on "
                                 "inputs the judge drew; a spec bounds them with DRAWN_SHAPES and TRANSFORMS)"}
    return entries, None


def judge_draws(harness: Harness, bridge: Bridge, kernels: dict[str, KernelProcess], job: JudgeJob, dtypes: list[str],
                checked: list[tuple]) -> tuple[dict, dict | None]:
    """The drawn checks of a measurement: every implementation of the job (the incumbent first) on
    draws of its own (or the job's `draws`, replayed). Returns (the record, the first failure)."""
    impls = [label for label in job.labels() if label in kernels]
    labels = sorted(impls, key=lambda label: label != "incumbent")
    if job.draws is not None:
        draws, record = replayed(job.draws), {"notes": ["replayed"], "bounds": {}}
    else:
        draws, record = plan(harness.spec, job.device, dtypes, checked, [i.path for i in job.impls])
    def call(label: str) -> KernelCall:
        remote = remote_call(bridge, kernels[label], label)

        def labelled(inputs: dict, refs: list) -> list:
            bridge.label = label
            return remote(inputs, refs)
        return labelled

    entries, failed = check_drawn(harness, {label: call(label) for label in labels}, draws)
    return {**record, "labels": labels, "draws": entries}, failed
