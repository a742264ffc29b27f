"""Every public name of the package has a docstring, and the README's
quick start is three lines that run."""

from __future__ import annotations

import importlib
import inspect
import pathlib

import pytest

MODULES = [
    "pycell",
    "pycell.client",
    "pycell.aio",
    "pycell.types",
    "pycell.errors",
    "pycell.protocol",
    "pycell.pydantic_ai",
    "pycell.langchain",
    "pycell.openai_agents",
]


def public(module: object) -> list[tuple[str, object]]:
    names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
    found = []
    for name in names:
        obj = getattr(module, name)
        if getattr(obj, "__module__", None) != getattr(module, "__name__", None) and name != "errors":
            continue
        found.append((name, obj))
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and (inspect.isfunction(member) or isinstance(member, property)):
                    found.append((f"{name}.{attr}", member))
    return found


@pytest.mark.parametrize("name", MODULES)
def test_every_public_name_has_a_docstring(name: str) -> None:
    module = importlib.import_module(name)
    assert inspect.getdoc(module), name
    missing = [n for n, obj in public(module) if not inspect.getdoc(obj)]
    assert not missing, f"{name}: no docstring on {missing}"


def test_the_quick_start_is_three_lines() -> None:
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("## Quick start")[1].split("```python\n")[1].split("```")[0]
    lines = [line for line in block.splitlines() if line.strip()]
    assert len(lines) <= 3, lines
