"""bcrecord.specs: immutable specs and the one parser of short forms."""

import dataclasses

import pytest

from bcrecord import Attribute, Local, Return, SpecError, parse
from bcrecord.specs import parse_all


@pytest.mark.parametrize(
    "text, expected",
    [
        ("x", Local("x")),
        ("x@1", Local("x", 1)),
        ("x@[0,2]", Local("x", [0, 2])),
        ("x @ [2, 0]", Local("x", (0, 2))),
        ("self.linear1.weight", Attribute("self.linear1.weight")),
        ("self.linear1@0", Attribute("self.linear1", at="load", index=0)),
        ("return", Return()),
    ],
)
def test_short_forms(text, expected):
    assert parse(text) == expected


def test_mmengine_dicts():
    assert parse(dict(type="FunctionRecorder", target="outputs", index=[1])) == Local("outputs", 1)
    assert parse(dict(type="AttributeRecorder", target="self.linear1.weight")) == Attribute(
        "self.linear1.weight"
    )
    assert parse(
        dict(type="FunctionRecorder", model="resnet", method="_forward_impl", target="x", index=[0, 1, 2])
    ) == Local("x", [0, 1, 2])


@pytest.mark.parametrize(
    "bad, message",
    [
        ("x@one", "bad index"),
        ("x@-1", "non-negative"),
        ("x@[]", "must not be empty"),
        ("1x", "identifier"),
        ("self.", "identifier"),
        ("return@1", "takes no index"),
        (dict(type="Nope"), "FunctionRecorder"),
        (dict(type="FunctionRecorder", target="x", extra=1), "unknown keys"),
        (42, "must be Local/Attribute/Return"),
    ],
)
def test_bad_specs_name_the_problem(bad, message):
    with pytest.raises(SpecError, match=message):
        parse(bad)


def test_specs_are_immutable_and_validated():
    spec = Local("x", [3, 1, 3])
    assert spec.index == (1, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "y"
    with pytest.raises(SpecError, match="copy policy"):
        Local("x", copy="shallow")
    with pytest.raises(SpecError, match="at must be"):
        Attribute("self.a", at="exit")
    with pytest.raises(SpecError, match="index applies to at='load'"):
        Attribute("self.a", index=0)
    with pytest.raises(SpecError, match="needs a dot"):
        Attribute("self")
    assert hash(Local("x", 1)) == hash(Local("x", [1]))


def test_parse_all():
    assert parse_all("x") == (Local("x"),)
    assert parse_all(["x@0", Return()]) == (Local("x", 0), Return())
    with pytest.raises(SpecError, match="no specs"):
        parse_all([])
