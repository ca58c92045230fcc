"""The public API's documentation stays complete: every object torch_shards exports is in the
Python API reference (docs/reference/python.md, rendered from the docstrings by mkdocstrings),
has a docstring, and documents each of its parameters in a Google-style ``Args:`` section, as do
the public methods its classes define."""

import inspect
import re
from pathlib import Path

import pytest

import torch_shards as ts

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference" / "python.md"


def documented_args(doc):
    """The names an ``Args:`` section documents (``name:``, ``*args:``, ``**kwargs:``)."""
    lines = inspect.cleandoc(doc).splitlines()
    names, inside, indent = set(), False, None
    for line in lines:
        if not inside:
            inside = line.strip() == "Args:"
            continue
        if line.strip() and not line.startswith(" "):  # the next section
            break
        match = re.match(r"^( +)(\*{0,2}\w+)( \([^)]*\))?:", line)
        if match and (indent is None or len(match.group(1)) == indent):
            indent = len(match.group(1))
            names.add(match.group(2))
    return names


def parameters(function):
    names = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name == "self":
            continue
        prefix = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}.get(parameter.kind, "")
        names.append(prefix + parameter.name)
    return names


def public_callables():
    """(name, object whose docstring documents it, its signature's parameters) for every exported
    function and class, and every public method a class defines itself."""
    for name in ts.__all__:
        obj = getattr(ts, name)
        if inspect.isfunction(obj):
            yield name, obj, parameters(obj)
        elif inspect.isclass(obj):
            init = obj.__dict__.get("__init__")
            if init is not None:  # documented in the class's docstring
                yield name, obj, parameters(init)
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and inspect.isfunction(member):
                    yield f"{name}.{attr}", member, parameters(member)


def test_every_export_is_in_the_reference():
    text = REFERENCE.read_text()
    missing = [name for name in ts.__all__ if f"::: torch_shards.{name}\n" not in text]
    assert not missing, f"{REFERENCE.relative_to(ROOT)} has no `::: torch_shards.<name>` for {missing}"


@pytest.mark.parametrize("name", ts.__all__)
def test_every_export_has_a_docstring(name):
    obj = getattr(ts, name)
    if name == "LIBRARY_PATH":  # a str: its docstring is the attribute's, in torch_shards/_library.py
        assert '"""The path of the native library' in (ROOT / "torch_shards" / "_library.py").read_text()
        return
    assert inspect.getdoc(obj), f"torch_shards.{name} has no docstring"


CALLABLES = list(public_callables())


@pytest.mark.parametrize("name, obj, names", CALLABLES, ids=[name for name, _, _ in CALLABLES])
def test_every_parameter_is_documented(name, obj, names):
    if not names:
        return
    doc = inspect.getdoc(obj) or ""
    undocumented = [parameter for parameter in names if parameter not in documented_args(doc)]
    assert not undocumented, f"torch_shards.{name}: no Args: entry for {undocumented}"
