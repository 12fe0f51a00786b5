"""The launch cutile-autotune writes: the wrapper's body moved into `_launch_plan(cfg, ...)`, the
spaces (`_TUNE_SPACES`), the cache of tuned configs (`_TUNED`) and the helpers that tune on the
first call for an input key; and what it is written from (`Pattern`: the launch as recognised)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from playbook.cst.aliases import Aliases
from playbook.cst.constants import drop_constants
from playbook.cst.imports import imports
from playbook.cst.source import checked
from playbook.cutile.tune_space import BLACKWELL_MAJOR, HINTS, Space, space_code, tuple_code


@dataclass
class Pattern:
    """The launch as cutile-autotune recognises it: what the tuned launch is written from."""
    al: Aliases
    kernel: cst.FunctionDef
    wrapper: cst.FunctionDef
    launch_index: int  # of the launch statement in the wrapper body
    stream: cst.BaseExpression
    grid: cst.BaseExpression
    args: cst.BaseExpression  # the tuple / list of kernel arguments
    wrapper_params: list[str]
    knobs: dict[str, int]  # tile constant -> current value, in launch order
    fixed: dict[str, str]  # tile-like constants left alone -> why
    writes: list[int]  # positions of wrapper parameters the kernel writes (through the launch)
    occupancy: int | None
    num_ctas: int | None
    mma: bool


# the module-level names the tuned launch defines (a module that has one is tuned already)
HELPER_NAMES = ("_TUNE_SPACES", "_TUNE_WRITES", "_TUNED", "_tune_space", "_scratch", "_tuned", "_autotune",
                "_launch_plan")
RUN_LOCALS = ("cfg", "kernel", "grid", "args")  # the locals of the new wrapper


HELPERS = '''\
def _tune_space():
    major, _ = torch.cuda.get_device_capability()
    return _TUNE_SPACES["sm_100" if major == {blackwell} else "sm_90"]


def _scratch(value):
    """A copy of a tensor in new memory with the same layout (anything else as it is)."""
    if not isinstance(value, torch.Tensor):
        return value
    copy = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
    return copy.copy_(value)


def _tuned(*args):
    """(config, kernel with its hints) for {wrapper}(*args): tuned on the first call with a new input key
    (shapes, dtypes, strides and devices of the tensors, values of the scalars), cached after."""
    key = tuple((tuple(a.shape), a.dtype, a.stride(), a.device) if isinstance(a, torch.Tensor)
                else a if isinstance(a, (bool, int, float, str, type(None))) else type(a).__name__ for a in args)
    if key not in _TUNED:
        _TUNED[key] = _autotune(args)
    return _TUNED[key]


def _autotune(args):
    space = _tune_space()
    if os.environ.get("DISABLE_CUTILE_TUNE") == "1":  # TileGym convention: the first config, no tuning trials
        cfg = space[0]
    else:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("{wrapper}() met a new input key during CUDA-graph capture, where it cannot tune: "
                               "call it once with inputs of these shapes before capturing")
        tune_args = tuple(_scratch(a) if i in _TUNE_WRITES else a for i, a in enumerate(args))

        def part(i):
            return lambda cfg: _launch_plan(cfg, *tune_args)[i]

        result = {ct}.tune.exhaustive_search(space, {stream}, part(0), part(1), part(2),
                                           hints_fn=part(3), quiet=True)
        best = result.best
        # within the timing noise (the two 95% margins, or 2%) a config ties with the best; the
        # earliest tie wins (the kernel as it was first), so the pick does not flip between runs
        ties = [m for m in result.successes
                if m.mean_us - best.mean_us <= max(m.error_margin_us + best.error_margin_us, 0.02 * best.mean_us)]
        cfg = min(ties, key=lambda m: space.index(m.config)).config
    _, kernel, _, hints = _launch_plan(cfg, *args)
    return cfg, kernel.replace_hints(**hints)
'''


def _header(pat: Pattern, spaces: dict[str, Space]) -> str:
    kname = pat.kernel.name.value
    wname = pat.wrapper.name.value
    entries = "\n".join(f'    "{arch}": {space_code(s, " " * (len(arch) + 8))},' for arch, s in spaces.items())
    writes = ", ".join(pat.wrapper_params[i] for i in pat.writes) or "none"
    return (f"# cutile-autotune: {wname}() launches {kname} with the best config of _TUNE_SPACES for its input\n"
            f"# key, found on the first call for the key by ct.tune.exhaustive_search and cached in _TUNED. The\n"
            f"# first config of each space is the kernel as it was. \"sm_100\": sm_100/sm_103; \"sm_90\": other GPUs.\n"
            f"_TUNE_SPACES = {{\n{entries}\n}}\n"
            f"_TUNE_WRITES = {tuple_code([str(i) for i in pat.writes])}  # {wname}() arguments the kernel writes "
            f"({writes}): tuned on scratch copies\n"
            f"_TUNED = {{}}  # input key -> (config, kernel with the config's hints)\n")


def _statements(code: str) -> list[cst.BaseStatement]:
    """The statements of `code`, comments before the first one kept (as its leading lines)."""
    return list(cst.parse_module("pass\n" + code).body[1:])


def _blank(n: int) -> list[cst.EmptyLine]:
    return [cst.EmptyLine()] * n


def rewrite(module: cst.Module, pat: Pattern, spaces: dict[str, Space]) -> str:
    wrapper = pat.wrapper
    body = list(wrapper.body.body)
    pre = body[:pat.launch_index]
    docstring = []
    if pre and isinstance(pre[0].body[0], cst.Expr):
        docstring, pre = [pre[0]], pre[1:]
    rest = body[pat.launch_index + 1:]
    code = module.code_for_node
    forward = ", ".join(pat.wrapper_params)

    plan_body: list[cst.BaseStatement] = _statements(
        '"""grid, kernel, kernel arguments and compiler hints of the launch under config `cfg`."""\n')
    if pat.knobs:
        names = list(pat.knobs)
        reads = ", ".join(f'cfg["{n}"]' for n in names)
        plan_body += _statements(f"{', '.join(names)} = {reads}\n")
    plan_body += [s.with_changes(leading_lines=()) if i == 0 else s for i, s in enumerate(pre)]
    plan_body += _statements(f"return ({code(pat.grid)}, {pat.kernel.name.value}, {code(pat.args)},\n"
                             f"        {{hint: cfg[hint] for hint in {HINTS!r} if hint in cfg}})\n".replace("'", '"'))
    plan_params = wrapper.params.with_changes(params=[cst.Param(cst.Name("cfg"), comma=cst.Comma(
        whitespace_after=cst.SimpleWhitespace(" "))), *wrapper.params.params])
    plan = wrapper.with_changes(name=cst.Name("_launch_plan"), params=plan_params, decorators=(),
                                body=wrapper.body.with_changes(body=plan_body), leading_lines=_blank(2))

    run_body = docstring + _statements(
        f"cfg, kernel = _tuned({forward})\n"
        f"grid, _, args, _ = _launch_plan(cfg, {forward})\n"
        f"{pat.al.ct}.launch({code(pat.stream)}, grid, kernel, args)\n") + rest
    run = wrapper.with_changes(body=wrapper.body.with_changes(body=run_body), leading_lines=_blank(2))

    header = _statements(_header(pat, spaces))
    header[0] = header[0].with_changes(leading_lines=[*wrapper.leading_lines, *header[0].leading_lines])
    helpers = _statements(HELPERS.format(blackwell=BLACKWELL_MAJOR, wrapper=wrapper.name.value, ct=pat.al.ct,
                                         stream=code(pat.stream)))
    helpers[0] = helpers[0].with_changes(leading_lines=_blank(2))

    new_body: list[cst.CSTNode] = []
    for stmt in module.body:
        if stmt is wrapper:
            new_body += [*header, *helpers, plan, run]
        else:
            new_body.append(stmt)
    new = module.with_changes(body=new_body)
    if not imports(module, "os"):
        new = _add_import_os(new)
    return checked(drop_constants(new, set(pat.knobs)).code)


def _add_import_os(module: cst.Module) -> cst.Module:
    """`import os` just before the first import that is not `from __future__`."""
    body = list(module.body)
    first = next(i for i, s in enumerate(body) if isinstance(s, cst.SimpleStatementLine) and (
        isinstance(s.body[0], cst.Import) or isinstance(s.body[0], cst.ImportFrom) and not (
            isinstance(s.body[0].module, cst.Name) and s.body[0].module.value == "__future__")))
    line = cst.parse_statement("import os\n").with_changes(leading_lines=body[first].leading_lines)
    body[first] = body[first].with_changes(leading_lines=_blank(1))  # the standard library in a group of its own
    return module.with_changes(body=[*body[:first], line, *body[first:]])
