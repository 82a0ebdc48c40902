"""bcrecord.specs: immutable specs and the one parser of short forms."""

import dataclasses
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

import bcrecord
from bcrecord import Attribute, Call, Expr, Local, Return, SpecError, instrument, parse, recording
from bcrecord.specs import parse_all, split_specs

from .typed_text import CHAINS, INDICES, JSON, SETTINGS, TYPED, specs_and_short_forms


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
    "recorder, expected",
    [
        (dict(target="self.linear1()"), Call("self.linear1")),
        (dict(target="torch.stack()", index=[1, 0]), Call("torch.stack", (0, 1))),
        (dict(target="+"), Expr("+")),
        (dict(target="+=", index=2, copy="detach"), Expr("+=", 2, copy="detach")),
        (dict(target="@", index=[0]), Expr("@", 0)),  # the operator, not an index
        (dict(target="self.linear1", index=[0]), Attribute("self.linear1", at="load", index=0)),
        (dict(target="self.linear1"), Attribute("self.linear1", at="load")),
        (dict(target="self.linear1", at="load"), Attribute("self.linear1", at="load")),
        (dict(target="return", copy="none"), Return(copy="none")),
        (dict(target="outputs", at="load"), Local("outputs")),  # the default, given: nothing more
        (dict(target=" outputs ", index=[1]), Local("outputs", 1)),
    ],
)
def test_a_function_recorder_target_is_any_short_form_with_its_index_in_index(recorder, expected):
    assert parse(dict(type="FunctionRecorder", **recorder)) == expected


@pytest.mark.parametrize(
    "recorder, message",
    [
        (dict(target="return", index=[3]), "target='return': a return spec takes no index"),
        (dict(target="return@3"), "'return@3': a return spec takes no index"),
        (dict(target="outputs@1"), "in 'index': write target='outputs', index=[1]"),
        (dict(target="self.fc()@[0,2]"), "in 'index': write target='self.fc()', index=[0, 2]"),
        (dict(target="+@0", index=[1]), "in 'index': write target='+', index=[0]"),
        (dict(target="x y"), "cannot parse spec 'x y'"),
        (dict(target="torch.stack()", index=[-1]), "non-negative"),
        (
            dict(target="self.linear1", at="entry"),
            "target='self.linear1': 'at' is for type='AttributeRecorder'",
        ),
        (dict(target="outputs", at="entry"), "target='outputs': 'at' is for type='AttributeRecorder'"),
    ],
)
def test_a_function_recorder_target_that_cannot_be_recorded_says_what_to_write(recorder, message):
    with pytest.raises(SpecError) as caught:
        parse(dict(type="FunctionRecorder", **recorder))
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "bad, message",
    [
        ("x@one", "bad index"),
        ("x@-1", "non-negative"),
        ("x@[]", "must not be empty"),
        ("1x", "identifier"),
        ("self.", "identifier"),
        ("return@1", "takes no index"),
        # A subscript or a call written in a target: what to record instead.
        ("self.layers[0]()", r"callee of a call site is a name or a chain .* or 'self.layers@0' where it is"),
        ("outputs[0]", r"'outputs\[0\]': a target is a name or a chain .*, or 'outputs'$"),
        ("self.fc(x)", r"'self.fc\(x\)': a call site is written without its arguments: 'self.fc\(\)'"),
        ("len(x, 2)", r"without its arguments: 'len\(\)'"),
        ("len(x, 2)@1", r"^'len\(x, 2\)@1': a call site is written without its arguments: 'len\(\)@1'$"),
        # Without spaces it was told 'f()', which records every site, not site 1.
        ("f(x)@1", r"^'f\(x\)@1': a call site is written without its arguments: 'f\(\)@1'$"),
        ("self.fc(g(x))@[0,1]", r"without its arguments: 'self.fc\(\)@\[0,1\]'$"),
        # Told the fix of both: 'f(x)@1' was refused next for its arguments.
        ("f(x)@01", r"^bad index in 'f\(x\)@01': a leading zero is not accepted: write 'f\(\)@1'$"),
        # (not 'f()@1' for a chain of calls: another site; the chain is refused as such next)
        (
            "f(x).g()@01",
            r"^bad index in 'f\(x\).g\(\)@01': a leading zero is not accepted: write 'f\(x\).g\(\)@1'$",
        ),
        ("f(x)@-1", r"^bad index in 'f\(x\)@-1': an index is a non-negative int"),  # (not told 'f()@-1')
        ("f().g()", r"no call's result \(f\(\).g\) in code; .*, or the call 'f\(\)'"),
        ("super().__init__()", r"^'super\(\).__init__\(\)': super\(\) is no call site, nor is a method "),
        ("<@0", r"'<' is an operator bcrecord does not record \(comparisons"),
        ("==", r"'==' is an operator bcrecord does not record"),
        (dict(type="Nope"), "FunctionRecorder"),
        (dict(type="FunctionRecorder", target="x", extra=1), "unknown keys"),
        (dict(type="FunctionRecorder", target="x", idx=1), r"\['idx'\] .*; did you mean 'index'\?"),
        # Keys of mixed types (a YAML config's 1:) are listed, not compared with each other.
        (
            {"type": "FunctionRecorder", "idx": 1, 1: 2},
            r"unknown keys \['idx', 1\] .*; did you mean 'index'\?",
        ),
        (42, "must be Local/Attribute/Return"),
    ],
)
def test_bad_specs_name_the_problem(bad, message):
    with pytest.raises(SpecError, match=message):
        parse(bad)


@pytest.mark.parametrize(
    "typo, message",
    [
        ("x@", "'x@': '@' is followed by an index: 'x@0', 'x@[0,2]', or 'x' for every one"),
        ("self.fc()@ ", "'self.fc()@ ': '@' is followed by an index: 'self.fc()@0', 'self.fc()@[0,2]', or"),
        (
            "x@-1",
            "bad index in 'x@-1': an index is a non-negative int: sites are counted from 0 in source order",
        ),
        (
            "x@1@2",
            "bad index in 'x@1@2': expected an int or a list like [0,2]; several sites are one list: "
            "'x@[1,2]'",
        ),
        ("out@1, 3", "several sites are one list: 'out@[1,3]'"),
        ("x@1@02", "several sites are one list: 'x@[1,2]'"),
        # A key or a target (patch_method's keys, a torch or `bcrecord run` target) given as a spec.
        (
            "Net:forward:h@1",
            "'Net:forward:h@1' is a key or a target, '<owner>:<method>:<spec>': where a spec "
            "goes, give the spec alone: 'h@1'",
        ),
        ("layer1.0:forward:self.fc()", "give the spec alone: 'self.fc()'"),
        ("forward:return", "give the spec alone: 'return'"),
        # JSON refuses a leading zero; the message says so, with the index to write.
        ("x@01", "bad index in 'x@01': a leading zero is not accepted: write 'x@1'"),
        ("x@00", "a leading zero is not accepted: write 'x@0'"),
        ("x@[0, 02]", "a leading zero is not accepted: write 'x@[0, 2]'"),
        ("self.fc()@01", "a leading zero is not accepted: write 'self.fc()@1'"),
        ("+@007", "a leading zero is not accepted: write '+@7'"),
        (
            dict(type="FunctionRecorder", target="x@01"),
            "target='x@01': a dict gives its index in 'index': write target='x', index=[1]",
        ),
        (dict(type="FunctionRecorder", target="+@[0,02]"), "write target='+', index=[0, 2]"),
        (
            "x\uff201",
            "a local's name must be a Python identifier, got 'x\uff201'; 'x\uff201' has full-width "
            "characters: write 'x@1'",
        ),
        ("x@\uff10", "'x@\uff10' has full-width characters: write 'x@0'"),
        ("self.fc\uff08\uff09", "has full-width characters: write 'self.fc()'"),
        # Full-width and padded: the ASCII form's own message says what to write.
        ("x@\uff10\uff11", "has full-width characters, and in ASCII: bad index in 'x@01': a leading zero"),
        ("x@\uff10\uff11", "write 'x@1'"),
    ],
)
def test_the_likeliest_typos_are_told_the_form_to_write(typo, message):
    with pytest.raises(SpecError) as caught:
        parse(typo)
    assert message in str(caught.value)


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
    # The short form's parentheses given to the class ("each part ... got 'fc()'"): say what to write.
    with pytest.raises(
        SpecError, match=r"without its parentheses: Call\('self.fc'\), or parse\('self.fc\(\)'\)"
    ):
        Call("self.fc()")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Attribute("self.fc()"), "'self.fc()': a call site is recorded with Call('self.fc') "),
        (lambda: Attribute("self.fc ( )"), "'self.fc ( )': a call site is recorded with Call('self.fc') "),
        (lambda: Local("f()"), "'f()': a call site is recorded with Call('f') "),
        (
            lambda: parse(dict(type="AttributeRecorder", target="self.fc()")),
            "'self.fc()': a call site is recorded with Call('self.fc') (short form 'self.fc()', a "
            "FunctionRecorder's target too), not as a local or an attribute",
        ),
    ],
)
def test_a_call_without_arguments_given_as_a_local_or_an_attribute_is_told_call(make, message):
    # Was "'self.fc()': a call site is written without its arguments: 'self.fc()'": to write
    # what was written, which the class (or an AttributeRecorder) refuses again.
    with pytest.raises(SpecError) as caught:
        make()
    assert str(caught.value).startswith(message)
    assert parse("self.fc()") == Call("self.fc") and parse(dict(type="FunctionRecorder", target="self.fc()"))


@pytest.mark.parametrize(
    "text, message",
    [
        ("self.fc ( )", "'self.fc ( )': a call site is written without spaces: 'self.fc()'"),
        ("self . fc()", "'self . fc()': a call site is written without spaces: 'self.fc()'"),
        ("self.fc ( )@1", "'self.fc ( )@1': a call site is written without spaces: 'self.fc()@1'"),
    ],
)
def test_a_call_in_a_spec_s_short_form_is_told_the_short_form_that_parses(text, message):
    # 'self.fc ( )' given as a spec was told "a call site is recorded with Call('self.fc') ..., not
    # as a local or an attribute" (it was given as neither).
    with pytest.raises(SpecError) as caught:
        parse(text)
    assert str(caught.value) == message
    assert parse(message.rpartition(" ")[2].strip("'")) == Call("self.fc", 1 if "@" in text else None)


@pytest.mark.parametrize("make", [lambda: parse("self . fc(x)"), lambda: Local("self . fc(x)")])
def test_a_call_with_spaces_in_its_callee_and_arguments_is_told_a_short_form_that_parses(make):
    # 'self . fc(x)' was told 'self . fc()', which is refused again.
    with pytest.raises(SpecError) as caught:
        make()
    assert str(caught.value) == "'self . fc(x)': a call site is written without its arguments: 'self.fc()'"
    assert parse("self.fc()") == Call("self.fc")


def test_parse_all():
    assert parse_all("x") == (Local("x"),)
    assert parse_all(["x@0", Return()]) == (Local("x", 0), Return())
    with pytest.raises(SpecError, match="no specs"):
        parse_all([])


class _BoolScalar:  # numpy's np.True_, a bool tensor's element: __index__ gives 1
    dtype = "bool"

    def __index__(self):
        return 1

    def __repr__(self):
        return "a bool array's element"


@pytest.mark.parametrize(
    "index, told",
    [
        (1.0, "an index is a non-negative int or a list of them, got 1.0"),
        ("1", "an index is a non-negative int or a list of them, got '1'"),
        ([1.5], "an index must be a non-negative int, got 1.5"),
        ([True], "an index must be a non-negative int, got True"),
        ([_BoolScalar()], "an index must be a non-negative int, got a bool array's element"),
    ],
)
def test_an_index_that_is_no_int_is_a_spec_error(index, told):
    with pytest.raises(SpecError, match=re.escape(told)):
        Local("x", index)


@pytest.mark.parametrize(
    "index, kept",
    [(3, (3,)), ((0, 2), (0, 2)), ((2, 0, 2), (0, 2)), ([4, 1], (1, 4)), ((5,), (5,)), (range(2), (0, 1))],
)
def test_an_index_is_kept_as_its_ints_sorted_once_each(index, kept):
    # An int, and a tuple already sorted (a spec copied from another), are taken as they are.
    assert Local("x", index).index == kept
    assert dataclasses.replace(Local("x", index), copy="none").index == kept


@pytest.mark.parametrize("index", [(True,), (1, -1), (-1, 2), (2, 2.0), (0, False)])
def test_an_index_tuple_that_only_looks_sorted_is_checked_as_any(index):
    with pytest.raises(SpecError, match="an index must be a non-negative int"):
        Local("x", index)


def test_an_index_takes_any_integer_type():
    class Numpy64:  # what numpy's integers have: __index__, and no int base class
        def __index__(self):
            return 2

    class IntArray:  # what an integer array has: __index__ too, which fails unless one element
        def __index__(self):
            raise TypeError("only integer scalar arrays can be converted to a scalar index")

        def __len__(self):
            return 2

        def __iter__(self):
            return iter([Numpy64(), 0])

    assert Local("x", Numpy64()).index == (2,) and Local("x", [Numpy64(), 0]).index == (0, 2)
    assert Local("x", IntArray()).index == (0, 2)


def test_bytes_as_specs_are_refused_as_bytes_not_as_numbers():
    with pytest.raises(SpecError, match=r"specs are text: give a str, not b'x'"):
        parse_all(b"x")


@pytest.mark.parametrize("op", [1, None, ["+"]])
def test_an_operator_that_is_no_string_is_a_spec_error(op):
    with pytest.raises(SpecError, match=r"an operator must be a string such as '\+', got "):
        Expr(op)


def test_a_name_is_matched_as_the_compiler_stores_it_nfkc_normalised():
    # Source text '\ufb01' (a ligature) and '\u212b' (the angstrom sign) are 'fi' and '\xc5' in the code.
    namespace: dict = {}
    exec("def f(a):\n    \ufb01 = a.\u212b + 1\n    return \ufb01\n", namespace)
    assert parse("\ufb01@0") == Local("fi", 0)
    assert parse("a.\u212b@0") == Attribute("a.\xc5", at="load", index=0)
    assert Call("a.\u212b").target == "a.\xc5"

    class A:
        pass

    value = A()
    setattr(value, "\xc5", 2)
    recorded = instrument(namespace["f"], ["\ufb01@0", "a.\u212b@0"], name="n")
    with recording() as rec:
        assert recorded(value) == 3
    assert rec["n:f:fi@0"] == 3 and rec["n:f:a.\xc5@0"] == 2


@pytest.mark.parametrize("text", ["outputs,self.scale", "outputs self.scale", "outputs, self.scale"])
def test_several_specs_in_one_string_are_refused_with_the_list_to_give(text):
    with pytest.raises(SpecError, match=r"holds 2 specs: give each on its own, \['outputs', 'self.scale'\]"):
        parse(text)
    with pytest.raises(SpecError, match=r"\['outputs', 'self.scale'\]"):
        bcrecord.patch_method(_Scaled(), "forward", text)
    assert split_specs("x@[0, 2]") is None and parse("x@[0, 2]") == Local("x", [0, 2])


class _Scaled:
    scale = 3

    def forward(self, inputs):
        outputs = inputs * self.scale
        return outputs


# --- properties: every spec's short form parses back; any text parses or names the problem ---


_SPECS = (Local, Attribute, Return, Call, Expr)


@SETTINGS
@given(specs_and_short_forms(), st.sampled_from(["{}", " {} ", "\t{}\n"]))
def test_property_every_spec_s_short_form_parses_back_to_it(spec_and_text, around):
    spec, text = spec_and_text
    assert parse(around.format(text)) == spec
    assert parse_all([text, text]) == (spec, spec)
    assert split_specs(text) is None  # one spec: not split


@SETTINGS
@given(specs_and_short_forms())
def test_property_a_function_recorder_dict_gives_the_short_form_s_index_in_index(spec_and_text):
    spec, text = spec_and_text
    bare, _, index = text.partition("@") if not isinstance(spec, Expr) else (spec.op, "", "")
    given_index = None if isinstance(spec, Return) else spec.index
    recorder = dict(
        type="FunctionRecorder", target=bare, index=None if given_index is None else list(given_index)
    )
    expected = Attribute(spec.target, at="load", index=given_index) if isinstance(spec, Attribute) else spec
    assert parse(recorder) == expected


@SETTINGS
@given(CHAINS, st.sampled_from(["entry", "load"]), INDICES)
def test_property_an_attribute_recorder_dict_is_the_attribute_spec(chain, at, index):
    recorder = dict(type="AttributeRecorder", target=chain, at=at, index=index)
    if at == "entry" and index is not None:
        with pytest.raises(SpecError, match="index applies to at='load' only"):
            parse(recorder)
    else:
        assert parse(recorder) == Attribute(chain, at=at, index=index)


@SETTINGS
@given(TYPED)
def test_property_any_text_is_a_spec_or_a_spec_error_that_names_it(text):
    try:
        spec = parse(text)
    except SpecError as error:
        assert str(error)
        several = split_specs(text)
        if several is not None:  # each part is a spec of its own, and the message lists them
            assert [type(parse(part)) in _SPECS for part in several] == [True] * len(several)
            assert repr(several) in str(error)
    else:
        assert isinstance(spec, _SPECS)
        assert parse(spec) is spec


@SETTINGS
@given(st.dictionaries(st.sampled_from(["type", "target", "index", "copy", "at", "name", "idx", 1]), JSON))
def test_property_any_dict_is_a_spec_or_a_spec_error(recorder):
    recorder.setdefault("type", "FunctionRecorder")
    try:
        spec = parse(recorder)
    except SpecError as error:
        assert str(error)
    else:
        assert isinstance(spec, _SPECS)


@SETTINGS
@given(st.one_of(JSON, st.lists(TYPED, max_size=3)))
def test_property_any_json_value_given_as_specs_is_specs_or_a_spec_error(value):
    try:
        specs = parse_all(value)
    except SpecError as error:
        assert str(error)
    else:
        assert specs and all(isinstance(spec, _SPECS) for spec in specs)


@SETTINGS
@given(TYPED)
def test_property_a_spec_refused_leaves_the_function_as_it_was(text):
    def area(w, h):
        a = w * h
        return a

    code = area.__code__
    try:
        with bcrecord.patch_function(area, [text]):
            pass
    except bcrecord.BcrecordError as error:
        assert str(error)
    assert area.__code__ is code and area(2, 3) == 6
