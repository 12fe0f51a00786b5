"""The one reading of a kernel file (loop.common.kernel_source), and the cases where the readings it
replaced disagreed: each reader of a target now sees the same kernels and the same entry point."""

from __future__ import annotations

import ast

import pytest

from loop.common import kernel_source
from loop.target.contract import spec_entry as contract_entry
from loop.target.coverage import unexercised
from loop.worker.interpreter_limits import interpreter_limits
from playbook.cst.entry import spec_entry as playbook_entry
from playbook.hazards import scan

ALIASED = '''
import triton as tr
import triton.language as tl
from triton import jit, autotune
import numba


@tr.jit
def a(x_ptr):
    pass


@autotune(configs=[], key=[])
@jit
def b(x_ptr):
    pass


@tr.heuristics({"EVEN": lambda args: True})
@tr.jit
def c(x_ptr):
    pass


@numba.jit
def host_math(n):
    return n


def run(x):
    a[(1,)](x)
    return host_math(3)
'''


def names(fns) -> list[str]:
    return [f.name for f in fns]


def test_kernels_are_read_through_the_imports():
    tree = ast.parse(ALIASED)
    assert names(kernel_source.kernels(tree)) == ["a", "b", "c"]


def test_a_jit_of_another_library_is_no_kernel():
    tree = ast.parse("import numba\nfrom torch import jit\n\n@numba.jit\ndef f(n):\n    pass\n\n@jit.script\ndef g(n):\n    pass\n")
    assert kernel_source.kernels(tree) == []


def test_cutile_kernels_and_device_functions():
    src = "import cuda.tile as ct\n\n@ct.kernel\ndef k(x):\n    pass\n\n@ct.function\ndef h(x):\n    pass\n"
    tree = ast.parse(src)
    assert names(kernel_source.kernels(tree)) == ["k"]
    assert sorted(kernel_source.device_functions(tree)) == ["h", "k"]


def test_nested_kernels_are_read_when_asked():
    src = "import triton\n\ndef make():\n    @triton.jit\n    def k(x):\n        pass\n    return k\n"
    tree = ast.parse(src)
    assert kernel_source.kernels(tree) == [] and names(kernel_source.kernels(tree, nested=True)) == ["k"]


def test_launches_and_the_forward_call_graph():
    src = "def run(x):\n    return helper(x)\n\ndef helper(x):\n    mod.k[(1,)](x)\n\ndef unused():\n    pass\n"
    tree = ast.parse(src)
    launches = [kernel_source.launched(c) for c in ast.walk(tree) if isinstance(c, ast.Call)]
    assert "k" in launches
    assert kernel_source.reached(tree, ["run"]) == {"run", "helper"}


def test_a_jit_of_another_library_called_from_the_host_is_host_code():
    # read by decorator name alone, @numba.jit was device code: a change to it was "unexercised"
    # although the checks called it
    after = ALIASED.replace("return n\n", "return n + 0\n")
    assert unexercised(ALIASED, after, ["a"], ["run", "host_math"]) == []
    assert unexercised(ALIASED, after, ["a"], ["run"]) == ["host_math"]


def test_a_cutile_device_function_no_launched_kernel_calls_is_unexercised():
    # read as host code before, a change to an unused @ct.function passed as "may have run"
    before = ("import cuda.tile as ct\n\n@ct.function\ndef h(x):\n    return x\n\n"
              "@ct.kernel\ndef k(x):\n    pass\n\ndef run(x):\n    ct.launch(None, (1,), k, (x,))\n")
    after = before.replace("return x\n", "return x + 1\n")
    assert unexercised(before, after, ["k"], None) == ["h"]
    assert unexercised(before, after.replace("    pass\n", "    h(x)\n"), ["k"], None) == []


def test_the_interpreter_limits_read_only_kernel_arguments():
    # read by substring, `@numba.njit` made `n` a kernel's scalar argument
    src = ("import numba\nimport triton\n\n@numba.njit\ndef host(n):\n    return n.to(1)\n\n"
           "@triton.jit\ndef k(x_ptr, s):\n    y = s.to(1)\n")
    message = "'float' object has no attribute 'to'"
    assert interpreter_limits(src, message) == ("`s.to(...)` on a scalar argument (a Python number there)", 10)


def test_hazards_scan_kernels_of_an_alias_only():
    src = ("import triton as tr\nimport triton.language as tl\nimport numba\n\n@tr.jit\ndef k(p):\n"
           "    tl.atomic_add(p, 1)\n\n@numba.jit\ndef f(p):\n    tl.atomic_add(p, 1)\n")
    assert [h.line for h in scan(src, "triton") if h.code == "cross-block-atomic"] == [7]


@pytest.mark.parametrize("spec,contract,playbook", [
    ("ENTRY = 'fwd'\n", "fwd", ("fwd",)),
    ("import torch\n", "run", ("run",)),
    # an adapter bound by import or assignment is what the worker calls (getattr(spec, "entry")):
    # the playbook read ENTRY there and followed a function the spec never calls
    ("from adapters import entry\nENTRY = 'fwd'\n", None, ()),
    ("entry = lambda target, **inputs: target.fwd(**inputs)\nENTRY = 'fwd'\n", None, ()),
    # an annotated ENTRY, and the last of two, are what the spec runs with
    ("ENTRY: str = 'fwd'\n", "fwd", ("fwd",)),
    ("ENTRY = 'old'\nENTRY = 'fwd'\n", "fwd", ("fwd",)),
    ("def entry(target, x):\n    return target.Fn.apply(x)\n", None, ("Fn",)),
])
def test_the_contract_and_the_playbook_read_one_entry_point(spec, contract, playbook):
    assert contract_entry(ast.parse(spec)) == contract
    assert playbook_entry(spec) == playbook


def test_the_playbook_reads_kernels_by_the_same_rule():
    import libcst as cst

    from playbook.cst.aliases import aliases
    from playbook.cst.kernels import cutile_kernels, is_triton_decorator, is_triton_jit, triton_kernels

    src = ("import triton as tr\nimport cuda.tile as ct\nimport numba\nfrom triton import jit as J\n\n"
           "@J\ndef e(x):\n    pass\n\n@tr.runtime.jit\ndef a(x):\n    pass\n\n"
           "@tr.heuristics({})\n@tr.jit\ndef b(x):\n    pass\n\n@numba.jit\ndef c(x):\n    pass\n\n"
           "@ct.kernel\ndef d(x):\n    pass\n")
    module = cst.parse_module(src)
    al = aliases(module)
    fns = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
    triton = {n for n, f in fns.items() if any(is_triton_jit(d, al) for d in f.decorators)}
    assert triton | set(cutile_kernels(module, al)) == set(names(kernel_source.kernels(ast.parse(src))))
    assert [is_triton_decorator(d, al, "heuristics") for d in fns["b"].decorators] == [True, False]
    assert set(triton_kernels(module, al)) == {"a", "b", "e"}  # the forward path's reading of device code agrees


LAUNCHES = '''
import cuda.tile as tile
import triton


def run(x, k, kt, kernels):
    tile.launch(None, (1,), k, (x,))
    kt[(1,)](x)
    mod.kt2[(2,)](x)
    kernels[0][(1,)](x)
    other.launch(None, (1,), k2, (x,))
    tile.launch(None, (1,))
    helper(x)
'''


def test_launches_of_both_languages_are_read_through_the_imports():
    tree = ast.parse(LAUNCHES)
    imports = kernel_source.imported_names(tree)
    calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call)]
    assert sorted(filter(None, (kernel_source.launched(c, imports) for c in calls))) == ["k", "kt", "kt2"]
    # without the imports only the Triton form is read (the target checks' reading is unchanged)
    assert sorted(filter(None, (kernel_source.launched(c) for c in calls))) == ["kt", "kt2"]
    assert sum(kernel_source.is_launch(c) for c in calls) == 3  # `kernels[0][grid](...)` is a launch of no name
    cutile = [c for c in calls if kernel_source.is_cutile_launch(c, imports)]
    assert [ast.unparse(kernel_source.launch_argument(c, "args")) for c in cutile] == ["(x,)"]


def test_the_playbook_reads_launches_by_the_same_rule():
    import libcst as cst

    from playbook.cst.aliases import aliases
    from playbook.cst.launches import imports_of, is_cutile_launch, launched
    from playbook.cst.source import walk

    module = cst.parse_module(LAUNCHES)
    imports = imports_of(aliases(module))
    nodes = [n for n in walk(module) if isinstance(n, cst.Call)]
    tree = ast.parse(LAUNCHES)
    expected = sorted(filter(None, (kernel_source.launched(c, kernel_source.imported_names(tree))
                                    for c in ast.walk(tree) if isinstance(c, ast.Call))))
    assert sorted(filter(None, (launched(n, imports) for n in nodes))) == expected
    assert sum(is_cutile_launch(n, imports) for n in nodes) == 1


def test_the_cutile_hint_reads_kernels_and_launches_through_the_aliases():
    from playbook.analysis import analyze
    from playbook.cutile.hint import CuTileHint

    # read by attribute name alone, `other.launch(...)` passed TILE as a tile size of a cuTile launch
    src = ("import cuda.tile as cu\nimport other\n\nBLOCK = 64\nTILE = 256\n\n@other.kernel\ndef host(x):\n    pass\n\n"
           "@cu.kernel\ndef k(x, B: cu.Constant[int]):\n    pass\n\n"
           "def run(x):\n    other.launch(None, (1,), host, (x, TILE))\n    cu.launch(None, (1,), k, (x, BLOCK))\n")
    keys = {c.key for c in CuTileHint().candidates(src, analyze(src))}
    assert keys == {"cutile-hint:k.occupancy=2", "cutile-hint:BLOCK=128"}
