"""The torch layer's public functions and methods have a docstring with an example, and full type hints."""

import importlib

import pytest

from ..docstring_checks import undocumented

pytest.importorskip("matplotlib")  # bcrecord.viz; py311-torch has it


@pytest.mark.parametrize(
    "name",
    [
        "bcrecord.torch",
        "bcrecord.torch.record",
        "bcrecord.torch.extractor",
        "bcrecord.torch.targets",
        "bcrecord.torch.copies",
        "bcrecord.viz",
        "bcrecord.demo",
        "bcrecord.demo_model",
    ],
)
def test_public_api_has_examples_and_types(name):
    assert undocumented(importlib.import_module(name)) == []
