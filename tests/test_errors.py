"""The exceptions of :mod:`bcrecord.errors`: one base class, and the built-in type each extends.

Callers can catch :class:`BcrecordError` for everything bcrecord raises on purpose,
or the built-in exception that fits (``ValueError`` for a malformed spec...).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import warnings

import pytest

import bcrecord
from bcrecord.errors import (
    BcrecordError,
    NotPatchableError,
    RecordingWarning,
    SpecError,
    TargetError,
    UnsupportedPythonError,
    pass_through,
    warn,
)

from .commands import plain


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


def test_a_warning_points_past_the_files_marked_as_passing_a_call_through(tmp_path):
    # (torch's Module.__call__ is one: the torch layer marks it.)
    relay = str(tmp_path / "relay.py")
    namespace: dict = {"warn": warn}
    exec(compile("def relay(message):\n    warn(message)\n", relay, "exec"), namespace)

    def warned_at():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            namespace["relay"]("told"); line = sys._getframe().f_lineno  # fmt: skip
        return [(w.filename, w.lineno) for w in caught], line

    found, _ = warned_at()
    assert found == [(relay, 2)]
    pass_through(relay)
    found, line = warned_at()
    assert found == [(__file__, line)]


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


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: bcrecord.recording(copy="x"), "unknown copy policy 'x'"),
        (lambda: bcrecord.recording(keep=0), "keep must be 'all', 'last' or a positive int, got 0"),
        # More than a ring buffer can hold: refused, not every value silently lost.
        (lambda: bcrecord.recording(keep=10**30), f"keep={10**30} is more values than a key can hold"),
        (lambda: bcrecord.recording(threads="x"), "threads must be 'context' or 'all', got 'x'"),
        (lambda: bcrecord.instrument(f, ["x"], name=5), "name must be a string or a callable"),
        # Its keys, 'a:b:f:x@0', read as owner 'a' and function 'b'.
        (lambda: bcrecord.patch_function(f, ["x"], name="a:b"), "name 'a:b' holds ':', which separates"),
        (lambda: bcrecord.record_locals(), "record_locals needs at least one local name or spec"),
        (lambda: bcrecord.set_probe_style("fast"), "unknown probe style 'fast'"),
    ],
)
def test_bad_options_raise_a_spec_error(call, words):
    with pytest.raises(SpecError, match=re.escape(words)):
        call()


def test_a_builtin_cannot_be_patched():
    with pytest.raises(NotPatchableError, match="len is a builtin or C function"):
        bcrecord.instrument(len, ["x"])


def test_what_cannot_be_patched_says_what_to_patch_instead():
    import functools

    class Model:
        def forward(self, x):
            out = x
            return out

        @property
        def size(self):
            n = 1
            return n

    class Callable:
        def __call__(self, x):
            y = x
            return y

    def g(a, b):
        c = a
        return c

    cases = [
        (Model, "Model is a class: patch one of its methods, e.g. patch_method(Model, 'forward', specs)"),
        (Callable(), "is a callable Callable object: patch its class's __call__"),
        (
            functools.partial(g, 1),
            "a functools.partial of test_what_cannot_be_patched_says_what_to_patch_instead.<locals>.g: patch",
        ),
        (functools.partialmethod(g, 1), "a functools.partialmethod of"),
        (
            functools.singledispatchmethod(g),
            "g is a functools.singledispatchmethod: patch the implementation that runs",
        ),
        (Model.__dict__["size"], "size is a property: patch its getter"),
        (json.JSONDecoder, "e.g. patch_method(JSONDecoder, 'decode', specs)"),  # no forward there
        (dict.get, "dict.get is a builtin or C function"),
    ]
    for obj, message in cases:
        with pytest.raises(NotPatchableError, match=re.escape(message)):
            bcrecord.patch_function(obj, "out")
    with pytest.raises(bcrecord.SpecError, match="specs must be a spec or a list of specs, got None"):
        bcrecord.patch_function(g, None)


@pytest.mark.parametrize(
    "module, extra",
    [
        ("bcrecord.torch", "torch"),
        ("bcrecord.integrations.mmengine", "mmengine"),
        ("bcrecord.integrations.lightning", "lightning"),
    ],
)
def test_a_layer_whose_framework_is_missing_says_which_extra_to_install(module, extra):
    # A fresh interpreter where torch and the frameworks cannot be imported, installed or not.
    blocked = ["torch", "lightning", "pytorch_lightning", "mmengine"]
    program = (
        f"import sys; sys.modules.update(dict.fromkeys({blocked!r}))\n"
        f"try:\n    import {module}\nexcept ImportError as error:\n    print(type(error).__name__, error)\n"
    )
    result = plain("-c", program)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("ImportError bcrecord"), result.stdout
    assert f"pip install 'bcrecord[{extra}]'" in result.stdout


def test_aligned_columns_are_as_wide_as_a_terminal_shows_their_cells():
    from bcrecord.errors import aligned

    # A wide character (CJK, an emoji) takes two columns, a combining mark none.
    rows = [("key", "n"), ("日本", "1"), ("🙂", "2"), ("e\u0301", "3")]
    assert aligned(rows) == ["key   n", "日本  1", "🙂    2", "e\u0301     3"]
    # On a stream that writes what it lacks escaped, the escapes are what is measured.
    assert aligned(rows[:2], "ascii") == ["key           n", "\\u65e5\\u672c  1"]


def test_shell_quoted_names_the_same_file_once_pasted():
    import shlex

    from bcrecord.errors import shell_quoted

    assert shlex.split(shell_quoted("runs/a b'c")) == ["runs/a b'c"]
    # Bytes no text holds (surrogate-escaped), a newline, what an ASCII stream would escape: $'...'.
    assert shell_quoted("bad\udcff'\\") == "$'bad\\xff\\x27\\x5c'"
    assert shell_quoted("a\nb") == "$'a\\x0ab'"
    assert shell_quoted("ñ", "ascii") == "$'\\xc3\\xb1'" and shell_quoted("ñ", "utf-8") == "'ñ'"


@pytest.mark.skipif(sys.platform == "win32" or not shutil.which("bash"), reason="bash, and bytes names")
def test_shell_quoted_names_the_file_s_bytes_where_the_stream_writes_other_bytes_for_its_name():
    from bcrecord.errors import shell_quoted

    # A latin-1 stream writes 'ñ' as the one byte 0xf1; the file's name is UTF-8's two (0xc3 0xb1).
    name = "runs/dir ñ"
    for encoding in ("latin-1", "utf-8", "ascii"):
        printed = shell_quoted(name, encoding).encode(encoding, "backslashreplace")
        pasted = subprocess.run(["bash", "-c", b"printf %s " + printed], capture_output=True).stdout
        assert pasted == os.fsencode(name), encoding
    if sys.getfilesystemencoding() == "utf-8":
        assert shell_quoted(name, "latin-1") == "$'runs/dir \\xc3\\xb1'"


def test_a_private_name_typed_without_its_underscore_is_offered_first():
    # 'forward_impl' was offered 'forward' alone: private names were hidden from a word
    # without '_', though ResNet's '_forward_impl' is the one meant.
    from bcrecord.errors import did_you_mean

    class Net:
        def forward(self, x):
            return self._forward_impl(x)

        def _forward_impl(self, x):
            y = x + 1
            return y

    with pytest.raises(bcrecord.NotPatchableError) as caught:
        bcrecord.patch_method(Net, "forward_impl", "y")
    said = "has no attribute 'forward_impl'; did you mean '_forward_impl', 'forward'?"
    assert str(caught.value).endswith(said)
    # Only where the word is the name but for its leading underscores; others stay hidden.
    assert did_you_mean("forwrd", ["forward", "_forward"]) == "; did you mean 'forward'?"
