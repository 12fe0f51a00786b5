"""What each keyword of a Triton launch is worth where the launch gives it: a literal, a module
constant, a literal the wrapper assigns once (`BLOCK_ROW = 16`), or a value the wrapper computes
(`BLOCK_SIZE, num_warps = calculate_settings(n_cols)`, a tensor size, a parameter of the wrapper);
given as `kw=value` or through a dict the wrapper builds and unpacks at the launch (`**kernel_args`
with `kernel_args = {"num_warps": 8}` or `kernel_args["BLOCK_ROW"] = BLOCK_ROW`).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from playbook.cst.kernels import params
from playbook.cst.launches import Launch
from playbook.cst.names import assignments, target_names
from playbook.cst.source import code_of, walk

LITERAL, CONSTANT, LOCAL, COMPUTED, UNKNOWN = "literal", "constant", "local", "computed", "unknown"


@dataclass(frozen=True)
class LaunchValue:
    kw: str
    expr: cst.BaseExpression  # the value as the launch (or the dict) gives it
    kind: str  # literal | constant | local | computed | unknown (a name neither the wrapper nor the module binds)
    value: int | None  # the int, where it is one before the launch runs
    name: str | None  # the module constant or wrapper local holding it
    literal: cst.Integer | None  # the integer that states it (a literal, or a local's assignment)
    origin: str  # where it comes from, for messages: "calculate_settings(n_cols)", "BLOCK_ROW = 16"
    via: str | None = None  # the dict it comes through (`**kernel_args`); None for a keyword


def dict_options(wrapper: cst.FunctionDef, name: str) -> tuple[dict[str, cst.BaseExpression], bool]:
    """The string keys a wrapper puts in its dict `name` (a literal, `name["k"] = v`,
    `name.update({...})` / `name.update(k=v)`) and their values; and whether other code may put
    more in it (the dict passed to a call, or keys that are not string literals)."""
    keys: dict[str, cst.BaseExpression] = {}
    opaque = False

    def from_dict(node: cst.BaseExpression) -> None:
        nonlocal opaque
        if not isinstance(node, cst.Dict):
            opaque = True
            return
        for el in node.elements:
            if isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString):
                keys[str(el.key.evaluated_value)] = el.value
            else:
                opaque = True

    for node in walk(wrapper.body):
        if isinstance(node, cst.Assign):
            for t in node.targets:
                tgt = t.target
                if isinstance(tgt, cst.Name) and tgt.value == name:
                    from_dict(node.value)
                elif (isinstance(tgt, cst.Subscript) and isinstance(tgt.value, cst.Name) and tgt.value.value == name):
                    index = tgt.slice[0].slice if len(tgt.slice) == 1 else None
                    if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
                        keys[str(index.value.evaluated_value)] = node.value
                    else:
                        opaque = True
        elif isinstance(node, cst.Call):
            f = node.func
            if isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.value.value == name:
                if f.attr.value == "update":
                    for a in node.args:
                        if a.keyword is not None:
                            keys[a.keyword.value] = a.value
                        else:
                            from_dict(a.value)
                elif f.attr.value not in ("get", "items", "keys", "values", "copy"):
                    opaque = True
            elif any(isinstance(a.value, cst.Name) and a.value.value == name and not a.star for a in node.args):
                opaque = True  # handed to other code (set_large_grf_mode(kernel_args)): it may add keys
    return keys, opaque


class _Wrapper:
    """What the values of one launch wrapper are read from, computed once: its parameters, every
    value each local is bound to, the locals assigned `name = <int>` on a line of their own, and
    each node's parent (to find the assignment that reaches a use)."""

    def __init__(self, wrapper: cst.FunctionDef):
        self.fn = wrapper
        self.params = {p.name.value for p in params(wrapper)}
        self.assigned = assignments(wrapper)
        self.parent: dict[int, cst.CSTNode] = {}
        self.plain: set[str] = set()
        stack = [wrapper.body]
        while stack:
            node = stack.pop()
            if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
                self.plain.add(node.targets[0].target.value)
            for child in node.children:
                self.parent[id(child)] = node
                stack.append(child)

    def reaching(self, name: str, use: cst.CSTNode) -> cst.BaseExpression | None:
        """The value of the last assignment to `name` before `use` in the blocks that enclose it (the
        one that reaches it when no branch in between assigns it again); None when there is none."""
        node = use
        while id(node) in self.parent:
            parent = self.parent[id(node)]
            body = getattr(parent, "body", None)
            if isinstance(body, (list, tuple)) and isinstance(node, cst.BaseStatement):
                at = next(i for i, stmt in enumerate(body) if stmt is node)
                for stmt in reversed(body[:at]):
                    if isinstance(stmt, cst.SimpleStatementLine):
                        for small in reversed(stmt.body):
                            if isinstance(small, cst.Assign) and any(name in target_names(t.target)
                                                                     for t in small.targets):
                                return small.value
            node = parent
        return None


def value_of(kw: str, expr: cst.BaseExpression, wrapper: cst.FunctionDef | _Wrapper, constants: dict[str, int],
             via: str | None) -> LaunchValue:
    """What `expr`, given at a launch in `wrapper` for the keyword `kw`, is worth there."""
    if isinstance(expr, cst.Integer):
        return LaunchValue(kw, expr, LITERAL, int(expr.evaluated_value), None, expr, code_of(expr), via)
    if not isinstance(expr, cst.Name):
        return LaunchValue(kw, expr, COMPUTED, None, None, None, code_of(expr), via)
    w = wrapper if isinstance(wrapper, _Wrapper) else _Wrapper(wrapper)
    name = expr.value
    values = w.assigned.get(name, [])
    if not values and name not in w.params and name in constants:
        return LaunchValue(kw, expr, CONSTANT, constants[name], name, None, name, via)
    if len(values) == 1 and name not in w.params and isinstance(values[0], cst.Integer) and name in w.plain:
        v = values[0]
        return LaunchValue(kw, expr, LOCAL, int(v.evaluated_value), name, v, f"{name} = {v.value}", via)
    if name in w.params and not values:
        return LaunchValue(kw, expr, COMPUTED, None, name, None, f"the argument {name}", via)
    if not values:
        return LaunchValue(kw, expr, UNKNOWN, None, name, None, f"`{name}`, bound outside {w.fn.name.value}", via)
    reaching = w.reaching(name, expr)
    origin = code_of(reaching) if reaching is not None else " or ".join(dict.fromkeys(code_of(v) for v in values))
    return LaunchValue(kw, expr, COMPUTED, None, name, None, origin, via)


def launch_values(launch: Launch, constants: dict[str, int]) -> tuple[dict[str, LaunchValue], list[str]]:
    """The launch's keyword options by name (direct keywords first, then the keys of the dicts it
    unpacks), and the dicts it unpacks whose keys the reading cannot list in full."""
    out: dict[str, LaunchValue] = {}
    opaque: list[str] = []
    wrapper = _Wrapper(launch.wrapper)
    for arg in launch.call.args:
        if arg.keyword is not None:
            out[arg.keyword.value] = value_of(arg.keyword.value, arg.value, wrapper, constants, None)
        elif arg.star == "**":
            if not isinstance(arg.value, cst.Name):
                opaque.append(code_of(arg.value))
                continue
            keys, hidden = dict_options(launch.wrapper, arg.value.value)
            for kw, value in keys.items():
                out.setdefault(kw, value_of(kw, value, wrapper, constants, arg.value.value))
            if hidden:
                opaque.append(arg.value.value)
    return out, opaque
