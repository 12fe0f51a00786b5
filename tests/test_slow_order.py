"""The slow tier's order (tests/conftest.py LONGEST_FIRST): the longest tests first, a test in an
xdist group (its nodeid ends in `@group` under `--dist loadgroup`) ranked as the test itself."""

from __future__ import annotations

from types import SimpleNamespace

import conftest


def ordered(nodeids: list[str]) -> list[str]:
    items = [SimpleNamespace(nodeid=n) for n in nodeids]
    conftest.pytest_collection_modifyitems(None, items)
    return [i.nodeid for i in items]


def test_the_longest_come_first_grouped_or_not():
    first, second = (f"tests/{name}" for name in conftest.LONGEST_FIRST[:2])
    other = "tests/test_other.py::test_short"
    assert ordered([other, second, first]) == [first, second, other]
    assert ordered([other, f"{second}@a-group", first]) == [first, f"{second}@a-group", other]

