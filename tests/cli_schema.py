"""The JSON Schemas of tileloop's `--json` outputs (loop/cli/schema/), loaded for the tests.

`problems(obj)` says what is wrong with one output: the schema's complaints (cli.json dispatches to
the command's own schema, or to the error object) and every top-level field the schema does not
declare. The schemas themselves allow fields they do not name (fields are only ever added within a
schema version); the tests hold tileloop's own outputs to declared, and so documented, fields at
the top level. `Observer` collects the problems of every object the CLI prints during a test
(tests/conftest.py wraps `loop.cli.common.print_json` with it).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "loop" / "cli" / "schema"


@lru_cache(maxsize=None)
def schemas() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(SCHEMA_DIR.glob("*.json"))}


@lru_cache(maxsize=None)
def registry() -> Registry:
    return Registry().with_resources((name, Resource.from_contents(s)) for name, s in schemas().items())


@lru_cache(maxsize=None)
def validator(name: str = "cli.json") -> Draft202012Validator:
    schema = schemas()[name]
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=registry())


def is_error(obj: dict) -> bool:
    """The error object: `error` and no `ok` (check and profile failures carry their own fields and `ok`)."""
    return "error" in obj and "ok" not in obj


def schema_of(obj: dict) -> str | None:
    """The file that describes `obj`: the error object's, or its command's (with its action)."""
    if is_error(obj):
        return "common.json#/$defs/error"
    command = obj.get("command")
    name = f"{command}-{obj['action']}.json" if obj.get("action") else f"{command}.json"
    return name if name in schemas() else None


def resolve(ref: str) -> dict:
    name, _, pointer = ref.partition("#")
    node = schemas()[name]
    for part in [p for p in pointer.split("/") if p]:
        node = node[part]
    return node


def declared(ref: str) -> set[str]:
    """The top-level properties a schema names, those of the schema its `$ref` points to included."""
    node = resolve(ref)
    names = set(node.get("properties", {}))
    if "$ref" in node:
        base = node["$ref"]
        names |= declared(base if "#" in base and base.split("#")[0] else ref.split("#")[0] + base)
    return names


def problems(obj: dict) -> list[str]:
    """What is wrong with one `--json` output, each as `path: message`; [] when it fits its schema."""
    out = [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
           for e in sorted(validator().iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))]
    ref = schema_of(obj)
    if ref is None:
        return out + [f"no schema for command {obj.get('command')!r} (action {obj.get('action')!r})"]
    extra = sorted(set(obj) - declared(ref) - {"schema", "command", "action"})
    return out + [f"{k}: a field {ref} does not declare (add it to the schema, and so to docs/json.md)" for k in extra]


class Observer:
    """Every JSON object printed during a test, checked against its schema."""

    def __init__(self):
        self.seen: list[str] = []  # the schema of each object, in order
        self.failures: list[str] = []

    def __call__(self, obj: dict) -> None:
        self.seen.append(schema_of(obj) or "?")
        found = problems(obj)
        if found:
            head = f"tileloop {obj.get('command')} {obj.get('action') or ''}".strip()
            self.failures.append(f"{head} --json does not fit {schema_of(obj)}: " + "; ".join(found[:5]))


# ----------------------------------------------------------------------------- docs/json.md, generated

BEGIN = ("<!-- generated from loop/cli/schema/*.json: edit the schemas, then regenerate this part with "
         "TILELOOP_UPDATE_GOLDEN=1 python -m pytest -q tests/test_json_contract.py -->")
END = "<!-- end of the generated part -->"


def _title(def_name: str) -> str:
    return def_name.replace("_", " ").capitalize()


def _anchor(def_name: str) -> str:
    return def_name.replace("_", "-")


def shape(node: dict) -> str:
    """A field's shape in a few characters: {a, b}, [{a, b}], one of `x`, `y`, a link to a shared object."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        if node["$ref"].startswith("common.json"):
            return f"[{_title(name).lower()}](#{_anchor(name)})"
        return _title(name).lower()
    if "anyOf" in node:
        return " or ".join(shape(n) for n in node["anyOf"] if n.get("type") != "null") + " or null"
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return "one of " + ", ".join("null" if v is None else f"`{v}`" for v in node["enum"])
    types = node.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    nullable = " or null" if "null" in types else ""
    if "array" in types:
        return f"[{shape(node.get('items') or {})}]{nullable}"
    if "object" in types and node.get("properties"):
        return "{" + ", ".join(node["properties"]) + "}" + nullable
    if "object" in types and isinstance(node.get("additionalProperties"), dict):
        return "{name: " + shape(node["additionalProperties"]) + "}" + nullable
    return " or ".join(t for t in types if t != "null") + nullable if types else "any"


def _fields(node: dict) -> list[str]:
    required = set(node.get("required", []))
    lines = []
    for name, prop in node.get("properties", {}).items():
        if name in ("command", "action") and "const" in prop:
            continue
        optional = "" if name in required else "; not always present"
        desc = prop.get("description", "")
        lines.append(f"- `{name}` ({shape(prop)}{optional})" + (f": {desc}" if desc else ""))
    return lines


def _section(heading: str, node: dict) -> list[str]:
    text = node.get("description", "").rstrip(".")
    text = text[:1].upper() + text[1:] + "." if text else ""
    if "$ref" in node:
        base = node["$ref"].rsplit("/", 1)[-1]
        text += f" The fields of a [{_title(base).lower()}](#{_anchor(base)})" + (", and:" if _fields(node) else ".")
    return [heading, "", text.strip(), "", *_fields(node), ""] if _fields(node) else [heading, "", text.strip(), ""]


def render_doc(order: list[str]) -> str:
    """The command and shared-object sections of docs/json.md, from the schemas; `order` is the
    commands' order (the CLI's)."""
    files = [n for n in schemas() if n not in ("cli.json", "common.json")]
    actions = {}  # the actions of playbook, experience and suite, in cli.json's order
    for branch in schemas()["cli.json"]["else"]["allOf"]:
        command, action = branch["if"]["properties"]["command"]["const"], branch["then"].get("properties", {}).get("action")
        if action:
            actions[command] = action["enum"]

    def key(fname: str) -> tuple:
        command = next(c for c in order if fname in (f"{c}.json", *(f"{c}-{a}.json" for a in actions.get(c, ()))))
        action = fname.removesuffix(".json").removeprefix(command).lstrip("-")
        return order.index(command), actions.get(command, [""]).index(action) if action else 0

    out = [BEGIN, "", "## Commands", ""]
    for fname in sorted(files, key=key):
        node = schemas()[fname]
        name = node["title"].removeprefix("tileloop ").removesuffix(" --json")
        out += _section(f"### `{name}`", node)
        for def_name, sub in node.get("$defs", {}).items():
            out += _section(f"#### {_title(def_name)}", sub)
    out += ["## Shared objects", ""]
    for def_name, node in schemas()["common.json"]["$defs"].items():
        out += _section(f'### {_title(def_name)} <a id="{_anchor(def_name)}"></a>', node)
    return "\n".join(out + [END])
