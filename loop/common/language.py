"""The languages tileloop tunes, one registry entry each, and the language of a kernel file.

An entry says what the rest of tileloop asks of a language: the imports that make a file one of its
targets, the function that compiles it ahead of time, how a target is loaded and the call every
launch goes through (dotted paths `module:attribute`, resolved where they run: this leaf imports
nothing else of tileloop), the backends that time it on each device and which of them decides by
default, and the playbook package of its recipes. The CLI's choices, the compile gate, the backends,
the suite and the playbook read it; `docs/architecture.md` ("Adding a language") lists the rest.
A language whose targets are not Python (CUDA C: a `.cu` file with `extern "C" void solve(...)`) is
recognised by its `suffix` and its `recognise` rule instead of its imports (`language_of_file`).
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from loop.common import cuda_c
from loop.common.errors import UserError

Language = Literal["triton", "cutile", "cuda", "tilelang"]  # the names of LANGUAGES, for type checkers


@dataclass(frozen=True)
class LanguageEntry:
    """One language. `backends[device]`: the backends a run on that device reports on, in display
    order; `preferred[device]`: its target backend by default, the first of these available, else the
    last (a device missing there cannot run the language, `unsupported[device]` says why)."""

    name: str  # as in `Language`, records and the suite's file names (`<op>_<name>.py`)
    title: str  # as the text names it
    modules: tuple[str, ...]  # importing one of these (or a submodule) makes a file a target of the language
    priority: int  # a file importing several languages' modules is of the one with the highest
    compile: str  # the worker's ahead-of-time compile: (torch, load_target, call_run, capability) -> kernels
    compile_backend: str  # the backend whose environment the compile gate's workers run in
    load: str  # how a worker loads a target: (module name, path) -> module
    launch_hook: str  # the call every launch of a kernel goes through (the worker records launches there)
    recipes: str  # the playbook package of its recipes
    backends: dict[str, tuple[str, ...]] = field(default_factory=dict)
    preferred: dict[str, tuple[str, ...]] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)
    suffix: str = ".py"  # its targets' file suffix; a Python language is recognised by its imports
    recognise: str = ""  # a target that is not Python: `module:function` (source -> bool) that accepts one


TRITON = LanguageEntry(
    "triton", "Triton", ("triton",), 0, "loop.worker.aot:_triton_compile", "ptx", "loop.common.spec:load_module",
    "triton.runtime.jit:JITFunction.run", "playbook.triton",
    backends={"cuda": ("ptx", "tileir"), "cpu": ("interpreter", "ptx", "tileir")},
    preferred={"cuda": ("tileir", "ptx"), "cpu": ("interpreter",)})
CUTILE = LanguageEntry(
    "cutile", "cuTile", ("cuda.tile",), 1, "loop.worker.aot:_cutile_compile", "cutile", "loop.common.spec:load_module",
    "cuda.tile:launch", "playbook.cutile",
    backends={"cuda": ("cutile",), "cpu": ("cutile",)},
    preferred={"cuda": ("cutile",)}, unsupported={"cpu": "cuTile has no CPU interpreter"})

CUDA = LanguageEntry(
    "cuda", "CUDA C", (), 2, "loop.worker.cuda_build:cuda_compile", "nvcc", "loop.worker.cuda_build:load_target",
    "loop.worker.cuda_build:_Solve.__call__", "playbook.cuda",
    backends={"cuda": ("nvcc",)}, preferred={"cuda": ("nvcc",)},
    unsupported={"cpu": "CUDA C has no CPU interpreter"}, suffix=cuda_c.SUFFIX,
    recognise="loop.common.cuda_c:has_solve")

TILELANG = LanguageEntry(
    "tilelang", "TileLang", ("tilelang",), 3, "loop.worker.tilelang_build:tilelang_compile", "tilelang",
    "loop.common.spec:load_module", "tilelang.jit.kernel:JITKernel.__call__", "playbook.tilelang",
    backends={"cuda": ("tilelang",)}, preferred={"cuda": ("tilelang",)},
    unsupported={"cpu": "TileLang has no CPU interpreter"})

LANGUAGES: dict[str, LanguageEntry] = {entry.name: entry for entry in (TRITON, CUTILE, CUDA, TILELANG)}


def get_language(name: str) -> LanguageEntry:
    """The registry entry of a language; UserError naming the valid ones for any other name."""
    try:
        return LANGUAGES[name]
    except KeyError:
        raise UserError(f"unknown language {name!r}; valid: {', '.join(LANGUAGES)}") from None


def runs_on(device: str) -> list[str]:
    """The titles of the languages a run on `device` can have a target backend for."""
    return [entry.title for entry in LANGUAGES.values() if device in entry.preferred]


def language_of_name(stem: str) -> str | None:
    """The language a reference suite file's name says (`softmax_cutile` -> "cutile"); None for none."""
    return next((name for name in LANGUAGES if stem.endswith(f"_{name}")), None)


def resolve(path: str) -> Any:
    """The object a dotted path `module:attribute[.attribute]` names, imported (in the process that uses it)."""
    module, _, attrs = path.partition(":")
    obj: Any = importlib.import_module(module)
    for attr in attrs.split(".") if attrs else ():
        obj = getattr(obj, attr)
    return obj


def detect_language(tree: ast.Module) -> Language | None:
    """The language whose modules the file imports (the highest `priority` where it imports several:
    a cuTile target may import triton too); None when it imports none. Decided by imports, never by
    regex on the text."""
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
            imported.update(f"{node.module}.{a.name}" for a in node.names)
    found = [entry for entry in LANGUAGES.values()
             if any(name == m or name.startswith(f"{m}.") for name in imported for m in entry.modules)]
    return max(found, key=lambda entry: entry.priority).name if found else None  # type: ignore[return-value]


def language_of_file(name: str, source: str) -> Language | None:
    """The language of a target that is not Python, by its suffix and its entry's `recognise` rule
    (a `.cu` file declaring `extern "C" void solve(...)` is CUDA C); None for a Python file or one
    no entry accepts."""
    for entry in LANGUAGES.values():
        if entry.suffix != ".py" and name.endswith(entry.suffix) and resolve(entry.recognise)(source):
            return entry.name  # type: ignore[return-value]
    return None


def not_python(path: Path) -> LanguageEntry | None:
    """The language of a target that is not Python, by its file's suffix (`.cu`: CUDA C); None for a
    Python file."""
    return next((e for e in LANGUAGES.values() if e.suffix != ".py" and path.name.endswith(e.suffix)), None)


def loader_of(path: Path) -> Callable[[str, Path], Any] | None:
    """How a worker loads a target that is not Python (its language's `load`, by the file's suffix);
    None for a Python file."""
    entry = not_python(path)
    return None if entry is None else resolve(entry.load)
