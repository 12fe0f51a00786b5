"""A language is one registry entry (loop.common.language): what the entry names exists, and the
readers (backends, the CLI's choices, the compile gate, language detection, the suite) agree with it."""

from __future__ import annotations

import ast
import importlib
from typing import get_args

import pytest

from loop import backends
from loop.backends import BACKENDS, Availability
from loop.common.errors import UserError
from loop.common.language import LANGUAGES, Language, detect_language, get_language, language_of_name, resolve


def test_the_language_literal_names_the_registry():
    assert get_args(Language) == tuple(LANGUAGES)


@pytest.mark.parametrize("name", list(LANGUAGES))
def test_an_entry_names_what_exists(name):
    entry = LANGUAGES[name]
    assert callable(resolve(entry.compile)) and callable(resolve(entry.load))
    assert importlib.import_module(entry.recipes).__name__ == entry.recipes
    assert BACKENDS[entry.compile_backend].language == name
    for device, names in entry.backends.items():
        assert names and all(BACKENDS[n].language == name for n in names), device
    for device, names in entry.preferred.items():
        assert names and set(names) <= set(entry.backends[device]), device
    assert set(entry.unsupported).isdisjoint(entry.preferred)


def test_every_backend_belongs_to_a_language_that_reports_it():
    named = {n for entry in LANGUAGES.values() for names in entry.backends.values() for n in names}
    assert named == set(BACKENDS)


def test_the_launch_hook_of_triton_resolves():
    pytest.importorskip("triton")
    assert callable(resolve(LANGUAGES["triton"].launch_hook))


@pytest.mark.parametrize("source,expected", [
    ("import triton\nimport triton.language as tl\n", "triton"),
    ("from triton.language import extra\n", "triton"),
    ("import cuda.tile as ct\n", "cutile"),
    ("import triton\nimport cuda.tile as ct\n", "cutile"),  # a cuTile target may import triton too
    ("from cuda import tile\n", "cutile"),
    ("import tritonish\nimport torch\n", None),
])
def test_a_file_is_of_the_language_it_imports(source, expected):
    assert detect_language(ast.parse(source)) == expected


def test_an_unknown_language_is_a_user_error():
    with pytest.raises(UserError, match="valid: triton, cutile"):
        get_language("fortran")


def test_the_backends_of_a_language_are_its_entrys():
    for name, entry in LANGUAGES.items():
        for device in ("cuda", "cpu"):
            assert [b.name for b in backends.for_language(name, device)] == list(entry.backends.get(device, ()))


def test_the_default_target_backend_is_the_first_preferred_one_available():
    yes, no = Availability(True), Availability(False, "absent")
    assert backends.default_target("triton", "cuda", {"ptx": yes, "tileir": yes}) == "tileir"
    assert backends.default_target("triton", "cuda", {"ptx": yes, "tileir": no}) == "ptx"
    assert backends.default_target("triton", "cpu", {"interpreter": yes}) == "interpreter"
    assert backends.default_target("cutile", "cuda", {"cutile": no}) == "cutile"  # `choose` says it is unavailable
    with pytest.raises(UserError, match=r"--device cpu runs Triton targets only \(cuTile has no CPU interpreter\)"):
        backends.default_target("cutile", "cpu", {"cutile": yes})


def test_the_cli_offers_the_registrys_backends():
    import argparse

    from loop.cli import tools

    choices = {}
    for add in tools.PARSERS.values():
        parser = argparse.ArgumentParser()
        add(parser)
        choices.update({action.dest: action.choices for action in parser._actions
                        if action.dest in ("backend", "target_backend") and action.choices})
    assert choices["target_backend"] == list(BACKENDS)
    assert choices["backend"] == [n for n, b in BACKENDS.items() if b.device == "cuda"]


def test_the_suite_reads_a_files_language_from_its_name():
    assert [language_of_name(s) for s in ("softmax_triton", "softmax_cutile", "softmax")] == ["triton", "cutile", None]


def test_the_compile_gate_runs_in_the_languages_compile_backend(monkeypatch, tmp_path):
    from loop.common.settings import Settings
    from loop.measure import compile_gate as gate

    seen = []
    monkeypatch.setattr(gate, "run_worker", lambda workdir, job, backend, *a, **k: seen.append(backend.name)
                        or {"status": "ok", "compile": {"ok": True, "results": []}})
    for name in LANGUAGES:
        gate.compile_gate(workdir=tmp_path, spec_path=tmp_path / "spec.py", target_dir=tmp_path,
                          target=tmp_path / "t.py", language=name, archs=["sm_90"], settings=Settings(),
                          cache_root=tmp_path)
    assert seen == [LANGUAGES[name].compile_backend for name in LANGUAGES]
