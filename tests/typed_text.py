"""Hypothesis strategies for what users type as targets, shared by the parsers' property tests.

The property tests run a modest, fixed set of examples (``derandomize``: CI sees the same
ones every run); ``BCRECORD_PARSE_EXAMPLES=20000`` runs that many random ones instead::

    BCRECORD_PARSE_EXAMPLES=20000 python -m pytest -q tests/test_specs.py -k property
"""

import json
import keyword
import os
from typing import Any, Optional, Sequence

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from bcrecord.specs import OPERATORS, Attribute, Call, Expr, Local, Return

CAMPAIGN = "BCRECORD_PARSE_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("BCRECORD_PARSE_EXAMPLES", "100"))

SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=not CAMPAIGN,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

#: Pieces of targets, typos included: separators, indices, full-width forms, '()', '.grad'.
PIECES = (
    *"xy@:.()[]*?-+ 0123456789,/%<>=!~&|^\t\n_",
    "self",
    "self.fc",
    "fc",
    "out",
    "return",
    "<return>",
    "grad",
    ".grad",
    "()",
    "forward",
    "blocks",
    "[0,2]",
    "[]",
    "-1",
    "9" * 30,
    "null",
    "true",
    "1.0",
    '"',
    "{}",
    "NaN",
    "\uff58",  # full-width x
    "\uff20",  # full-width @
    "\uff1a",  # full-width :
    "\uff10",  # full-width 0
    "\u3000",  # ideographic space
    "\ufb01",  # the fi ligature (NFKC: 'fi')
    "\u00b2",  # a digit to str.isdigit, no number to int
    "\u0661",  # ARABIC-INDIC DIGIT ONE: a decimal digit json does not read
    "\x00",
)

#: Arbitrary text, and text made of the pieces above (which st.text() rarely hits).
TYPED = st.one_of(st.text(max_size=30), st.lists(st.sampled_from(PIECES), max_size=12).map("".join))

#: JSON-like values, as a YAML or Python config may hold them.
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TYPED,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TYPED, inner, max_size=3),
    max_leaves=8,
)

#: Python identifiers (unicode ones too), no keywords.
NAMES = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,7}", fullmatch=True),
    st.text(st.characters(categories=("L", "Nd", "Pc")), min_size=1, max_size=6),
).filter(lambda name: name.isidentifier() and not keyword.iskeyword(name))

CHAINS = st.lists(NAMES, min_size=2, max_size=4).map(".".join)

#: An index as a spec takes it: one non-negative int (huge ones too), or a non-empty list.
INDICES = st.one_of(
    st.none(),
    st.integers(0, 10**30),
    st.lists(st.integers(0, 50), min_size=1, max_size=4),
)

ALL_OPERATORS = (*OPERATORS, *(op + "=" for op in OPERATORS))


def index_text(index: Any) -> str:
    """``'@3'``, ``'@[0,2]'`` or ``''``: an index as a short form writes it.

    >>> index_text([2, 0]), index_text(None)
    ('@[2,0]', '')
    """
    if index is None:
        return ""
    return "@" + json.dumps(index, separators=(",", ":"))


@st.composite
def specs_and_short_forms(draw: Any) -> tuple:
    """``(spec, short form)`` for every kind of spec that has a short form."""
    kind = draw(st.sampled_from(["local", "entry", "load", "call", "expr", "return"]))
    index: Optional[Sequence[int]] = draw(INDICES)
    if kind == "local":
        name = draw(NAMES)
        return Local(name, index), name + index_text(index)
    if kind == "entry":
        chain = draw(CHAINS)
        return Attribute(chain), chain
    if kind == "load":  # (a chain's short form without an index is its entry value)
        chain, index = draw(CHAINS), draw(INDICES.filter(lambda index: index is not None))
        return Attribute(chain, at="load", index=index), chain + index_text(index)
    if kind == "call":
        callee = draw(st.one_of(NAMES, CHAINS))
        return Call(callee, index), f"{callee}()" + index_text(index)
    if kind == "expr":
        op = draw(st.sampled_from(ALL_OPERATORS))
        return Expr(op, index), op + index_text(index)
    return Return(), draw(st.sampled_from(["return", "<return>"]))
