"""The CPU target's fixed text, kept as files in ``c/`` (package data) so that editors,
compilers and clang-format read it as what it is:

    text = static_text("runtime.c")                       # c/runtime.c as it is
    makefile = render("Makefile", ALL="...", CLEAN="...")  # c/templates/Makefile filled

``c/*.c`` are whole C files that compile on their own (against ``vdla_cpu.h`` beside this
module, and ``loader.c`` against a written ``vdla_model.h``). ``c/templates/*`` hold the
text of the stand-alone project and the whole-graph runner with ``@NAME@`` placeholders
(upper-case letters, digits and _) for the parts that depend on the model; each template
is named as the file it becomes, except ``runner.c`` (the end of ``model.c``) and
``program.mk`` (one program's rule at the end of the Makefile). The code generated per
layer stays in Python.

``@NAME@`` rather than `string.Template`'s ``$name``: Makefiles are full of ``$(...)``
and ``$@``, which would all need escaping.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib.resources import files

__all__ = ["PLACEHOLDER", "TemplateError", "placeholders", "render", "static_text",
           "template_text"]

#: A placeholder in a template: ``@NAME@``.
PLACEHOLDER = re.compile(r"@([A-Z][A-Z0-9_]*)@")


class TemplateError(ValueError):
    """A template rendered with a placeholder left unfilled or a value it has no place
    for."""


@lru_cache(maxsize=None)
def static_text(name: str) -> str:
    """The text of ``c/<name>`` (read once per process).

    name : a file name in ``c/``, such as ``"runtime.c"``
    """
    return (files(__package__) / "c" / name).read_text()


@lru_cache(maxsize=None)
def template_text(name: str) -> str:
    """The unrendered text of template ``c/templates/<name>`` (read once per process).

    name : a file name in ``c/templates/``, such as ``"Makefile"``
    """
    return (files(__package__) / "c" / "templates" / name).read_text()


def placeholders(text: str) -> set[str]:
    """The placeholder names (without the @) in `text`."""
    return set(PLACEHOLDER.findall(text))


def render(name: str, **values: str | int) -> str:
    """Template `name` (in ``c/templates/``) with each ``@KEY@`` replaced by ``values[KEY]``.

    name : the template's file name
    values : one str (or int, written in decimal) per placeholder of the template, by its
        name; a value is inserted as it is (in one pass: an ``@X@`` inside a value stays)

    Raises `TemplateError` when the template has a placeholder with no value, or a value
    names no placeholder of the template (a misspelt key must not go unnoticed).
    """
    text = template_text(name)
    wanted = placeholders(text)
    problems = []
    if missing := sorted(wanted - values.keys()):
        problems.append("no value for " + ", ".join(f"@{key}@" for key in missing))
    if unknown := sorted(values.keys() - wanted):
        problems.append("values for placeholders it does not have: " + ", ".join(unknown))
    if problems:
        raise TemplateError(f"template {name!r}: " + "; ".join(problems))
    for key, value in values.items():
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise TypeError(f"template {name!r}: the value of @{key}@ must be str or int, "
                            f"not {type(value).__name__}")
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), text)
