"""What to record: small immutable spec values, and the one parser of short forms.

A spec names a value inside a function without saying how it is found:

>>> Local("x", 1)
Local(name='x', index=(1,), copy=None)
>>> parse("self.linear1.weight")
Attribute(target='self.linear1.weight', at='entry', index=None, copy=None)

Every public entry point accepts a spec, a short-form string or an MMEngine-style
dict, and turns it into a spec with :func:`parse`.
"""

from __future__ import annotations

import dataclasses
import json
import keyword
import operator
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence, Tuple, Type, Union, cast

from .errors import SpecError, did_you_mean

__all__ = [
    "Local",
    "Attribute",
    "Return",
    "Call",
    "Expr",
    "OPERATORS",
    "Spec",
    "SpecLike",
    "COPY_POLICIES",
    "parse",
    "parse_all",
    "split_specs",
    "full_width_fixed",
    "require_bool",
]

#: Copy policies a recording or a spec may ask for.
COPY_POLICIES = ("clone", "detach", "deepcopy", "none")

Index = Union[int, Sequence[int], None]
#: A spec's copy policy: one of :data:`COPY_POLICIES`, a callable that makes the value to
#: keep, or None (the recording's own).
Copy = Union[str, Callable[[Any], Any], None]


#: Why neither super() nor a method called through it is a call site, and what to record instead.
SUPER_NO_CALL = (
    "super() is no call site, nor is a method called through it: from 3.12 one "
    "instruction loads the method through super(); record what it returns where it "
    "is assigned to a local or returned ('return')"
)


def _index(value: Index) -> tuple[int, ...] | None:
    """Normalise an index argument to a sorted tuple of ints, or None for 'all'."""
    if value is None:
        return None
    # (The usual ones, made by bcrecord itself for each key: a plain int, and an index already
    # normalised, given to a copy of its spec. Told apart in C; the checks below cost 2 us.)
    if type(value) is int and value >= 0:
        return (value,)
    if type(value) is tuple and value and all(type(item) is int for item in value) and value[0] >= 0:
        if all(a < b for a, b in zip(value, value[1:], strict=False)):
            return value
    # One int (numpy's, a 0-d tensor's too), or several (a list, an array: those have a length).
    one = hasattr(value, "__index__") and not _has_length(value)
    if not one and (isinstance(value, (str, bytes)) or not hasattr(value, "__iter__")):
        raise SpecError(f"an index is a non-negative int or a list of them, got {value!r}")
    given: Tuple[Any, ...] = (value,) if one else tuple(cast(Sequence[int], value))
    items = tuple(_one_index(item) for item in given)
    if not items:
        raise SpecError("an index list must not be empty (use None for every one)")
    return tuple(sorted(set(items)))


def _has_length(value: Any) -> bool:
    try:
        len(value)
    except TypeError:
        return False
    return True


def _one_index(item: Any) -> int:
    try:
        boolean = isinstance(item, bool) or "bool" in str(getattr(item, "dtype", ""))  # a bool array's
        number = None if boolean else operator.index(item)
    except TypeError:  # a float, a float array's element
        number = None
    if number is None or number < 0:
        raise SpecError(f"an index must be a non-negative int, got {item!r}")
    return number


def _copy(value: Any) -> Copy:
    # A policy name, or a callable that makes the value to keep (plug-ins use these).
    if value is not None and not callable(value) and value not in COPY_POLICIES:
        raise SpecError(f"unknown copy policy {value!r}; choose one of {COPY_POLICIES} or a callable")
    return value


def require_bool(name: str, value: Any, error: Type[Exception] = SpecError) -> bool:
    """``value`` if it is True or False (or 1 / 0); else an ``error`` (a :class:`SpecError`) naming ``name``.

    >>> require_bool("grad", True)
    True
    >>> require_bool("grad", "no")
    Traceback (most recent call last):
    bcrecord.errors.SpecError: grad is True or False, got 'no'
    >>> require_bool("quiet", None, error=TypeError)
    Traceback (most recent call last):
    TypeError: quiet is True or False, got None
    """
    try:
        taken = value in (True, False)
    except (RuntimeError, ValueError):  # (a tensor or array of several elements has no truth value)
        taken = False
    if not taken:
        raise error(f"{name} is True or False, got {value!r}")
    return bool(value)


def _identifier(name: object, what: str) -> str:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise SpecError(f"{what} must be a Python identifier, got {name!r}")
    return compiled_name(name)


_DOTTED = re.compile(r"^\s*(?P<callee>[^\W\d]\w*(?:\s*\.\s*[^\W\d]\w*)*)\s*\(.*\)\s*$", re.DOTALL)


def _names(target: str, what: str, call: bool = False, short: bool = False) -> str:
    """``target`` (dotted names), each name spelt as compiled; a subscript or a call written
    in it gets an error that says what to record instead (``call``: ``target`` is a callee;
    ``short``: a spec's short form, where ``'f()'`` is a call site)."""
    written = f"{target}()" if call else target
    call_text = _DOTTED.match(target)
    callee = "" if call_text is None else re.sub(r"\s", "", call_text.group("callee"))
    if call_text is not None and short and re.sub(r"\s", "", target) == f"{callee}()":
        raise SpecError(f"{written!r}: a call site is written without spaces: '{callee}()'")
    if call_text is not None and not call and re.sub(r"\s", "", target) == f"{callee}()":
        # (no arguments to leave out: the short form given to Local or Attribute, or an AttributeRecorder)
        raise SpecError(
            f"{written!r}: a call site is recorded with Call({callee!r}) (short form '{callee}()', a "
            "FunctionRecorder's target too), not as a local or an attribute"
        )
    if call_text is not None and not call:
        raise SpecError(f"{written!r}: a call site is written without its arguments: '{callee}()'")
    if "[" in target or "(" in target:
        root, bracket = re.split(r"([\[(])", target, maxsplit=1)[:2]
        root = root.strip().rstrip(".").strip()
        if bracket == "(" and root and root != "super":  # (super().m is no call site)
            instead = f", or the call '{root}()'"
        elif bracket == "[" and root:
            instead = f", or '{root}@0' where it is loaded" if "." in root else f", or '{root}'"
        else:
            instead = ""
        kind = "the callee of a call site" if call else "a target"
        if root == "super" and bracket == "(":  # super().m(): the method is loaded through super()
            raise SpecError(f"{written!r}: {SUPER_NO_CALL}")
        raise SpecError(
            f"{written!r}: {kind} is a name or a chain of attributes: bcrecord names no item (x[0]) and "
            f"no call's result (f().g) in code; record what it gives where it is assigned to a local "
            f"or returned ('return'){instead}"
        )
    return ".".join(_identifier(part, what) for part in target.split("."))


def compiled_name(text: str) -> str:
    """A name (or dotted names) written as in the source, spelt as the compiler stores it:
    NFKC-normalised (``'\\ufb01'`` written, ``'fi'`` in the code object).

    >>> compiled_name("\\ufb01le.C.m")
    'file.C.m'
    """
    return unicodedata.normalize("NFKC", text)


def full_width_fixed(text: str, punctuation_only: bool = False) -> str | None:
    """``text`` with its full-width characters (an IME's ``'＠'``, ``'：'``, ``'０'``, the ideographic
    space) written in ASCII, where it has some; else None. ``punctuation_only`` leaves those a name
    may hold (``'ｏｕｔ'`` is ``out`` to the compiler).

    >>> full_width_fixed("x\uff20\uff11"), full_width_fixed("x@1"), full_width_fixed("\uff4f\uff1a", True)
    ('x@1', None, '\uff4f:')
    """

    if text.isascii():  # (the common case: asking unicodedata per character costs 1 us each)
        return None

    def wide(char: str) -> bool:
        named = unicodedata.name(char, "").startswith("FULLWIDTH") or char == "\u3000"
        return named and not (punctuation_only and f"a{char}".isidentifier())

    if not any(wide(char) for char in text):
        return None
    return "".join(unicodedata.normalize("NFKC", char) if wide(char) else char for char in text)


@dataclass(frozen=True)
class Local:
    """The value of local ``name`` right after its assignment number ``index``.

    Assignments are counted in source order (line, then column) from 0, the way
    a reader counts them; ``index=None`` records every assignment. An
    assignment inside a loop is recorded each time it runs.

    >>> import bcrecord
    >>> bcrecord.Local("x", [2, 0]).index
    (0, 2)
    """

    name: str
    index: tuple[int, ...] | None = None
    copy: Copy = None

    def __init__(self, name: str, index: Index = None, copy: Copy = None) -> None:
        if isinstance(name, str) and not name.isidentifier():
            _names(name, "a local's name")  # (a call or a subscript: says what to write)
        object.__setattr__(self, "name", _identifier(name, "a local's name"))
        object.__setattr__(self, "index", _index(index))
        object.__setattr__(self, "copy", _copy(copy))


@dataclass(frozen=True)
class Attribute:
    """An attribute chain such as ``'self.linear1.weight'``.

    ``at='entry'`` records the chain once when the function starts (the MMEngine
    ``AttributeRecorder`` semantics; the root must be an argument).
    ``at='load'`` records the value each time the body loads exactly that chain,
    method-style loads such as ``self.linear1(x)`` included; ``index`` picks load
    sites by their order in the source.

    >>> import bcrecord
    >>> bcrecord.Attribute("self.linear1", at="load", index=0).chain
    ('self', 'linear1')
    """

    target: str
    at: Literal["entry", "load"] = "entry"
    index: tuple[int, ...] | None = None
    copy: Copy = None

    def __init__(
        self, target: str, at: Literal["entry", "load"] = "entry", index: Index = None, copy: Copy = None
    ) -> None:
        if not isinstance(target, str):
            raise SpecError(f"an attribute target must be a string, got {target!r}")
        parts = target.split(".")
        if len(parts) < 2:
            raise SpecError(f"an attribute target needs a dot, e.g. 'self.x', got {target!r}")
        target = _names(target, f"each part of {target!r}")
        if at not in ("entry", "load"):
            raise SpecError(f"at must be 'entry' or 'load', got {at!r}")
        if at == "entry" and index is not None:
            raise SpecError("index applies to at='load' only: an entry value is read once")
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "index", _index(index))
        object.__setattr__(self, "copy", _copy(copy))

    @property
    def chain(self) -> tuple[str, ...]:
        """The chain split at its dots: root name first."""
        return tuple(self.target.split("."))


@dataclass(frozen=True)
class Return:
    """The returned value, at every return site (an implicit ``return None`` too).

    >>> import bcrecord
    >>> bcrecord.Return().copy is None
    True
    """

    copy: Copy = field(default=None)

    def __post_init__(self) -> None:
        _copy(self.copy)


@dataclass(frozen=True)
class Call:
    """The value returned by the n-th call site whose callee is ``target``.

    ``target`` is a chain (``'self.avgpool'``, ``'torch.flatten'``, ``'F.relu'``) or a
    bare name (``'len'``); call sites are numbered in source order, and the value is
    recorded right after the call returns, every time it runs.

    >>> import bcrecord
    >>> bcrecord.parse("torch.flatten()@1")
    Call(target='torch.flatten', index=(1,), copy=None)
    """

    target: str
    index: tuple[int, ...] | None = None
    copy: Copy = None

    def __init__(self, target: str, index: Index = None, copy: Copy = None) -> None:
        if not isinstance(target, str):
            raise SpecError(f"a call target must be a string, got {target!r}")
        if target.rstrip().endswith("()"):  # the short form's spelling, given to the class
            raise SpecError(
                f"Call takes the callee without its parentheses: Call({target.rstrip()[:-2].strip()!r}), "
                f"or parse({target.strip()!r})"
            )
        target = _names(target, f"each part of {target!r}", call=True)
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "index", _index(index))
        object.__setattr__(self, "copy", _copy(copy))


#: Binary operators an :class:`Expr` can name (``'+='`` etc. for augmented assignment).
OPERATORS = ("+", "-", "*", "@", "/", "//", "%", "**", "<<", ">>", "&", "|", "^")


@dataclass(frozen=True)
class Expr:
    """The result of the n-th binary operator ``op`` in source order (``out + identity``).

    ``op`` is an operator symbol such as ``'+'`` or ``'*'``; ``'+='`` names augmented
    assignments. :func:`bcrecord.targets` lists operator sites with their line and
    column.

    >>> import bcrecord
    >>> bcrecord.parse("+@0")
    Expr(op='+', index=(0,), copy=None)
    """

    op: str
    index: tuple[int, ...] | None = None
    copy: Copy = None

    def __init__(self, op: str, index: Index = None, copy: Copy = None) -> None:
        if not isinstance(op, str):
            raise SpecError(f"an operator must be a string such as '+', got {op!r}")
        if op not in OPERATORS and not (op.endswith("=") and op[:-1] in OPERATORS):
            raise SpecError(f"unknown operator {op!r}; operators: {' '.join(OPERATORS)} (and '+=' etc.)")
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "index", _index(index))
        object.__setattr__(self, "copy", _copy(copy))


Spec = Union[Local, Attribute, Return, Call, Expr]
SpecLike = Union[Spec, str, Mapping[str, Any]]

_SHORT = re.compile(r"^\s*(?P<target>[^@\s]+)\s*(?:@\s*(?P<index>.+?))?\s*$")


def _parse_index_text(text: str, spec: str) -> Index:
    bad = f"bad index in {spec!r}: expected an int or a list like [0,2]"
    if not text.strip():  # ('x@ ': the regex gives the space as the index)
        raise _nothing_after_at(spec)
    try:
        value = json.loads(text)
    except ValueError:
        unpadded = _LEADING_ZEROS.sub("", text)
        if unpadded != text and _parses_as_index(unpadded):  # ('x@01': JSON has no leading zeros)
            fixed = spec.strip()[: -len(text)] + unpadded
            target = spec.split("@", 1)[0].strip()
            call = _DOTTED.match(target)
            # ('f(x)@01': a call site is written without its arguments too; not 'f(x).g()@01', whose
            # callee is no chain of names: refused as such next)
            if call is not None and _closing(target, target.index("(")) == len(target) - 1:
                fixed = "".join(call.group("callee").split()) + "()@" + unpadded
            message = f"bad index in {spec!r}: a leading zero is not accepted: write {fixed!r}"
            raise SpecError(message) from None
        several = [part.strip() for part in re.split(r"[@,]", text)]
        if len(several) > 1 and all(part.isdigit() and part.isascii() for part in several):
            # 'x@1@2', 'x@1,2': several sites are one list ('x@1@02' too: 'x@[1,2]')
            target = spec.split("@", 1)[0].strip()
            sites = ",".join(str(int(part)) for part in several)
            raise SpecError(f"{bad}; several sites are one list: '{target}@[{sites}]'") from None
        raise SpecError(bad) from None
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        raise SpecError(
            f"bad index in {spec!r}: an index is a non-negative int: sites are counted from 0 in source "
            "order, with none from the end; bcrecord.targets(func) lists them"
        )
    if isinstance(value, list) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise SpecError(bad)


#: The zeros that pad a number ('01', '[0, 007]'), which JSON refuses; not the 0 of '0' or '10'.
_LEADING_ZEROS = re.compile(r"(?<![\w.])0+(?=\d)")


def _closing(text: str, opening: int) -> int:
    """Where the parenthesis opened at ``opening`` closes in ``text`` (-1: nowhere).

    >>> _closing("f(x)", 1), _closing("f(x).g()", 1), _closing("f((x)", 1)
    (3, 3, -1)
    """
    depth = 0
    for at in range(opening, len(text)):
        depth += {"(": 1, ")": -1}.get(text[at], 0)
        if depth == 0:
            return at
    return -1


def _parses_as_index(text: str) -> bool:
    """Whether ``text`` is an index as a short form writes it: a non-negative int or a list of them."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    values = value if isinstance(value, list) else [value]
    return bool(values) and all(type(item) is int and item >= 0 for item in values)


def _nothing_after_at(spec: str) -> SpecError:
    bare = spec.rsplit("@", 1)[0].strip()
    return SpecError(
        f"cannot parse spec {spec!r}: '@' is followed by an index: '{bare}@0', '{bare}@[0,2]', "
        f"or {bare!r} for every one"
    )


_OPERATOR = re.compile(r"^\s*(?P<op>\*\*=?|//=?|<<=?|>>=?|[-+*/%@&|^]=?)\s*(?:@\s*(?P<index>.+?))?\s*$")


#: Operators a short form may name that are no sites: comparisons, boolean and unary ones.
_NO_SITE_OPERATORS = frozenset({"<", ">", "<=", ">=", "==", "!=", "not", "and", "or", "is", "in", "~"})


def split_specs(text: str) -> list[str] | None:
    """The specs of ``text`` where it holds several, written as one string (``'x,y'``,
    ``'x self.w'``), each a spec on its own; else None (one spec, or not specs at all).
    Commas and spaces inside an index list (``'x@[0, 2]'``) do not split it.

    >>> split_specs("outputs, self.scale"), split_specs("x@[0, 2]"), split_specs("x y..z")
    (['outputs', 'self.scale'], None, None)
    """
    parts = [part for part in _SPEC_SEPARATORS.split(text) if part]
    if len(parts) < 2:
        return None
    try:
        for part in parts:
            _parse_one_str(part)
    except SpecError:
        return None
    return parts


#: Commas and spaces between specs, not inside an index list ('x@[0, 2]').
_SPEC_SEPARATORS = re.compile(r"[,\s]+(?![^\[]*\])")


def _parse_str(text: str) -> Spec:
    try:
        return _parse_one_str(text)
    except SpecError as error:
        fixed = full_width_fixed(text)
        if fixed is not None and split_specs(fixed) is None:
            if _parses(fixed):
                raise SpecError(f"{error}; {text!r} has full-width characters: write {fixed!r}") from None
            try:
                _parse_one_str(fixed)
            except SpecError as ascii_error:  # ('x@０１' is 'x@01': that message says what to write)
                if ": write " in str(ascii_error):
                    raise SpecError(
                        f"{error}; {text!r} has full-width characters, and in ASCII: {ascii_error}"
                    ) from None
        several = split_specs(text)
        if several is None:
            raise
        raise SpecError(
            f"{error}; {text!r} holds {len(several)} specs: give each on its own, {several!r}"
        ) from None


def _parses(text: str) -> bool:
    try:
        _parse_one_str(text)
    except SpecError:
        return False
    return True


def _one_call(text: str) -> bool:
    """Whether ``text`` ends with the one pair of parentheses its first ``(`` opens: a call
    (``'f(g(x))'``), not a call of a call's result (``'f()()'``).

    >>> _one_call("f(g(x), y)"), _one_call("f()()"), _one_call("f")
    (True, False, False)
    """
    start, depth = text.find("("), 0
    if start < 0:
        return False
    for at, char in enumerate(text[start:], start):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return not text[at + 1 :].strip()
    return False


def _parse_one_str(text: str) -> Spec:
    spec_part = text.rpartition(":")[2].strip()
    if ":" in text and spec_part and _parses(spec_part):  # no spec holds a ':'
        raise SpecError(
            f"{text!r} is a key or a target, '<owner>:<method>:<spec>': where a spec goes, give the spec "
            f"alone: {spec_part!r}"
        )
    operator = _OPERATOR.match(text)
    if operator is not None:
        index_text = operator.group("index")
        return Expr(operator.group("op"), None if index_text is None else _parse_index_text(index_text, text))
    match = _SHORT.match(text)
    if match is None and _DOTTED.match(text) is not None:
        _names(text.strip(), "a target", short=True)  # a call written in it ('f(x, y)'): says what to write
    head, at, index_text = text.rpartition("@")
    call = _DOTTED.match(head) if at and _one_call(head) else None
    callee = "" if call is None else re.sub(r"\s", "", call.group("callee"))
    bare = call is not None and re.sub(r"\s", "", head) == f"{callee}()"
    if call is not None and _SHORT.match(f"x@{index_text}"):
        _parse_index_text(index_text, text)  # (a bad index said as such: no form to write with it)
    if bare and match is None and _SHORT.match(f"x@{index_text}"):
        raise SpecError(f"{text!r}: a call site is written without spaces: '{callee}()@{index_text.strip()}'")
    # (with arguments, spaced or not: 'f(x)@1' matches _SHORT too; 'f()@1' is the short form)
    if call is not None and not bare and _SHORT.match(f"x@{index_text}"):
        # ('f(x, y)@1': with its index, as the short form without one is told)
        raise SpecError(
            f"{text!r}: a call site is written without its arguments: '{callee}()@{index_text.strip()}'"
        )
    if match is None and text.rstrip().endswith("@") and text.count("@") == 1 and text.strip() != "@":
        raise _nothing_after_at(text)
    if match is None:
        raise SpecError(f"cannot parse spec {text!r}; examples: 'x', 'x@1', 'self.fc.weight'")
    target, index_text = match.group("target"), match.group("index")
    index = None if index_text is None else _parse_index_text(index_text, text)
    if target.endswith("()"):
        return Call(target[:-2], index)
    if target in ("return", "<return>"):
        if index is not None:
            raise SpecError(f"{text!r}: a return spec takes no index")
        return Return()
    if "." in target:
        # An index on a chain only makes sense per load site.
        return Attribute(target, at="entry" if index is None else "load", index=index)
    if target in _NO_SITE_OPERATORS:  # ('<@0': an operator, not a local's name)
        raise SpecError(
            f"{text!r}: {target!r} is an operator bcrecord does not record (comparisons and "
            f"unary operators are no sites); operators: {' '.join(OPERATORS)} (and '+=' etc.)"
        )
    return Local(target, index)


def _parse_dict(spec: Mapping[str, Any]) -> Spec:
    kind = spec.get("type")
    known = {"type", "target", "index", "copy", "at", "model", "method", "name"}
    unknown = set(spec) - known
    if unknown:
        names = sorted(unknown, key=repr)  # (keys of mixed types, 1 and 'idx', do not compare)
        first = next((name for name in names if isinstance(name, str)), str(names[0]))
        raise SpecError(f"unknown keys {names} in {dict(spec)!r}{did_you_mean(first, known)}")
    target = spec.get("target")
    if kind == "FunctionRecorder":
        if not isinstance(target, str):
            raise SpecError(f"FunctionRecorder needs a string 'target', got {dict(spec)!r}")
        # The target is a short form without its index: 'outputs', 'self.fc()', '+', 'return'.
        bare, at, written = target.rpartition("@")
        unpadded = _LEADING_ZEROS.sub("", written.strip())
        if at and bare.strip() and unpadded != written.strip() and _parses_as_index(unpadded):
            index_list = json.loads(unpadded)  # ('x@01': told the dict's form, not the short one)
            given_index = index_list if isinstance(index_list, list) else [index_list]
            raise SpecError(
                f"target={target!r}: a dict gives its index in 'index': write target={bare.strip()!r}, "
                f"index={given_index!r}"
            )
        parsed, index, copy = _parse_str(target), spec.get("index"), spec.get("copy")
        given = getattr(parsed, "index", None)
        if given is not None:
            bare = parsed.op if isinstance(parsed, Expr) else target.split("@")[0].strip()
            raise SpecError(
                f"target={target!r}: a dict gives its index in 'index': write target={bare!r}, "
                f"index={list(given)!r}"
            )
        if isinstance(parsed, Return):
            if index is not None:
                raise SpecError(f"target={target!r}: a return spec takes no index")
            return Return(copy=copy)
        if spec.get("at", "load") != "load":  # ('load', the default, says nothing more)
            raise SpecError(
                f"target={target!r}: 'at' is for type='AttributeRecorder'; a FunctionRecorder records "
                "a dotted chain where the body loads it"
            )
        if isinstance(parsed, Attribute):  # recorded where the body loads it (AttributeRecorder: at entry)
            return Attribute(parsed.target, at="load", index=index, copy=copy)
        return dataclasses.replace(parsed, index=index, copy=copy)
    if kind == "AttributeRecorder":
        if not isinstance(target, str):
            raise SpecError(f"AttributeRecorder needs a string 'target', got {dict(spec)!r}")
        return Attribute(target, at=spec.get("at", "entry"), index=spec.get("index"), copy=spec.get("copy"))
    raise SpecError(f"dict specs need type='FunctionRecorder' or 'AttributeRecorder', got {kind!r}")


def parse(spec: SpecLike) -> Spec:
    """Turn a spec, a short-form string or an MMEngine recorder dict into a spec.

    Short forms: ``'x'`` (every assignment of ``x``), ``'x@1'``, ``'x@[0,2]'``,
    ``'self.linear1.weight'`` (at entry), ``'self.linear1@0'`` (first load site),
    ``'return'``, ``'self.avgpool()'`` / ``'torch.flatten()@1'`` (call results) and
    ``'+@0'`` (the first ``+`` in source order). Dicts: ``dict(type='FunctionRecorder', target='outputs',
    index=[1])`` and ``dict(type='AttributeRecorder', target='self.fc.weight')``;
    a FunctionRecorder's ``target`` is any short form without its ``@index`` (a dotted
    chain is recorded at its load sites), given in ``index`` instead;
    their ``model``/``method``/``name`` keys are for integrations and ignored here (where a
    dict is given to patch a function, a ``method`` that is not the function's, a ``model``,
    and a ``name`` that is not the patch's are refused).

    >>> import bcrecord
    >>> bcrecord.parse("x@[0,2]")
    Local(name='x', index=(0, 2), copy=None)
    >>> bcrecord.parse(dict(type="FunctionRecorder", target="outputs", index=[1]))
    Local(name='outputs', index=(1,), copy=None)
    >>> bcrecord.parse(dict(type="FunctionRecorder", target="self.fc()", index=[0]))
    Call(target='self.fc', index=(0,), copy=None)
    """
    if isinstance(spec, (Local, Attribute, Return, Call, Expr)):
        return spec
    if isinstance(spec, str):
        return _parse_str(spec)
    if isinstance(spec, Mapping):
        return _parse_dict(spec)
    raise SpecError(f"a spec must be Local/Attribute/Return/Call/Expr, a string or a dict, got {spec!r}")


def parse_all(specs: SpecLike | Iterable[SpecLike]) -> Tuple[Spec, ...]:
    """Parse one spec or many; a single string or dict counts as one.

    >>> parse_all(["x@0", "return"])
    (Local(name='x', index=(0,), copy=None), Return(copy=None))
    """
    if isinstance(specs, (str, Mapping, Local, Attribute, Return, Call, Expr)):
        return (parse(specs),)
    if isinstance(specs, (bytes, bytearray)):  # (iterated, they would be numbers)
        raise SpecError(f"specs are text: give a str, not {specs!r}")
    try:
        items = list(specs)
    except TypeError:
        raise SpecError(f"specs must be a spec or a list of specs, got {specs!r}") from None
    parsed = tuple(parse(spec) for spec in items)
    if not parsed:
        raise SpecError("no specs given: name at least one local, attribute or return")
    return parsed
