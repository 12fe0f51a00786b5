"""Nsight Compute (`ncu`) as a tool: the metric set, the command line, its CSV and its errors.

Pure functions over text and argument lists; running ncu is `loop.tools.profile`'s business.

The command profiles the worker (`python -m loop.worker --job ...` in profile mode) with
`--profile-from-start off`: the worker checks the kernel once (which also compiles and
autotunes it) and then calls it inside a cudaProfilerStart/Stop range, so warm-up and autotune
launches are never profiled. `-k regex:^(<kernel>|...)` keeps the target's own kernels only
(a torch op inside the launch wrapper is not profiled) and `--launch-count` caps the number of
profiled launches. The output is `--page raw --csv --print-units base`, written with
`--log-file`, so that the worker's own output never mixes with the table:

    "ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC",<metric>,...
    "","","","","","","","","","","",<unit>,...
    "0","4242","python3","host","softmax_kernel","1","7","(128, 1, 1)","(4096, 1, 1)","0","9.0","85.10","12,345",...

one row per profiled launch; numbers may carry thousands separators; a metric the device cannot
collect reads `n/a`.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field

# The metric set: small (a few replay passes per launch), and each one is read by the
# classification in `loop.tools.profile` or explains its verdict. Names valid from Volta to Hopper;
# the tensor-pipe metric is the generic one (HMMA and Hopper's GMMA alike).
METRICS: dict[str, str] = {
    "gpu__time_duration.sum": "duration",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "compute_pct",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory_pct",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active": "tensor_pipe_pct",
    "launch__registers_per_thread": "registers_per_thread",
    "launch__occupancy_limit_registers": "block_limit_registers",
    "launch__occupancy_limit_shared_mem": "block_limit_shared_mem",
    "launch__occupancy_limit_warps": "block_limit_warps",
    "launch__occupancy_limit_blocks": "block_limit_blocks",
    "launch__grid_size": "grid_size",
    "launch__block_size": "block_size",
    "launch__waves_per_multiprocessor": "waves_per_sm",
    "device__attribute_multiprocessor_count": "sm_count",
}

# Identity columns of the raw page, before the metric columns.
ID_COLUMNS = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
              "Block Size", "Grid Size", "Device", "CC")

_TIME_UNITS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}

PERMISSION_CODE = "ERR_NVGPUCTRPERM"


def kernel_regex(names: list[str]) -> str:
    """`-k` filter for the target's kernels. Anchored at the start only: cuTile symbols are the
    function name plus a mangled signature (`softmax_kernel_K1_...`); Triton's are the name."""
    if not names:
        raise ValueError("no kernel names to profile")
    for name in names:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"kernel name {name!r} is not an identifier")
    return f"regex:^({'|'.join(names)})"


def command(ncu: str, *, kernels: list[str], launch_count: int, log_file: str,
            metrics: tuple[str, ...] = tuple(METRICS)) -> list[str]:
    """The ncu part of the command line; the worker's command follows it."""
    if launch_count < 1:
        raise ValueError(f"launch_count must be at least 1, got {launch_count}")
    return [ncu, "--target-processes", "all", "--profile-from-start", "off",
            "--kernel-name-base", "function", "-k", kernel_regex(kernels), "--launch-count", str(launch_count),
            "--cache-control", "all", "--clock-control", "base",
            "--metrics", ",".join(metrics), "--csv", "--page", "raw", "--print-units", "base",
            "--log-file", log_file]


def number(text: str) -> float | None:
    """`"12,345.5"` -> 12345.5; `n/a`, empty or anything else that is not a number -> None."""
    cleaned = text.strip().replace(",", "")
    if not cleaned:
        return None
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if value == value else None  # NaN is no reading


@dataclass(frozen=True)
class Launch:
    """One profiled kernel launch: the raw page's row."""

    id: int
    kernel: str
    block: str
    grid: str
    device: str
    cc: str
    values: dict[str, float | None] = field(default_factory=dict)  # metric name -> value in `units`
    units: dict[str, str] = field(default_factory=dict)  # metric name -> unit as printed

    def value(self, metric: str) -> float | None:
        """The metric's value, durations in nanoseconds whatever unit ncu printed."""
        v = self.values.get(metric)
        unit = self.units.get(metric, "")
        if v is not None and unit in _TIME_UNITS:
            return v * _TIME_UNITS[unit]
        return v


class CsvError(ValueError):
    """The text holds no raw-page table ncu could have written."""


def parse_raw_csv(text: str) -> list[Launch]:
    """Launches from `ncu --csv --page raw` output; progress and `==PROF==` lines are skipped.

    An output with no table at all (ncu stopped before profiling anything) raises CsvError;
    a table without rows returns [].
    """
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("==")]
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith('"ID"')), None)
    if start is None:
        raise CsvError("no CSV table in ncu's output (no line starts with \"ID\")")
    rows = list(csv.reader(lines[start:]))
    header = rows[0]
    missing = [c for c in ("ID", "Kernel Name") if c not in header]
    if missing:
        raise CsvError(f"ncu's CSV header lacks {', '.join(missing)}: {header[:12]}")
    col = {name: i for i, name in enumerate(header)}
    metric_cols = [name for name in header if name not in ID_COLUMNS]
    body = rows[1:]
    units: dict[str, str] = {}
    if body and not body[0][col["ID"]].strip():  # the units row: blank identity columns
        units = {name: body[0][col[name]].strip() for name in metric_cols if col[name] < len(body[0])}
        body = body[1:]
    launches = []
    for row in body:
        if len(row) < len(header):  # a trailing empty field is tolerated, a missing one is not
            raise CsvError(f"ncu CSV row has {len(row)} fields, the header {len(header)}: {row[:6]}")

        def cell(name: str) -> str:
            return row[col[name]].strip() if name in col else ""

        ident = number(cell("ID"))
        if ident is None:
            raise CsvError(f"ncu CSV row without a launch ID: {row[:6]}")
        launches.append(Launch(int(ident), cell("Kernel Name"), cell("Block Size"), cell("Grid Size"), cell("Device"),
                               cell("CC"), {m: number(row[col[m]]) for m in metric_cols},
                               {m: units.get(m, "") for m in metric_cols}))
    return launches


@dataclass(frozen=True)
class Issue:
    """What ncu itself reported as going wrong, typed for the exit code."""

    status: str  # ncu_permission | no_kernel | ncu_error
    message: str
    hint: str
    lines: tuple[str, ...] = ()  # ncu's own lines that say so
    available: tuple[str, ...] = ()  # kernels ncu saw, when it lists them


def diagnose(text: str) -> Issue | None:
    """ncu's error and warning lines -> the one issue that explains the run, or None."""
    lines = [ln.strip() for ln in text.splitlines()]
    errors = [ln for ln in lines if ln.startswith("==ERROR==")]
    perm = [ln for ln in lines if PERMISSION_CODE in ln]
    if perm:
        return Issue("ncu_permission", "ncu may not read the GPU performance counters (ERR_NVGPUCTRPERM)",
                     "run as root, or set the nvidia module option NVreg_RestrictProfilingToAdminUsers=0 and reload "
                     "the driver; see https://developer.nvidia.com/ERR_NVGPUCTRPERM", tuple(perm[:3]))
    unknown = [ln for ln in errors if "metric" in ln.lower() and ("find" in ln.lower() or "invalid" in ln.lower())]
    if unknown:
        return Issue("ncu_error", "ncu does not know a requested metric on this device or version: " + unknown[0],
                     "`ncu --query-metrics` lists this device's metrics; report the name", tuple(unknown[:5]))
    if any("No kernels were profiled" in ln for ln in lines):
        return Issue("no_kernel", "ncu profiled no kernel", "", tuple(ln for ln in lines if "No kernels" in ln)[:1],
                     tuple(_available_kernels(lines)))
    if errors:
        return Issue("ncu_error", "ncu reported an error: " + errors[0], "see ncu_output_tail", tuple(errors[:5]))
    return None


def _available_kernels(lines: list[str]) -> list[str]:
    """ncu lists the kernels it saw after 'Available Kernels:' when a filter matched none."""
    out, listing = [], False
    for ln in lines:
        if ln.startswith("Available Kernels"):
            listing = True
            continue
        if listing:
            m = re.match(r"\d+\.\s+(.*)", ln)
            if not m:
                break
            out.append(m.group(1))
    return out
