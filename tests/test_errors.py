"""The exceptions of :mod:`bcrecord.errors`: one base class, and the built-in type each extends.

Callers can catch :class:`BcrecordError` for everything bcrecord raises on purpose,
or the built-in exception that fits (``ValueError`` for a malformed spec...).
"""

import pytest

import bcrecord
from bcrecord.errors import (
    BcrecordError,
    NotPatchableError,
    RecordingWarning,
    SpecError,
    TargetError,
    UnsupportedPythonError,
)


@pytest.mark.parametrize(
    "error, builtin",
    [
        (SpecError, ValueError),
        (TargetError, LookupError),
        (NotPatchableError, TypeError),
        (UnsupportedPythonError, RuntimeError),
    ],
)
def test_each_error_is_a_bcrecord_error_and_its_builtin(error, builtin):
    assert issubclass(error, BcrecordError) and issubclass(error, builtin)
    assert getattr(bcrecord, error.__name__) is error  # exported at the top level


def test_recording_warning_is_a_warning_not_an_error():
    # A warning, so a failed copy is reported without stopping the patched program.
    assert issubclass(RecordingWarning, RuntimeWarning) and not issubclass(RecordingWarning, BcrecordError)
    assert bcrecord.RecordingWarning is RecordingWarning


def f(a):
    x = a
    return x


@pytest.mark.parametrize(
    "specs, error, words",
    [
        (["y"], TargetError, "no assignment to a local named 'y'; assigned locals: x"),
        (["x@3"], TargetError, "has 1 site (index 0..0); there is no index 3"),
        (["x@@"], SpecError, "bad index in 'x@@'"),
    ],
)
def test_bad_specs_raise_the_documented_error(specs, error, words):
    with pytest.raises(error) as caught:
        bcrecord.instrument(f, specs)
    assert words in str(caught.value)
    assert isinstance(caught.value, BcrecordError)


def test_a_builtin_cannot_be_patched():
    with pytest.raises(NotPatchableError, match="len is a builtin or C function"):
        bcrecord.instrument(len, ["x"])
