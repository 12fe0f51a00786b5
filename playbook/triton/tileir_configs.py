"""Recipe `triton-tileir-configs`: Tile IR autotune configs (occupancy, num_ctas), gated to Tile IR.

On the Tile IR backend of Triton (nvtriton with ENABLE_TILE=1), `num_warps` is ignored and the
knob that matters is `occupancy`, the number of programs the compiler plans to keep resident per
SM (default 1); `num_ctas=2` turns on 2-CTA MMA on Blackwell. The recipe gives the autotuner
those configs: each distinct set of meta-parameters (block sizes) of the kernel's configs at
occupancy 1, 2, 4, 8, times num_ctas 1 and 2 for dot kernels on sm_100+, at most 32 configs.
A kernel without @triton.autotune gets one, around its current launch (num_warps/num_stages move
into the base config; the key is the kernel's runtime size arguments).

Gating, at two levels:

* the recipe proposes only when the run's target backend is `tileir` and its architecture is
  known (num_ctas=2 needs sm_100+); otherwise `skip_reason` says which is missing;
* the rewritten source keeps working on every other backend. `occupancy` travels in the
  config's meta-parameter dict, because `triton.Config(..., occupancy=N)` is a TypeError in stock
  Triton 3.6 (and not accepted by every nvtriton snapshot either). As a launch keyword it is read by
  nvtriton's Tile IR backend (`TileIROptions.occupancy`), while stock Triton rejects it ("Keyword
  argument occupancy was specified but unrecognised"). So an `early_config_prune` hook
  (`prune_configs_by`), evaluated when the autotuner runs and the driver is live, keeps the Tile IR
  configs where `triton.runtime.driver.active.get_current_target().backend == "tileir"` and the
  original configs everywhere else (PTX, the interpreter's first config, the AOT gate's fake
  driver). The source imports and compiles unchanged under stock Triton.

It skips a kernel that already has `prune_configs_by` (a second pruner would have to be composed
by hand), a launch that sets `num_ctas`, `maxnreg` or `occupancy` itself, kernels that load and
store the same buffer (the autotuner reruns them on live data), and kernels launched more than once.
"""

from __future__ import annotations

import libcst as cst

from playbook.analysis import Analysis
from playbook.cst.aliases import Aliases, calls
from playbook.cst.constants import drop_constants, module_int_constants
from playbook.cst.edits import kwarg_value, remove_kwargs, replace
from playbook.cst.kernels import above_jit, is_triton_decorator, module_functions, triton_aliases, triton_kernels
from playbook.cst.launch_values import CONSTANT, LITERAL, launch_values
from playbook.cst.launches import Launch, triton_launches
from playbook.cst.source import Skip, checked, parse
from playbook.hazards import scan
from playbook.recipe import Candidate, PatternRecipe, off_path, off_path_reason, register
from playbook.triton.autotune_key import tuning_key
from playbook.triton.autotune_space import UNSUPPORTED_LAUNCH_OPTIONS

OCCUPANCY = (1, 2, 4, 8)
TWO_CTA_CAPABILITY = 100  # 2-CTA MMA: Blackwell (sm_100) and later
MAX_CONFIGS = 32  # Tile IR configs; beyond ~30 the first-call sweep's compile time runs into minutes
VARIANTS = "_with_tileir_configs"
PRUNE = "_configs_for_active_backend"
LAUNCH_OPTIONS = ("num_warps", "num_stages")

HELPERS = '''\
# Tile IR autotune configs (nvtriton with ENABLE_TILE=1): each block-size set of the configs at every
# occupancy (programs resident per SM, Tile IR's main knob; num_warps is ignored there) x num_ctas.
# `occupancy` is a Tile IR compile option that stock Triton rejects as an unknown launch keyword, so
# {prune} hands these configs to Tile IR only and the others to every other backend.
TILEIR_OCCUPANCY = {occupancy}
TILEIR_NUM_CTAS = {num_ctas}
TILEIR_MAX_CONFIGS = {max_configs}


def {variants}(configs):
    """`configs`, then each distinct set of their meta-parameters at every TILEIR_OCCUPANCY x
    TILEIR_NUM_CTAS (at most TILEIR_MAX_CONFIGS of those)."""
    configs = list(configs)
    sets = {{}}
    for config in configs:
        sets.setdefault(tuple(sorted(config.kwargs.items())), config)
    per_set = len(TILEIR_OCCUPANCY) * len(TILEIR_NUM_CTAS)
    return configs + [
        {tt}.Config({{**config.kwargs, "occupancy": occupancy}}, num_warps=config.num_warps,
                      num_stages=config.num_stages, num_ctas=num_ctas, pre_hook=config.pre_hook)
        for config in list(sets.values())[:max(1, TILEIR_MAX_CONFIGS // per_set)]
        for occupancy in TILEIR_OCCUPANCY
        for num_ctas in TILEIR_NUM_CTAS
    ]


def {prune}(configs, named_args, **kwargs):
    """The Tile IR configs (they carry `occupancy`) where Triton compiles for Tile IR, the others elsewhere."""
    tileir = {tt}.runtime.driver.active.get_current_target().backend == "tileir"
    return [config for config in configs if ("occupancy" in config.kwargs) == tileir]
'''


def _tuple(values: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, values)) + ("," if len(values) == 1 else "") + ")"


def _autotune_call(fn: cst.FunctionDef, al: Aliases) -> cst.Call | None:
    for dec in fn.decorators:
        if is_triton_decorator(dec, al, "autotune"):
            if not isinstance(dec.decorator, cst.Call):
                raise Skip(f"{fn.name.value}: @autotune without arguments")
            return dec.decorator
    return None


def _append_kwarg(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """`call` with `name=value` last, on a line of its own when the arguments are one per line."""
    args = list(call.args)
    equal = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
    new = cst.Arg(keyword=cst.Name(name), value=value, equal=equal)
    last = args[-1]
    between = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else None
    if between is not None and isinstance(between.whitespace_after, cst.ParenthesizedWhitespace):
        new = new.with_changes(comma=last.comma, whitespace_after_arg=last.whitespace_after_arg)
        args[-1] = last.with_changes(comma=between, whitespace_after_arg=cst.SimpleWhitespace(""))
    else:
        if isinstance(last.comma, cst.Comma):
            new = new.with_changes(comma=last.comma)
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return call.with_changes(args=[*args, new])


def _insert_helpers(module: cst.Module, code: str) -> cst.Module:
    """The helper block before the first function (after the imports and constants)."""
    body = list(module.body)
    at = next((i for i, s in enumerate(body) if isinstance(s, (cst.FunctionDef, cst.ClassDef))), len(body))
    parsed = cst.parse_module(code)
    block = list(parsed.body)  # (its opening comment is the parsed module's header)
    block[0] = block[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(),
                                                    *[line for line in parsed.header if line.comment]])
    if at < len(body):
        body[at] = body[at].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(),
                                                        *[ln for ln in body[at].leading_lines if ln.comment]])
    body[at:at] = block
    return module.with_changes(body=body)


@register
class TritonTileIRConfigs(PatternRecipe):
    id = "triton-tileir-configs"
    title = "Tile IR autotune configs: occupancy 1/2/4/8 (num_ctas 2 for dot kernels on sm_100+), only on tileir"
    languages = ("triton",)

    def propose(self, source: str, analysis: Analysis) -> list[Candidate]:
        if analysis.backend != "tileir":
            raise Skip(f"Tile IR configs are for runs whose target backend is tileir (this one: "
                       f"{analysis.backend or 'not known'}); elsewhere occupancy does not exist")
        if analysis.capability is None:
            raise Skip("the run's GPU architecture is not known: the config space (num_ctas=2 needs sm_100+) "
                       "cannot be chosen")
        module = parse(source)
        al = triton_aliases(module)
        defined = {f.name.value for f in module_functions(module)}
        if {VARIANTS, PRUNE} & defined:
            raise Skip("the Tile IR configs are already in place")
        kernels = triton_kernels(module, al)
        launches = triton_launches(module, kernels)
        left = off_path(kernels, analysis)
        out, reasons = [], [off_path_reason(left, analysis)] if left else []
        for name, fn in kernels.items():
            if name in left:
                continue
            mine = [launch for launch in launches if launch.kernel == name]
            try:
                if len(mine) != 1:
                    raise Skip(f"{name} is launched {len(mine)} times (one launch expected)")
                out.append(self._rewrite(module, al, fn, mine[0], analysis.capability))
            except Skip as exc:
                reasons.append(str(exc))
        if not out:
            raise Skip("; ".join(reasons) or "no @triton.jit kernel")
        return out

    def _rewrite(self, module: cst.Module, al: Aliases, fn: cst.FunctionDef, launch: Launch, capability: int
                 ) -> Candidate:
        name, tt = fn.name.value, al.triton
        for kw in UNSUPPORTED_LAUNCH_OPTIONS:
            if launch.kwarg(kw) is not None:
                raise Skip(f"the launch of {name} sets {kw}, which a triton.Config would override")
        if any(h.code == "aliasing" for h in scan(module.code_for_node(fn), "triton")):
            raise Skip(f"{name} loads and stores the same buffer: autotuning would benchmark it on live data")
        dot = bool(calls(fn.body, al.tl, "dot"))
        ctas = (1, 2) if dot and capability >= TWO_CTA_CAPABILITY else (1,)
        prune = cst.parse_expression(f'{{"early_config_prune": {PRUNE}}}')
        tuner = _autotune_call(fn, al)
        mapping: dict = {}
        removable: set[str] = set()
        if tuner is not None:  # an existing autotune list: wrap it
            if kwarg_value(tuner, "prune_configs_by") is not None:
                raise Skip(f"{name} already has prune_configs_by: compose the Tile IR gate with it by hand")
            at = next((i for i, a in enumerate(tuner.args) if a.keyword is not None and a.keyword.value == "configs"),
                      0 if tuner.args and tuner.args[0].keyword is None else None)
            if at is None:
                raise Skip(f"{name}: @autotune without configs")

            def wrapped(upd: cst.Call) -> cst.Call:
                args = list(upd.args)
                args[at] = args[at].with_changes(value=cst.Call(cst.Name(VARIANTS), [cst.Arg(args[at].value)]))
                return _append_kwarg(upd.with_changes(args=args), "prune_configs_by", prune)

            mapping[tuner] = wrapped
            base_configs = None
        else:  # no autotune yet: one around the current launch options
            constants = module_int_constants(module)
            options = []
            values, _ = launch_values(launch, constants)
            for kw in LAUNCH_OPTIONS:
                v = values.get(kw)
                if v is None:
                    continue
                if v.via is not None:
                    raise Skip(f"the launch of {name} passes {kw} through **{v.via}, which a triton.Config would "
                               f"override")
                if v.kind not in (LITERAL, CONSTANT):
                    continue  # computed per launch (calculate_settings): Tile IR ignores num_warps; the configs set it
                options.append(f"{kw}={v.value}")
                if v.kind == CONSTANT:
                    removable.add(v.name)
            keys = ", ".join(f'"{k}"' for k in tuning_key(fn, launch, al, set(), constants))
            base_configs = f"[{tt}.Config({{}}{''.join(', ' + o for o in options)})]"
            deco = (f"@{tt}.autotune(\n"
                    f"    configs={VARIANTS}({base_configs}),\n"
                    f"    key=[{keys}],\n"
                    f"    prune_configs_by={{\"early_config_prune\": {PRUNE}}},\n"
                    f")\n")
            mapping[fn] = above_jit(deco, al)
            mapping[launch.call] = lambda upd: remove_kwargs(upd, set(LAUNCH_OPTIONS))
        new = replace(module, mapping)
        new = drop_constants(new, removable)
        new = _insert_helpers(new, HELPERS.format(tt=tt, occupancy=_tuple(OCCUPANCY), num_ctas=_tuple(ctas),
                                                  max_configs=MAX_CONFIGS, variants=VARIANTS, prune=PRUNE))
        code = checked(new.code)
        space = "occupancy " + "/".join(map(str, OCCUPANCY)) + (" x num_ctas 1/2" if len(ctas) > 1 else "")
        created = " (new @triton.autotune around the current launch)" if base_configs else ""
        return Candidate(self.id, "tileir-configs", f"{self.id}:{name}",
                         f"{name}: Tile IR configs, {space}{created}",
                         f"{name}: Tile IR keeps 1 program per SM by default and ignores num_warps; {space} lets the "
                         f"autotuner raise residency to hide memory latency" + (
                             " and use 2-CTA MMA (sm_100+)" if len(ctas) > 1 else "") +
                         ": expect 10-50% on the tileir backend where one program per SM leaves bandwidth idle, ~0 "
                         "where the kernel already saturates it; no change on other backends (the configs never "
                         "reach them); the first call per key compiles the extra configs", code,
                         # a new autotune: its one base config times the variants; around an existing one, whose
                         # configs cannot be counted here, the most the variants keep (MAX_CONFIGS)
                         configs=len(OCCUPANCY) * len(ctas) if base_configs else MAX_CONFIGS)
