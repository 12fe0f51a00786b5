"""The playbook's layout: one module per recipe, named after its id, in the folder of its
language, with its page beside it; pages that install with the package; and a playbook that
imports nothing of loop but loop.common."""

import ast
import sys
from pathlib import Path

import pytest

import playbook
from playbook.base import page_path, page_text

REPO_ROOT = Path(__file__).resolve().parent.parent
PLAYBOOK = REPO_ROOT / "playbook"
LANGUAGES = ("triton", "cutile", "tilelang", "cuda")


def module_of(recipe) -> str:
    return type(recipe).__module__


def test_every_recipe_has_its_page_beside_its_module_naming_its_id():
    for r in playbook.recipes():
        page = page_path(r)
        assert page == Path(sys.modules[module_of(r)].__file__).with_suffix(".md"), r.id
        assert page.is_file(), f"no page for {r.id} at {page}"
        assert page.read_text().splitlines()[0] == f"# {r.id}", r.id
        assert page_text(r) == page.read_text()


def test_one_module_per_recipe_named_after_its_id_in_the_folder_of_its_language():
    modules = [module_of(r) for r in playbook.recipes()]
    assert len(modules) == len(set(modules)), "a module registers more than one recipe"
    for r in playbook.recipes():
        (language,) = r.languages
        assert language in LANGUAGES, r.id
        name = r.id.removeprefix(f"{language}-").replace("-", "_")
        assert module_of(r) == f"playbook.{language}.{name}", (r.id, module_of(r))


def test_languages_by_folder():
    for r in playbook.recipes():
        folder = module_of(r).split(".")[1]
        assert r.languages == (folder,), (r.id, r.languages)


def test_every_page_belongs_to_a_recipe_and_installs_with_the_package():
    pages = {page_path(r) for r in playbook.recipes()}
    found = {p for language in LANGUAGES for p in (PLAYBOOK / language).glob("*.md")}
    assert found == pages, sorted(str(p.relative_to(PLAYBOOK)) for p in found ^ pages)
    assert not (PLAYBOOK / "pages").exists()
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    globs = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["playbook"]
    for page in pages:
        assert any(page.relative_to(PLAYBOOK).match(g) for g in globs), page


def test_the_playbook_imports_nothing_of_loop_but_loop_common():
    for path in PLAYBOOK.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                if name == "loop" or name.startswith("loop."):
                    assert name.startswith("loop.common"), (str(path.relative_to(REPO_ROOT)), name)


def test_the_listing_order_does_not_depend_on_what_was_imported_first():
    """Registration happens on import; the order of recipes() is RECIPE_MODULES', whichever module a
    test or a tool imported first (a test importing a late recipe module directly once reordered
    `tileloop playbook list`)."""
    import subprocess
    import sys

    from conftest import REPO_ROOT

    script = ("import importlib, sys\n"
              "for name in sys.argv[1:]: importlib.import_module(name)\n"
              "import playbook\nprint(' '.join(r.id for r in playbook.recipes()))\n")
    orders = {subprocess.run([sys.executable, "-c", script, *first], cwd=REPO_ROOT, capture_output=True, text=True,
                             check=True).stdout for first in ([], ["playbook.cutile.row_chunks", "playbook.triton.whole_row"])}
    assert len(orders) == 1 and orders.pop().split()[0] == "eviction-policy"
