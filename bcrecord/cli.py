"""The ``bcrecord`` command line (also ``python -m bcrecord``).

Subcommands:

* ``bcrecord targets pkg.mod:Class.method [--json]`` — everything recordable.
* ``bcrecord show pkg.mod:Class.method SPEC...`` — original and patched
  disassembly side by side, inserted probes marked (plus decompiled source where
  the optional ``depyf`` is installed).
* ``bcrecord demo`` — records the locals of a small model and prints what it saw.

>>> main(["targets", "bcrecord.demo:ToyModel.forward", "--json"])  # doctest: +ELLIPSIS
{...
0
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any, Optional, Sequence, Tuple

from .errors import BcrecordError
from .listing import decompiled, side_by_side
from .patch import function_of, patch_function, targets

__all__ = ["main", "resolve_path"]


def resolve_path(path: str) -> Tuple[Any, Any]:
    """Import ``'pkg.mod:Class.method'`` and return (owner object, the attribute).

    >>> owner, func = resolve_path("bcrecord.demo:ToyModel.forward")
    >>> owner.__name__, func.__name__
    ('ToyModel', 'forward')
    """
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise BcrecordError(
            f"expected 'package.module:Class.method' or 'package.module:function', got {path!r}"
        )
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise BcrecordError(f"cannot import module {module_name!r}: {error}") from None
    value = owner
    for part in attr_path.split("."):
        owner = value
        try:
            value = getattr(value, part)
        except AttributeError:
            raise BcrecordError(f"{path!r}: {owner!r} has no attribute {part!r}") from None
    return owner, value


def _targets(args: argparse.Namespace) -> int:
    _, func = resolve_path(args.path)
    found = targets(func)
    print(json.dumps(found.as_dict(), indent=2) if args.json else found)
    return 0


def _show(args: argparse.Namespace) -> int:
    _, func = resolve_path(args.path)
    base = function_of(func)
    with patch_function(base, args.specs, name=args.name or "show") as patch:
        print(f"{base.__qualname__}: {len(patch.keys)} probe(s): {', '.join(patch.keys)}\n")
        print(side_by_side(patch.original_code, patch.code))
        source = decompiled(patch.code)
    if source is not None:
        print("\ndecompiled patched source (depyf):\n")
        print(source)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from . import demo

    return demo.run(out=sys.stdout)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bcrecord", description="Record intermediate values inside Python functions."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("targets", help="list everything recordable in a function")
    p.add_argument("path", help="package.module:Class.method or package.module:function")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=_targets)
    p = commands.add_parser("show", help="show the patched disassembly for some specs")
    p.add_argument("path", help="package.module:Class.method or package.module:function")
    p.add_argument("specs", nargs="+", help="specs such as x@1, self.fc.weight, return")
    p.add_argument("--name", help="owner part of keys (default: show)")
    p.set_defaults(run=_show)
    p = commands.add_parser("demo", help="record the locals of a small model and print them")
    p.set_defaults(run=_demo)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit code.

    >>> main(["targets", "no_colon_here"])  # the message goes to stderr
    2
    """
    args = _parser().parse_args(list(argv) if argv is not None else None)
    try:
        return int(args.run(args))
    except BcrecordError as error:
        print(f"bcrecord: {error}", file=sys.stderr)
        return 2
