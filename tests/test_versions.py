"""bcrecord._versions: one table per Python version, and nothing else branches on it."""

import dis
import pathlib
import sys

import pytest

from bcrecord import UnsupportedPythonError, _versions


@pytest.mark.parametrize("version", [(3, 10), (3, 11), (3, 12), (3, 13), (3, 14)])
def test_every_supported_version_has_a_complete_table(version):
    table = _versions.current(version)
    assert table.name == f"{version[0]}.{version[1]}"
    assert {"STORE_FAST", "STORE_DEREF"} <= table.stores
    assert table.return_value == "RETURN_VALUE"


def test_current_matches_the_interpreter_and_unknown_versions_fail():
    assert _versions.current().name == f"{sys.version_info[0]}.{sys.version_info[1]}"
    with pytest.raises(UnsupportedPythonError, match="supported: 3.10, 3.11, 3.12, 3.13, 3.14"):
        _versions.current((3, 9))


def test_argument_references_leaves_the_references_that_others_hold():
    # 3.14 passes a local to sys.getrefcount without a reference of its own: code that counted
    # one (the recording's routing, patch's copies) took a held object for a free one there.
    value = object()
    assert sys.getrefcount(value) - _versions.ARGUMENT_REFERENCES == 1  # the local's
    holders = [value, value]
    assert sys.getrefcount(value) - _versions.ARGUMENT_REFERENCES == 3
    assert _versions.ARGUMENT_REFERENCES == (0 if sys.version_info >= (3, 14) else 1)
    del holders


def test_the_table_knows_whether_sys_flags_has_safe_path():
    # runner.safe_path reads the table instead of asking which version this is.
    table = _versions.current()
    assert table.safe_path_flag == hasattr(sys.flags, "safe_path")


def test_probe_sequences_are_stack_neutral():
    table = _versions.current()
    location = None
    effect = sum(
        i.stack_effect() for i in table.call_probe([table.load_local("x", False, location)], 1, location)
    )
    assert effect == 0
    tee = sum(i.stack_effect() for i in table.tee_probe(1, location))
    assert tee == 0


def test_only_the_versions_module_reads_the_python_version():
    package = pathlib.Path(_versions.__file__).parent
    readers = sorted(p.name for p in package.rglob("*.py") if "version_info" in p.read_text())
    assert readers == ["_versions.py"]


@pytest.mark.skipif(sys.version_info[:2] != (3, 10), reason="3.10's line table format")
def test_the_3_10_line_table_is_the_one_cpython_assembles():
    import json
    import types

    from bytecode import ConcreteBytecode

    def codes(code):
        yield code
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from codes(const)

    checked = 0
    for module in (json.decoder, json.encoder, types):
        source = open(module.__file__).read()
        for code in codes(compile(source, module.__file__, "exec")):
            concrete = list(ConcreteBytecode.from_code(code))
            assert _versions.current().line_table(concrete, code.co_firstlineno) == code.co_linetable
            checked += 1
    assert checked > 50


@pytest.mark.skipif(sys.version_info[:2] < (3, 11), reason="3.11+'s locations table")
def test_the_3_11_plus_location_table_is_the_one_cpython_assembles():
    import json
    import types

    from bytecode import ConcreteBytecode

    def codes(code):
        yield code
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from codes(const)

    # Columns past 127, on lines right after another's and far from it, over several lines.
    wide = " " * 130
    lines = [
        "def f(k):",
        "    x = (1 +",
        f"{wide}k(2) +",
        "    k(3))",
        "    y = [k(i)",
        "",
        f"{wide}for i in x]",
    ]
    source = "\n".join(lines) + "\n    return y\n"
    compiled = [(compile(source, "<wide>", "exec"), "<wide>")]
    compiled += [
        (compile(open(m.__file__).read(), m.__file__, "exec"), m.__name__) for m in (json.decoder, types)
    ]
    table = _versions.current()
    checked = 0
    for module, _ in compiled:
        for code in codes(module):
            concrete = list(ConcreteBytecode.from_code(code))
            assert table.line_table(concrete, code.co_firstlineno) == code.co_linetable
            checked += 1
    assert checked > 30
    assert table.own_line_table(ConcreteBytecode.from_code(compiled[0][0].co_consts[0]))
    assert not table.own_line_table(ConcreteBytecode.from_code(compiled[1][0]))


def test_value_op_names_comparisons_unary_operators_and_item_reads_of_this_python():
    from bytecode import Bytecode, Instr

    def ops(x, y):
        a, b = y
        return x == y, x >= 1, -x, +x, ~x, not x, x[0], x + y, x.shape

    table = _versions.current()
    found = [table.value_op(i) for i in Bytecode.from_code(ops.__code__) if isinstance(i, Instr)]
    assert [op for op in found if op] == ["[]", "==", ">=", "unary -", "unary +", "~", "not", "[]"]


def test_the_names_the_runner_reads_module_code_by_are_this_python_s():
    # bcrecord run looks for exec/globals() by name and for `import *` with these.
    table = _versions.current()
    assert table.name_loads <= set(dis.opmap)
    star = [(i.opname, i.argrepr) for i in dis.get_instructions(compile("from os import *", "<m>", "exec"))]
    assert [pair for pair in star if table.star_import in pair]


@pytest.mark.skipif(not hasattr(sys, "monitoring"), reason="sys.monitoring is 3.12+")
def test_local_events_are_carried_to_nested_code_paired_by_name_line_and_order():
    # Two lambdas on one line and a generator expression, in code compiled twice (nested
    # code objects of its own) with the generator's code moved first: each gets its own
    # mate's events; carried back, a change made on the new code (and only that) reaches the old.
    monitoring = sys.monitoring
    line, call = monitoring.events.LINE, monitoring.events.CALL
    text = "def outer():\n    a, b = (lambda: 1), (lambda: 2)\n    return a, b, list(i for i in range(2))\n"

    def compiled():
        (code,) = [c for c in compile(text, "<outer>", "exec").co_consts if hasattr(c, "co_name")]
        return code

    old, new = compiled(), compiled()
    generator = [c for c in new.co_consts if getattr(c, "co_name", "") == "<genexpr>"]
    new = new.replace(co_consts=(*generator, *[c for c in new.co_consts if c not in generator]))

    def nested(code):
        return {
            c.co_consts[-1] if c.co_name == "<lambda>" else c.co_name: c
            for c in code.co_consts
            if hasattr(c, "co_name")
        }

    tool = next(t for t in range(1, 6) if monitoring.get_tool(t) is None)
    monitoring.use_tool_id(tool, "bcrecord-test")
    try:
        monitoring.set_local_events(tool, nested(old)[1], line)
        monitoring.set_local_events(tool, nested(old)["<genexpr>"], call)
        put_in = _versions.carry_local_events(old, new)
        assert monitoring.get_local_events(tool, nested(new)[1]) == line
        assert monitoring.get_local_events(tool, nested(new)[2]) == 0
        assert monitoring.get_local_events(tool, nested(new)["<genexpr>"]) == call
        assert sorted(put_in.values()) == sorted([line, call])
        monitoring.set_local_events(tool, nested(new)[1], 0)  # removed on the code that ran
        monitoring.set_local_events(tool, nested(old)["<genexpr>"], line)  # changed on the original
        _versions.carry_local_events(new, old, put_in)
        assert monitoring.get_local_events(tool, nested(old)[1]) == 0
        assert monitoring.get_local_events(tool, nested(old)["<genexpr>"]) == line
    finally:
        monitoring.free_tool_id(tool)


@pytest.mark.skipif(not hasattr(sys, "monitoring"), reason="sys.monitoring is 3.12+")
def test_nested_code_is_paired_once_per_two_codes_and_held_weakly(monkeypatch):
    # Pairing ran on every recording entered and left while a tool was registered (coverage's
    # sysmon core): 5 nested code objects made entering a recording 3 times slower.
    import gc
    import weakref

    import bcrecord

    def outer(x):
        w = x * 2
        a, b = (lambda: 1), (lambda: 2)
        return w, a, b, list(i for i in range(2))

    found = []
    pairs = _versions._nested_pairs

    def counted(old, new, where):
        if not where and "outer" in (old.co_name, new.co_name):  # (not the nested code's)
            found.append((old, new))
        return pairs(old, new, where)

    monkeypatch.setattr(_versions, "_nested_pairs", counted)
    monitoring = sys.monitoring
    tool = next(t for t in range(1, 6) if monitoring.get_tool(t) is None)
    monitoring.use_tool_id(tool, "bcrecord-test")
    try:
        with bcrecord.patch_function(outer, "w", name="m") as patch:
            for _ in range(3):
                with bcrecord.recording() as rec:
                    outer(1)
            assert rec["m:outer:w@0"] == 2
            probed = weakref.ref(patch.code)
        assert len(found) == 2  # (original to probed, and back)
        del found[:]
        gc.collect()
        assert probed() is None  # (frees its sites: see runtime.hold_sites)
        assert not [key for key in _versions._PAIRED if key[1] == id(outer.__code__)]
    finally:
        monitoring.free_tool_id(tool)
