"""The kernel contract, checked statically (the orchestrator never imports kernel code).

A tunable kernel is one *target* file (the only file an iteration may change) plus a read-only
`spec.py` beside it. This module finds both, parses them with `ast`, and refuses anything that
cannot work before a branch is made or a GPU second is spent.

Target (`<op>_triton.py` or `<op>_cutile.py`): `@triton.jit` / `@ct.kernel` function(s) and a
launch wrapper `run(**inputs) -> output`.

Spec (`spec.py`), required names:
  make_inputs(shape, dtype, seed, device) -> dict   fresh random data (never zeros)
  reference(**inputs) -> tensor                     PyTorch; the harness feeds it fp32/fp64 copies
  CORRECTNESS_SHAPES, BENCHMARK_SHAPES              lists of shapes (include odd sizes)
  DTYPES                                            e.g. ["float16", "float32"]
  TOLERANCES                                        {dtype: (atol, rtol)}
  flops(shape), bytes_moved(shape, dtype)           for TFLOP/s, GB/s and roofline fractions
Optional: OUTPUTS (names of output buffers in the inputs dict, default ("out",)),
  INTERPRETER_SHAPES (small shapes timed under --device cpu).
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from pathlib import Path

from loop.common import cuda_c, kernel_source
from loop.common.errors import UserError
from loop.common.language import Language, detect_language, language_of_file

SPEC_REQUIRED = (
    "make_inputs",
    "reference",
    "CORRECTNESS_SHAPES",
    "BENCHMARK_SHAPES",
    "DTYPES",
    "TOLERANCES",
    "flops",
    "bytes_moved",
)
KNOWN_DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class Kernel:
    """A validated target + spec pair, with paths relative to the repository root."""

    repo_root: Path
    target: Path  # relative to repo_root
    spec: Path  # relative to repo_root
    language: Language
    op: str

    @property
    def target_abs(self) -> Path:
        return self.repo_root / self.target

    @property
    def spec_abs(self) -> Path:
        return self.repo_root / self.spec


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _parse(path: Path, what: str) -> ast.Module:
    try:
        return ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as exc:
        raise UserError(f"{what} {path} does not parse: line {exc.lineno}: {exc.msg}") from None
    except UnicodeDecodeError:
        raise UserError(f"{what} {path} is not UTF-8 text") from None


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for tgt in node.targets:
                if isinstance(tgt, ast.Name):
                    names.add(tgt.id)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add((alias.asname or alias.name).split(".")[0])
    return names


def spec_dtypes(spec_path: Path) -> list[str] | None:
    """The spec's DTYPES when it is a literal list of known dtypes (or one alone), as names or `torch.<name>` (read
    from the source, the spec is not imported here); None otherwise (a computed DTYPES is read by
    the worker)."""
    try:
        tree = ast.parse(Path(spec_path).read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "DTYPES" for t in node.targets):
            elts = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            if not elts:
                return None
            names = [_dtype_literal(e) for e in elts]
            return names if all(n in KNOWN_DTYPES for n in names) else None
    return None


def _dtype_literal(node: ast.expr) -> str | None:
    """'float16' for "float16", "torch.float16" or torch.float16 in the source."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.removeprefix("torch.")
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
        return node.attr
    return None


def spec_entry(spec_tree: ast.Module) -> str | None:
    """The entry point the spec names: None for the spec's own `entry(target, **inputs)` adapter,
    else its ENTRY string (default "run"); read by `loop.common.kernel_source.spec_entry`."""
    entry = kernel_source.spec_entry(spec_tree)
    return None if entry.adapter else entry.names[0]


def resolve_target(target: str | Path, repo_root: Path) -> tuple[Path, Path]:
    """(absolute path, path relative to the repository root) of a target Python file in the
    repository; raise UserError with a one-line reason otherwise."""
    repo_root = repo_root.resolve()
    path = Path(target)
    path = (path if path.is_absolute() else Path.cwd() / path).resolve()
    if not path.exists():
        raise UserError(f"target {target} does not exist")
    if not path.is_file() or path.suffix not in (".py", cuda_c.SUFFIX):
        raise UserError(f"target {target} is not a Python file")
    try:
        return path, path.relative_to(repo_root)
    except ValueError:
        raise UserError(f"target {target} is outside the repository {repo_root}") from None


def load_kernel(target: str | Path, repo_root: Path, names: bool = True) -> Kernel:
    """Validate the target and its spec; raise UserError with a one-line reason otherwise. With
    `names` False, a spec missing required names or an entry point the target lacks passes here
    (`tileloop check` names them, with every other problem, from the worker)."""
    path, rel = resolve_target(target, repo_root)
    if path.suffix == cuda_c.SUFFIX:
        return _cuda_kernel(path, rel, repo_root, names)
    tree = _parse(path, "target")
    language = detect_language(tree)
    if language is None:
        raise UserError(
            f"target {rel} imports neither triton nor cuda.tile",
            hint="a target holds @triton.jit or @ct.kernel functions and a run(**inputs) wrapper",
        )
    spec = path.parent / "spec.py"
    if not spec.is_file():
        raise UserError(f"no spec.py beside the target {rel}", hint="the spec holds inputs, reference and shapes")
    spec_tree = _parse(spec, "spec")
    missing = [name for name in SPEC_REQUIRED if name not in _top_level_names(spec_tree)]
    if missing and names:
        raise UserError(f"spec {spec.relative_to(repo_root)} is missing required name(s): {', '.join(missing)}")
    entry = spec_entry(spec_tree)
    if names and entry is not None and entry not in _top_level_names(tree):
        raise UserError(f"target {rel} has no top-level {entry}(**inputs)" + (" launch wrapper" if entry == "run" else ""),
                        hint="name the target's entry point in the spec: ENTRY = '<function>', or an adapter "
                             "entry(target, **inputs)" if entry == "run" else f"ENTRY in the spec names {entry!r}")
    return Kernel(repo_root, rel, spec.relative_to(repo_root), language, _op_name(path))


def _cuda_kernel(path: Path, rel: Path, repo_root: Path, names: bool) -> Kernel:
    """A CUDA C target (`extern "C" void solve(...)`, its parameters read) and its spec; UserError
    with a one-line reason otherwise. Which inputs match which parameters is `tileloop check`'s."""
    try:
        source = path.read_text()
    except UnicodeDecodeError:
        raise UserError(f"target {rel} is not UTF-8 text") from None
    if language_of_file(path.name, source) is None:
        raise UserError(f'target {rel} declares no extern "C" void solve(...)',
                        hint="a CUDA C target launches its kernels from extern \"C\" void solve(<pointers and "
                             "scalars>), called with the spec's inputs by name")
    cuda_c.solve_signature(source, str(rel))  # a parameter it cannot read is named here, with its line
    spec = path.parent / "spec.py"
    if not spec.is_file():
        raise UserError(f"no spec.py beside the target {rel}", hint=f"tileloop spec {rel} writes one from solve's "
                        "parameters")
    spec_tree = _parse(spec, "spec")
    missing = [name for name in SPEC_REQUIRED if name not in _top_level_names(spec_tree)]
    if missing and names:
        raise UserError(f"spec {spec.relative_to(repo_root)} is missing required name(s): {', '.join(missing)}")
    entry = spec_entry(spec_tree)
    if names and entry not in (None, "run", cuda_c.ENTRY):
        raise UserError(f"the spec's ENTRY {entry!r} is not {cuda_c.ENTRY}: a CUDA C target is called through "
                        f"{cuda_c.ENTRY}", hint=f'ENTRY = "{cuda_c.ENTRY}"')
    return Kernel(repo_root, rel, spec.relative_to(repo_root), "cuda", _op_name(path))


def _op_name(path: Path) -> str:
    """The op a target file tunes: its name without the _triton / _cutile / _cuda suffix."""
    op = path.stem
    for suffix in ("_triton", "_cutile", "_cuda"):
        op = op.removesuffix(suffix)
    return op


def load_harness_target(target: str | Path, repo_root: Path) -> tuple[Path, str, str]:
    """(path relative to the root, language, op) of an external run's target: a Python file in the repository."""
    path, rel = resolve_target(target, repo_root)
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as exc:
        raise UserError(f"target {rel} does not parse: line {exc.lineno}: {exc.msg}") from None
    except UnicodeDecodeError:
        raise UserError(f"target {rel} is not UTF-8 text") from None
    return rel, detect_language(tree) or "python", _op_name(path)


IMPORTABLE = (".py", ".so", ".pyd")


def imported_files(root: Path, target: str, spec: str | None, candidates: list[str]) -> list[str]:
    """Which of `candidates` (files relative to `root`, e.g. the new untracked ones) the target or its
    spec imports, directly or through other candidates. Module names resolve against the target's
    folder (the worker's sys.path[0]) and the repository root (where an external harness runs);
    `importlib.import_module("x")` and `__import__("x")` with a literal name count as imports."""
    target_dir = (root / target).parent
    by_module: dict[str, str] = {}
    for rel in candidates:
        if not rel.endswith(IMPORTABLE):
            continue
        for base in (target_dir, root):
            try:
                parts = list((root / rel).relative_to(base).parts)
            except ValueError:
                continue
            parts[-1] = parts[-1].split(".")[0]
            if parts[-1] == "__init__":
                parts.pop()
            if parts:
                by_module.setdefault(".".join(parts), rel)
    found: set[str] = set()
    queue = [root / target] + ([root / spec] if spec else [])
    while queue:
        for name in _imported_names(queue.pop(), target_dir):
            for module, rel in by_module.items():
                if rel not in found and (name == module or name.startswith(module + ".") or module.startswith(name + ".")):
                    found.add(rel)
                    if rel.endswith(".py"):
                        queue.append(root / rel)
    return sorted(found)


def _imported_names(path: Path, target_dir: Path) -> set[str]:
    """Dotted module names a Python file imports (relative imports resolved against the target's folder)."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return set()
    try:
        package = ".".join(path.parent.relative_to(target_dir).parts)
    except ValueError:
        package = ""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: max(0, len(package.split(".")) - (node.level - 1))] if package else []
                base = ".".join([*up, *([base] if base else [])])
            names.update(f"{base}.{alias.name}".strip(".") for alias in node.names)
            if base:
                names.add(base)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and _callee(node.func) in ("import_module", "__import__"):
            names.add(node.args[0].value)
    return names


def _callee(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
