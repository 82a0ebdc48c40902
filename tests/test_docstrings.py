"""Every public function and method of the core has a docstring with an example, and full type hints."""

import importlib
import json
import typing

import pytest

from .docstring_checks import undocumented

CORE = [
    "bcrecord",
    "bcrecord.specs",
    "bcrecord.analysis",
    "bcrecord.rewrite",
    "bcrecord.patch",
    "bcrecord.runtime",
    "bcrecord.listing",
    "bcrecord.storage",
    "bcrecord.runner",
    "bcrecord.cli",
    "bcrecord.errors",
    "bcrecord._versions",
]


@pytest.mark.parametrize("name", CORE)
def test_public_api_has_examples_and_types(name):
    assert undocumented(importlib.import_module(name)) == []


def test_the_check_finds_what_is_missing():
    module = type(importlib)("bcrecord.example")

    def documented(a: int) -> int:
        """Doubled.

        >>> documented(2)
        4
        """
        return 2 * a

    def bare(a, b: int):
        return a

    class Thing(ValueError):
        def method(self, a: int) -> None:
            """No example."""

        @staticmethod
        def static(a):
            """No example, no types."""

        @classmethod
        def make(cls) -> "Thing":
            """>>> 1
            1
            """
            return cls()

        @property
        def size(self) -> int:  # an attribute: left to the class's example
            return 1

        def with_traceback(self, tb):  # a framework's (here the builtin base's) method: its docs
            return self

        def _private(self):
            pass

    class Interface(typing.Protocol):
        def method(self) -> None: ...  # the interface: shown by the class

    for obj in (documented, bare, Thing, Interface):
        obj.__module__ = module.__name__
        setattr(module, obj.__name__, obj)
    module.imported = json.dumps  # defined elsewhere: its own module's
    assert undocumented(module) == [
        "bcrecord.example.bare: an example, a return type, a type for a",
        "bcrecord.example.Thing.method: an example",
        "bcrecord.example.Thing.static: an example, a return type, a type for a",
    ]
