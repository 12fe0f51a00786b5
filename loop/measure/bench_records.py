"""The records of an external bench command: what one number is (its identity and latency), parsed
from pytest's junitxml (`record_property`) or from lines printed one per record, and summarised per
record over the runs of one version; and the verdicts a command prints. The accepted format is
documented in docs/harness.md:

  latency (ms), required:  median_ms | latency_ms | ms, or timing statistics with `median` (ms);
                           a record without one may hold per-pass statistics as dict values,
                           {'forward': {'median': ...}, 'backward': {...}}: one record per pass,
                           and those per backend one level up, as TileGym's perf tests record
                           them: {'cutile': {'forward': {'median': ...}}}
  identity (matching):     name, op, backend, provider, shape, dtype, pass, property
  optional metrics:        gbps, tflops
  croq-tune's lines:       `TFLOPS: <v> time_ms: <v>` is a record (latency time_ms, tflops) without an
                           identity, numbered in order; a line that names either field in another form
                           is malformed (MalformedRecord). `VERIFY: PASS` / `VERIFY: FAIL ...` are
                           verdicts: any but PASS is a failed check (`failed_verdict`)
"""

from __future__ import annotations

import ast
import json
import math
import re
import statistics
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from loop.common.errors import HarnessFailure, UserError


class ExternalHarnessError(HarnessFailure, UserError):
    """The harness failed, not the candidate: the iteration stays in flight for `tileloop resume`."""


class MalformedRecord(ExternalHarnessError):
    """A printed line names a record's fields but is not one: the harness's failure on the incumbent
    (or the baseline), the candidate's (incorrect) when only the candidate prints it."""


LATENCY_KEYS = ("median_ms", "latency_ms", "ms")
STATS_LATENCY_KEY = "median"  # timing statistics in ms, as TileGym's benchmark records carry them
IDENTITY_KEYS = ("name", "op", "backend", "provider", "shape", "dtype", "pass", "property")
METRIC_KEYS = ("gbps", "tflops")
MAX_NESTING = 1  # {backend: {pass: stats}}: deeper dicts are not records
NON_FINITE = {"nan": math.nan, "inf": math.inf}  # repr() of a float statistic, e.g. a std of one sample
# croq-tune's iteration scripts: bench() prints `TFLOPS: <v> time_ms: <v>`, verify() `VERIFY: PASS` or
# `VERIFY: FAIL max_abs_err=<v>`. Text before them on the line (pytest's progress dots) is ignored.
CROQ_FIELDS = re.compile(r"\b(?:TFLOPS|time_ms):")
CROQ_LINE = re.compile(r"\bTFLOPS:[ \t]*(?P<tflops>\S+)[ \t]+time_ms:[ \t]*(?P<ms>\S+)\s*$")
CROQ_FORM = "TFLOPS: <v> time_ms: <v>"
VERDICT = re.compile(r"\bVERIFY:[ \t]*(?P<verdict>\S*)")


@dataclass(frozen=True)
class BenchRecord:
    """One number from the bench command: what was measured (identity) and its latency."""

    identity: tuple[tuple[str, object], ...]  # (key, value) in IDENTITY_KEYS order; sequences as tuples
    latency_ms: float
    gbps: float | None = None
    tflops: float | None = None
    occurrence: int = 1  # the n-th record of this identity within one run

    @property
    def key(self) -> str:
        return json.dumps([[list(kv) for kv in self.identity], self.occurrence])

    @property
    def label(self) -> str:
        """The identity for people: `k=v` pairs, a pytest test id without its package path
        (`Test_RMSNorm::test_perf[cutile-262144-4096]`)."""
        text = " ".join(f"{k}={_short_test_id(v) if k == 'name' else show(v)}" for k, v in self.identity) or "record"
        return text if self.occurrence == 1 else f"{text} #{self.occurrence}"

    def fields(self) -> dict:
        return {k: _jsonable(v) for k, v in self.identity}


def _jsonable(value):
    return [_jsonable(v) for v in value] if isinstance(value, tuple) else value


def _short_test_id(value) -> str:
    """`pkg.tests.test_op.TestOp::test_perf[...]` as `TestOp::test_perf[...]` (junitxml's classname is dotted)."""
    if not isinstance(value, str) or "::" not in value:
        return show(value)
    head, _, tail = value.partition("::")
    return value if "[" in head else f"{head.rsplit('.', 1)[-1]}::{tail}"


def show(value) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return str(value)


def _normal(value):
    if isinstance(value, (list, tuple)):
        return tuple(_normal(v) for v in value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _number(value, positive: bool) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        return None
    return value


def _latency(obj: dict) -> float | None:
    """The latency in ms of a record, None when it has none (or an unusable one)."""
    for key in LATENCY_KEYS:
        if key in obj:
            return _number(obj[key], positive=True)
    if STATS_LATENCY_KEY in obj:
        return _number(obj[STATS_LATENCY_KEY], positive=True)
    return None


def _identity(obj: dict) -> dict:
    return {k: _normal(obj[k]) for k in IDENTITY_KEYS if k in obj}


def _expand(obj: dict, context: dict, depth: int = 0) -> list[tuple[dict, dict, float]]:
    """(identity, the dict holding the latency, latency) for a record; for nested statistics one per
    pass (the key of the dict that holds them), and those keyed by backend one level up
    ({backend: {pass: stats}}, the `{framework: benchmark(...)}` of TileGym's perf tests)."""
    ident = {**context, **_identity(obj)}
    latency = _latency(obj)
    if latency is not None:
        return [(ident, obj, latency)]
    out = []
    for key, value in obj.items():
        if not isinstance(value, dict):
            continue
        if (latency := _latency(value)) is not None:
            out.append(({**ident, "pass": str(key)}, value, latency))
        elif depth < MAX_NESTING:
            out.extend(_expand(value, {**ident, "backend": str(key)}, depth + 1))
    return out


def _numbered(items: list[tuple[dict, dict, float]]) -> list[BenchRecord]:
    seen: dict[tuple, int] = {}
    out = []
    for ident, holder, latency in items:
        identity = tuple((k, ident[k]) for k in IDENTITY_KEYS if k in ident)
        seen[identity] = seen.get(identity, 0) + 1
        out.append(BenchRecord(identity, latency, _number(holder.get("gbps"), positive=False),
                               _number(holder.get("tflops"), positive=False), seen[identity]))
    return out


def _literal(text: str):
    """A JSON value or a Python literal (also with the bare `nan` and `inf` that repr() writes for
    such floats, as in a str() of a dict of statistics); never evaluated as code. None when it is
    neither."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        tree = ast.parse(text.strip(), mode="eval")
        for node in ast.walk(tree):
            for field, child in ast.iter_fields(node):
                if isinstance(child, ast.Name) and child.id in NON_FINITE:
                    setattr(node, field, ast.Constant(NON_FINITE[child.id]))
                elif isinstance(child, list):
                    child[:] = [ast.Constant(NON_FINITE[c.id]) if isinstance(c, ast.Name) and c.id in NON_FINITE
                                else c for c in child]
        return ast.literal_eval(tree.body)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _croq_record(line: str, number: int) -> tuple[dict, dict, float] | None:
    """The record of a croq-tune `TFLOPS: <v> time_ms: <v>` line, None for a line that names neither
    field; MalformedRecord for one that names them otherwise (a missing field, text where a number
    goes, a time that is not a positive finite number, a TFLOPS that is negative or not finite)."""
    if not CROQ_FIELDS.search(line):
        return None
    match = CROQ_LINE.search(line)
    tflops = ms = None
    if match:
        tflops, ms = (_number(_literal(match[k]), positive=p) for k, p in (("tflops", False), ("ms", True)))
    if tflops is None or ms is None:
        raise MalformedRecord(f"output line {number} is not `{CROQ_FORM}` with numbers (a positive time_ms): "
                              f"{line.strip()[:200]!r}",
                              hint="print f'TFLOPS: {tflops:.2f} time_ms: {ms:.4f}', with enough digits that the "
                                   "time is not 0; see docs/harness.md")
    return {}, {"tflops": tflops}, ms


def parse_printed(text: str) -> list[BenchRecord]:
    """Records printed one per line: a dict between the first `{` and the last `}` of the line
    (text around it, such as pytest's test id or progress dots, is ignored), or croq-tune's
    `TFLOPS: <v> time_ms: <v>`. Lines that are neither, or a dict without a usable latency, are
    skipped; a line that names croq-tune's fields in another form raises MalformedRecord."""
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        start, end = line.find("{"), line.rfind("}")
        if start < 0 or end <= start:
            if (croq := _croq_record(line, number)) is not None:
                items.append(croq)
            continue
        obj = _literal(line[start:end + 1])
        if isinstance(obj, dict):
            items.extend(_expand(obj, {}))
    return _numbered(items)


def failed_verdict(text: str) -> str | None:
    """The first `VERIFY: <verdict>` line whose verdict is not PASS (croq-tune's verify() prints
    `VERIFY: FAIL max_abs_err=<v>`), stripped; None when every verdict printed is PASS or none is."""
    for line in text.splitlines():
        match = VERDICT.search(line)
        if match and match["verdict"] != "PASS":
            return line.strip()[:200]
    return None


def parse_junitxml(path: Path) -> list[BenchRecord]:
    """Records from pytest's junitxml: the `record_property` entries of each <testcase>.

    The test id (`classname::name`) is the record's `name` unless a property gives one. The
    flat properties form one record when they carry a latency; every dict-valued property with
    a latency (or per-pass statistics) is a record too, with `property` set to its name."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise ExternalHarnessError(f"{path} is not a junitxml file: {exc}") from None
    items = []
    for case in root.iter("testcase"):
        context = {"name": "::".join(p for p in (case.get("classname"), case.get("name")) if p)}
        props: dict = {}
        for prop in case.iter("property"):
            if prop.get("name"):
                text = prop.get("value", "")
                value = _literal(text)
                props[prop.get("name")] = text if value is None else value
        flat = {k: v for k, v in props.items() if not isinstance(v, dict)}
        if _latency(flat) is not None:
            items.extend(_expand(flat, context))
        for name, value in props.items():
            if isinstance(value, dict):
                items.extend(_expand(value, {**context, **_identity(flat), "property": name}))
    return _numbered(items)


def summary(records: list[BenchRecord]) -> dict:
    lat = [r.latency_ms for r in records]
    out = {"median_ms": statistics.median(lat), "min_ms": min(lat), "max_ms": max(lat), "nrep": len(lat)}
    for metric in METRIC_KEYS:
        values = [getattr(r, metric) for r in records]
        if all(v is not None for v in values):
            out[metric] = statistics.median(values)
    return out


def difference(reference: list[BenchRecord], other: list[BenchRecord]) -> str:
    ref, oth = {r.key: r.label for r in reference}, {r.key: r.label for r in other}
    missing = [ref[k] for k in ref if k not in oth]
    extra = [oth[k] for k in oth if k not in ref]
    parts = ([f"missing: {'; '.join(missing[:4])}"] if missing else []) + ([f"extra: {'; '.join(extra[:4])}"] if extra else [])
    return ", ".join(parts)
