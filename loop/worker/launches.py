"""Which of the target's code ran: the launch paths of Triton (`JITFunction.run`, and the
interpreter's `InterpretedFunction.run`; autotuners and heuristics end there), cuTile
(`cuda.tile.launch`), TileLang (a compiled kernel called, `JITKernel.__call__`: the lazy form's
`kernel(M, N)(tensors)` and the eager form's `kernel(tensors)` both launch there; `JITImpl.__call__`
only compiles or looks up, and is not called at all where an entry point keeps its compiled kernel;
each kernel is attributed to the `@tilelang.jit` function of the target that holds it) and any other
language's launch hook, its registry entry's (CUDA C: its `solve` called, which launches its kernels)
are watched while the checks run, and the target's own kernels (defined in its module) that launched
are recorded by name; so are the target's host functions that were called (its module's functions
and the methods of its classes, wrapped for the time of the checks).

While timed, a recorder without the host watch (`host=False`) counts the launches of every timed
request (`count`), so that the judge refuses timed calls that launched none of the target's
kernels (a candidate that calls torch instead). A target that defines no kernel of its own (an op
module whose kernels live elsewhere) has every Triton or cuTile launch counted instead."""

from __future__ import annotations

import contextlib
import functools
import inspect
import types


def _name_of(fn) -> tuple[str | None, str | None]:
    """(function name, defining module) of a Triton JIT function or a cuTile kernel, unwrapping tuners."""
    for _ in range(6):
        if type(fn).__name__ == "JITImpl":  # a TileLang kernel: the function @tilelang.jit decorates
            fn = getattr(fn.func, "orig_func", fn)
        inner = getattr(fn, "fn", None) or getattr(fn, "_pyfunc", None)
        annotated = getattr(fn, "_annotated_function", None)
        if annotated is not None:
            inner = getattr(annotated, "pyfunc", inner)
        if inner is None or inner is fn:
            break
        fn = inner
    return getattr(fn, "__name__", None), getattr(fn, "__module__", None)


def _hook(language: str) -> tuple[object, str]:
    """(owner, attribute) of the language's launch hook (`module:Class.method` or `module:function`)."""
    from loop.common.language import get_language, resolve

    module, _, attrs = get_language(language).launch_hook.partition(":")
    owner, _, attr = attrs.rpartition(".")
    return resolve(f"{module}:{owner}"), attr


class LaunchRecorder(contextlib.AbstractContextManager):
    """Records the launches of `target`'s own kernels; for a stand-in that is not a module (torch eager,
    torch.compile), nothing: it has no kernels of its own."""

    def __init__(self, target, language: str, host: bool = True):
        self.active = isinstance(target, types.ModuleType)
        self.host = host
        self.count = 0  # launches of the target's kernels (of any kernel, when it defines none)
        self._target = target
        self.module_name = target.__name__ if self.active else None
        self.language = language
        self.launched: set[str] = set()
        self.called: set[str] = set()  # host functions: "name", or "Class.method"
        self.kernels = sorted({name for obj in vars(target).values()
                               for name, mod in [_name_of(obj)] if mod == self.module_name and self._is_kernel(obj)}) \
            if self.active else []
        self._owners: dict[int, object] = {}  # a compiled TileLang kernel's id -> the @tilelang.jit function holding it
        self._undo = contextlib.ExitStack()

    @staticmethod
    def _is_kernel(obj) -> bool:
        kind = type(obj).__name__
        return kind in ("JITFunction", "InterpretedFunction", "Autotuner", "Heuristics", "JITImpl") \
            or hasattr(obj, "_annotated_function") or kind == "kernel"

    def _record(self, fn) -> None:
        name, module = _name_of(fn)
        if name and module == self.module_name:
            self.launched.add(name)
            self.count += 1
        elif not self.kernels:
            self.count += 1

    def _jit_of(self, kernel):
        """The target's `@tilelang.jit` function that holds a compiled TileLang kernel (the kernel itself,
        which names no function of the target, where none does)."""
        if (known := self._owners.get(id(kernel))) is not None:
            return known
        for impl in (obj for obj in vars(self._target).values() if type(obj).__name__ == "JITImpl"):
            held = [*getattr(impl, "_kernel_cache", {}).values(), *getattr(impl, "_tuner_cache", {}).values()]
            if any(k is kernel for k in held):
                self._owners[id(kernel)] = impl
                return impl
        return kernel

    def _patch(self, owner, attr: str, make) -> None:
        real = vars(owner)[attr] if isinstance(owner, type) else getattr(owner, attr)  # a class's own, descriptors kept
        setattr(owner, attr, make(real))
        self._undo.callback(setattr, owner, attr, real)

    def _watch_host_calls(self, target) -> None:
        """Wrap the target's own Python functions (module-level, and methods of its classes), so that
        a call through the module's globals or a class attribute is recorded."""
        def wrapped(name: str, fn):
            @functools.wraps(fn)
            def call(*args, **kwargs):
                self.called.add(name)
                return fn(*args, **kwargs)
            return call

        for name, obj in list(vars(target).items()):
            if inspect.isfunction(obj) and obj.__module__ == self.module_name:
                self._patch(target, name, lambda real, name=name: wrapped(name, real))
            elif inspect.isclass(obj) and obj.__module__ == self.module_name:
                for attr, raw in list(vars(obj).items()):
                    kind = type(raw)
                    fn = raw.__func__ if kind in (staticmethod, classmethod) else raw
                    if inspect.isfunction(fn):
                        self._patch(obj, attr, lambda real, n=f"{name}.{attr}", k=kind, f=fn:
                                    k(wrapped(n, f)) if k in (staticmethod, classmethod) else wrapped(n, f))

    def __enter__(self):
        recorder = self
        if not self.active:
            return self
        if self.host:
            self._watch_host_calls(self._target)
        if self.language == "triton":
            from triton.runtime.jit import JITFunction

            def wrapped_run(real):
                def run(self, *args, **kwargs):
                    if not kwargs.get("warmup"):
                        recorder._record(self)
                    return real(self, *args, **kwargs)
                return run

            self._patch(JITFunction, "run", wrapped_run)
            with contextlib.suppress(ImportError):
                from triton.runtime.interpreter import InterpretedFunction

                self._patch(InterpretedFunction, "run", wrapped_run)
        elif self.language == "cutile":
            import cuda.tile as ct

            def wrapped_launch(real):
                def launch(stream, grid, kernel, *args, **kwargs):
                    recorder._record(kernel)
                    return real(stream, grid, kernel, *args, **kwargs)
                return launch

            self._patch(ct, "launch", wrapped_launch)
        else:  # any other language: the call its registry entry names, the kernel or entry point first (CUDA C:
            # solve; TileLang: a compiled kernel, credited to the target's @tilelang.jit function that holds it)
            owner, attr = _hook(self.language)
            credited = recorder._jit_of if self.language == "tilelang" else (lambda first: first)

            def wrapped_hook(real):
                def hook(first, *args, **kwargs):
                    recorder._record(credited(first))
                    return real(first, *args, **kwargs)
                return hook

            self._patch(owner, attr, wrapped_hook)
        return self

    def __exit__(self, *exc) -> None:
        self._undo.close()
