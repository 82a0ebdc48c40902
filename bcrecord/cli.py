"""The ``bcrecord`` command line (also ``python -m bcrecord``).

Subcommands:

* ``bcrecord targets pkg.mod:Class.method [--json]`` — everything recordable.
* ``bcrecord show pkg.mod:Class.method SPEC...`` — original and patched
  disassembly side by side, inserted probes marked (plus decompiled source where
  the optional ``depyf`` is installed).
* ``bcrecord run --record TARGET... [--save-dir DIR] [--every N] [--copy POLICY] [-q] script.py [args...]``
  (or ``-m package.module [args...]``, or ``- [args...]``: the program read from stdin) —
  runs an unmodified program with the targets patched from the start, saving every N-th
  value (see :mod:`bcrecord.runner`).
* ``bcrecord view DIR`` — a summary table of saved records and pictures in
  ``DIR/plots`` (see :mod:`bcrecord.viz`).
* ``bcrecord demo`` — records inside a small CNN (torch), prints the table and
  writes the plots (see :mod:`bcrecord.demo`).

``targets``, ``show`` and ``run`` need the core alone (``run`` saves tensors with
safetensors when the program records any); ``view`` and ``demo`` import torch and
matplotlib when they run, never when this module is imported.

>>> main(["targets", "bcrecord.cli:resolve_path", "--json"])  # doctest: +ELLIPSIS
{
  "function": "resolve_path",
  "arguments": [
    "path"
  ],
  "targets": [...
0

Bad input is one line on stderr and status 2:

>>> main(["run", "--record", "json:dumps:nosuch", "no_such_script.py"])
2
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import platform
import re
import sys
import types
from typing import Any, Iterator, List, Optional, Sequence, TextIO, Tuple, cast

from . import __version__
from .errors import BcrecordError, did_you_mean, shown
from .listing import decompiled, side_by_side
from .patch import (
    Patch,
    a_method_name,
    function_of,
    no_python_method,
    patch_function,
    patch_method,
    targets,
)
from .rewrite import set_probe_style
from .specs import compiled_name

__all__ = ["main", "resolve_path"]


def resolve_path(path: str) -> Tuple[Any, Any]:
    """Import ``'pkg.mod:Class.method'`` and return (owner object, the attribute).

    >>> owner, func = resolve_path("bcrecord.patch:Patch.remove")
    >>> owner.__name__, func.__name__
    ('Patch', 'remove')
    """
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        from .runner import is_module, split_module

        if path.endswith(".py"):  # a script: no module 'train' with a function 'py'
            hint = f"; a function of it is '{os.path.basename(path)[:-3]}:FUNCTION', from its folder"
        elif not sep and is_module(path):  # 'pkg.mod' alone
            hint = (
                f"; {path!r} is a module: name a function of it, '{path}:FUNCTION' or '{path}:Class.method'"
            )
        else:  # 'pkg.mod.Net.forward': the module's colon left out
            split = split_module(path) if not sep else None
            hint = f"; did you mean '{split[0]}:{split[1]}'?" if split else ""
        raise BcrecordError(
            f"expected 'package.module:Class.method' or 'package.module:function', got {path!r}{hint}"
        )
    # A file (a module named 'x.py' is a submodule 'py' of package 'x': only if no such file).
    if (
        "/" in module_name
        or os.sep in module_name
        or (module_name.endswith(".py") and os.path.isfile(module_name))
    ):
        relative = os.path.relpath(module_name).removesuffix(".py")
        if relative.startswith(os.pardir):  # outside the working directory: from its own folder
            folder, stem = os.path.split(os.path.abspath(module_name).removesuffix(".py"))
            example = f"'{stem}:{attr_path}', run in {folder}"
        else:
            example = f"'{relative.replace(os.sep, '.')}:{attr_path}', from the folder it imports from"
        raise BcrecordError(f"{path!r}: give a module's dotted name, not a file (e.g. {example})")
    if module_name.startswith("."):
        raise BcrecordError(f"{path!r}: give the module's absolute name (no leading dot)")
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as error:
        from .runner import close_modules

        # (a module its import misses is its own business: no hint for that one)
        hint = close_modules(module_name) if getattr(error, "name", None) == module_name else ""
        raise BcrecordError(f"cannot import module {module_name!r}: {error}{hint}") from None
    except (Exception, SystemExit) as error:
        # The module itself raises on import (a SyntaxError, its own errors), or exits: a
        # script that parses its arguments at import (no `if __name__ == "__main__":`).
        said = f": {error}" if str(error) else ""  # sys.exit() says nothing more
        raise BcrecordError(f"importing module {module_name!r} raised {type(error).__name__}{said}") from None
    value = owner
    for part in compiled_name(attr_path).split("."):
        owner = value
        try:
            value = getattr(value, part)
        except AttributeError:
            if _defines_inside(owner, part):  # as `bcrecord run` says of such a target
                raise BcrecordError(
                    f"{path!r}: {part} is a function defined inside {owner.__qualname__}, made anew by "
                    "each call, out of the module's reach: it cannot be a target"
                ) from None
            hint = did_you_mean(part, dir(owner))
            raise BcrecordError(f"{path!r}: {shown(owner)} has no attribute {part!r}{hint}") from None
    return owner, value


def _defines_inside(owner: Any, name: str) -> bool:
    """Whether ``owner`` is a function (or a decorator's wrapper of one) with a ``def name`` in it.

    >>> def outer():
    ...     def inner():
    ...         pass
    >>> _defines_inside(outer, "inner"), _defines_inside(outer, "other"), _defines_inside(len, "inner")
    (True, False, False)
    """
    try:
        code = function_of(owner).__code__
    except BcrecordError:
        return False
    return any(isinstance(const, types.CodeType) and const.co_name == name for const in code.co_consts)


def _positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def _with_environment(directory: Optional[str]) -> Optional[str]:
    """``run``'s ``--save-dir`` with its ``$NAME`` and ``${NAME}`` read from this process's environment.

    So a quoted ``-o 'runs/rank$RANK'`` gives each rank of ``torchrun`` its own directory: the
    shell that starts torchrun has no ``RANK``, and would expand it to nothing. A name the
    environment lacks is an error, not a folder named after it.

    >>> _with_environment("runs/a"), _with_environment(None)
    ('runs/a', None)
    >>> try:
    ...     _with_environment("runs/rank$BCRECORD_UNSET")
    ... except BcrecordError as error:
    ...     print(error)
    --save-dir 'runs/rank$BCRECORD_UNSET': BCRECORD_UNSET is not set in this process's environment
    """
    if directory is None or "$" not in directory:
        return directory

    def value(match: re.Match[str]) -> str:
        name = match.group(2) if match.group(2) is not None else match.group(1)
        if name not in os.environ:
            raise BcrecordError(
                f"--save-dir {directory!r}: {name or match.group(0)} is not set in this process's environment"
            )
        return os.environ[name]

    # The names as written, each read once: a value holding a '$' (a path) is kept as it is.
    return _VARIABLE.sub(value, directory)


#: A ``$NAME`` or ``${NAME}`` (as ``os.path.expandvars`` finds them on POSIX).
_VARIABLE = re.compile(r"\$(\w+|\{([^}]*)\})", re.ASCII)


def _resolved(path: str) -> Tuple[Any, Any]:
    """:func:`resolve_path` for a command: ``'__main__'`` there is bcrecord's command line."""
    module_name, _, attr_path = path.partition(":")
    function, colon, spec = attr_path.partition(":")
    if colon:  # a `bcrecord run` target pasted whole: its attribute lookup would fail on 'forward:x'
        raise BcrecordError(
            f"{path!r} ends with a spec, as a `bcrecord run` target does: here the function comes "
            f"alone, '{module_name}:{function}', and specs after it ('bcrecord show "
            f"{module_name}:{function} {spec}')"
        )
    if module_name == "__main__":
        raise BcrecordError(
            f"{path!r}: name a script by its module name ('prog:{attr_path or 'FUNCTION'}' for prog.py, "
            "from its folder); '__main__' is a script's name only while `bcrecord run` runs it"
        )
    # What the module prints as it is imported (a script's own code, run at import) goes to
    # stderr: stdout is the command's output (--json). (Where there is a stderr.)
    with contextlib.redirect_stdout(sys.stderr) if sys.stderr is not None else contextlib.nullcontext():
        holder, found = resolve_path(path)
    if isinstance(found, type) and no_python_method(found):
        raise BcrecordError(f"{path!r}: {no_python_method(found)}")
    if isinstance(found, type):
        method = a_method_name(found)
        raise BcrecordError(f"{path!r} is a class: name one of its methods, e.g. '{path}.{method}'")
    return holder, found


def _recordable(path: str) -> Any:
    """What ``path`` names, as ``bcrecord run`` records it: a property by its getter.

    A wrapper of a function (``functools.cache``'s, a partial) is refused with the path of
    the function that runs:

    >>> main(["targets", "bcrecord.errors:shown.__globals__"])  # a dict: refused, no path to give
    2
    """
    _, found = _resolved(path)
    found = found.fget if isinstance(found, property) and found.fget is not None else found
    try:
        function_of(found)
    except BcrecordError as error:
        from .runner import instead_of

        module_name, _, attr_path = path.partition(":")
        instead = instead_of(module_name, attr_path, found)
        if instead is None:
            if isinstance(found, types.CodeType):  # (targets() lists a code object's too)
                return found
            raise BcrecordError(f"{path!r}: {error}") from None
        raise BcrecordError(f"{error}; as a path: '{instead}'") from None
    return found


def _stripped(path: str) -> str:
    """``path`` without spaces around its parts, as ``bcrecord run`` reads a target.

    >>> _stripped(" pkg.mod : Net.forward ")
    'pkg.mod:Net.forward'
    """
    return ":".join(part.strip() for part in path.split(":"))


def _targets(args: argparse.Namespace) -> int:
    args.path = _stripped(args.path)
    found = targets(_recordable(args.path))
    out = _Output()
    print(json.dumps(found.as_dict(), indent=2) if args.json else found._table(out.encoding), file=out)
    out.flush()
    return 0


def _patched(path: str, specs: Sequence[str], name: str) -> Patch:
    """``path`` patched in place as ``bcrecord run`` patches it, so that keys read the same:
    a method or function by the name the path gives it (``C.forward`` where
    ``forward = _impl``), a property's getter or a function a partial holds by its own."""
    holder, found = _resolved(path)
    if isinstance(holder, (type, types.ModuleType)) and not isinstance(found, property):
        # 'pkg.mod:C.forward' -> 'forward'
        attribute = compiled_name(path.partition(":")[2]).rpartition(".")[2]
        return patch_method(holder, attribute, specs, name, in_place=True)
    return patch_function(function_of(_recordable(path)), specs, name=name)


def _unloaded_notes(function: str, code: types.CodeType, specs: Sequence[str]) -> List[str]:
    """A note for each entry-chain spec naming a chain ``code`` never loads (a misspelt
    ``self.scal`` is patched all the same: its read fails only when the function runs)."""
    from .analysis import compiled_spec
    from .runner import loaded_chains, unloaded_chain_note
    from .specs import Attribute, parse

    loaded = loaded_chains(code)
    notes = []
    for text in specs:
        spec = parse(text)
        if isinstance(spec, Attribute) and spec.at == "entry":
            spelt = compiled_spec(spec, code, function).target
            note = unloaded_chain_note(function, spec.target, loaded, spelt)
            if note:
                notes.append(
                    f"note: {note}; the probe reads {spec.target} when {function} starts, and records "
                    "nothing where the object has no such attribute"
                )
    return notes


def _show(args: argparse.Namespace) -> int:
    args.path = _stripped(args.path)
    found = _recordable(args.path)
    if isinstance(found, types.CodeType):  # (targets lists its sites; only a function is patched)
        raise BcrecordError(
            f"{args.path!r} is a code object: show patches a function ('bcrecord targets {args.path}' "
            "lists what a code object holds)"
        )
    base = function_of(found)
    if not args.specs:  # (checked here, after the path: a run target's spec part is said first)
        raise BcrecordError(
            f"give the specs to show after the path, e.g. 'bcrecord show {args.path} return' "
            f"('bcrecord targets {args.path}' lists them)"
        )
    out = _Output()
    with _patched(args.path, args.specs, args.name or "show") as patch:
        print(f"{base.__qualname__}: {len(patch.keys)} probe(s): {', '.join(patch.keys)}", file=out)
        for note in _unloaded_notes(base.__qualname__, patch.original_code, args.specs):
            print(note, file=out)
        print(file=out)
        print(side_by_side(patch.original_code, patch.code, encoding=out.encoding), file=out)
        source, spelt = decompiled(patch.code), ""
    if source is None and importlib.util.find_spec("depyf") is not None:
        # depyf cannot decompile an inline probe's exception handler (CHECK_EXC_MATCH): the
        # probes spelled as calls, as under torch, decompile. (Patched inline: before depyf,
        # which imports torch, was imported.)
        previous = set_probe_style("call")
        try:
            with _patched(args.path, args.specs, args.name or "show") as called:
                source, spelt = decompiled(called.code), " with its probes spelled as calls, as under torch"
        finally:
            set_probe_style(previous)
    if source is not None:
        print(f"\ndecompiled patched source (depyf{spelt}):\n", file=out)
        print(source, file=out)
    out.flush()
    return 0


def _a_record_option(arg: str) -> bool:
    """Whether ``arg`` is ``run``'s ``--record`` (``-r T``, ``--record=T``, ``-rm:f:x``).

    >>> [_a_record_option(a) for a in ("-r", "--record=m:f:x", "-rm:f:x", "-rate", "--rec")]
    [True, True, True, False, False]
    """
    return arg in ("-r", "--record") or arg.startswith("--record=") or (arg.startswith("-r") and ":" in arg)


def _run(args: argparse.Namespace) -> int:
    from . import runner

    if args.module is None and not args.args:
        raise runner.RunError(
            "no program given: bcrecord run [options] script.py [args...], -m module [args...] "
            "or - [args...] (the program on stdin)"
        )
    program, rest = (args.module, args.args) if args.module is not None else (args.args[0], args.args[1:])
    if not args.record:
        late = [arg for arg in rest if _a_record_option(arg)]
        if late:  # (after the script they are the program's, as with python -m cProfile)
            shown_program = f"-m {program}" if args.module else program
            raise runner.RunError(
                f"{late[0]} comes after the program, which takes it as its own: bcrecord's options go "
                f"before it, bcrecord run --record TARGET ... {shown_program} [args ...]"
            )
        args.parser.error("the following arguments are required: -r/--record")
    return runner.run(
        args.record,
        program,
        rest,
        module=args.module is not None,
        save_dir=_with_environment(args.save_dir),
        every=args.every,
        copy=args.copy,
        quiet=args.quiet,
        linger=True,
    )


def _view(args: argparse.Namespace) -> int:
    from . import viz

    out = _Output()
    status = viz.view(
        args.directory,
        plots=not args.no_plots,
        keys=args.key,
        progress=args.progress,
        max_maps=args.max_maps,
        out=cast(TextIO, out),  # (view writes to it with print alone)
    )
    out.flush()
    return status


def _demo(args: argparse.Namespace) -> int:
    from . import demo

    return demo.run(directory=args.out, steps=args.steps, plots=not args.no_plots, out=sys.stdout)


_RUN_VALUE_OPTIONS = {"--record", "-r", "--save-dir", "-o", "--every", "-n", "--copy"}
_RUN_LONG_VALUES = tuple(sorted(name for name in _RUN_VALUE_OPTIONS if name.startswith("--")))
#: Short options of ``run`` that take a value (``-m``'s ends bcrecord's arguments).
_RUN_SHORT_VALUES = "rmno"


def _split_run(argv: List[str]) -> Tuple[List[str], List[str]]:
    """Split ``run`` arguments at ``-m MODULE``: what follows belongs to the program.

    (A script's arguments need no help: argparse's REMAINDER takes everything after
    the script.)

    >>> _split_run(["run", "-r", "m:f:x", "-m", "pkg.mod", "--every", "3"])
    (['run', '-r', 'm:f:x', '-m', 'pkg.mod'], ['--every', '3'])
    >>> _split_run(["run", "-n", "2", "script.py", "-m", "x"])
    (['run', '-n', '2', 'script.py', '-m', 'x'], [])
    >>> _split_run(["run", "-r", "m:f:x", "-qo", "out", "-qm", "pkg.mod", "-o", "theirs"])
    (['run', '-r', 'm:f:x', '-qo', 'out', '-qm', 'pkg.mod'], ['-o', 'theirs'])
    >>> _split_run(["run", "--rec", "m:f:x", "-m", "pkg.mod", "--every", "5"])
    (['run', '--rec', 'm:f:x', '-m', 'pkg.mod'], ['--every', '5'])
    >>> _split_run(["run", "-r", "m:f:x", "-", "-m", "x"])  # the program on stdin, its arguments
    (['run', '-r', 'm:f:x', '-', '-m', 'x'], [])
    """
    i = 1
    while i < len(argv):
        token = argv[i]
        if token in _RUN_VALUE_OPTIONS:
            i += 2
        elif token in ("--", "-") or not token.startswith("-"):  # ('-': the program is on stdin)
            break
        elif token.startswith("--"):
            # argparse takes a long option's unique prefix for it: '--rec', '--sav' take a value too.
            takes = "=" not in token and any(name.startswith(token) for name in _RUN_LONG_VALUES)
            i += 2 if takes else 1
        else:
            # Short flags, combined as argparse (and python) take them: '-qm pkg', '-qo DIR', '-mpkg'.
            for at, letter in enumerate(token[1:], start=2):
                if letter in _RUN_SHORT_VALUES:
                    attached = at < len(token)  # '-mpkg', '-qoDIR': the value is the rest
                    if letter == "m":
                        end = i + 1 if attached else i + 2
                        return argv[:end], argv[end:]
                    i += 1 if attached else 2
                    break
            else:
                i += 1
    return argv, []


def _split_show(argv: List[str]) -> List[str]:
    """``show`` arguments with the path and specs after a ``--``: a spec may start with
    ``-`` (``-@0``, ``-=@0``: the subtractions ``targets`` lists), which argparse takes for
    an option. ``-h``, ``--name`` (or a prefix of it) and other long options stay options.

    >>> _split_show(["show", "m:f", "-@0", "--name", "n", "x", "-=@1"])
    ['show', '--name', 'n', '--', 'm:f', '-@0', 'x', '-=@1']
    >>> _split_show(["show", "--na=n", "m:f", "--", "-@0"])
    ['show', '--na=n', '--', 'm:f', '-@0']
    """
    options: List[str] = []
    positionals: List[str] = []
    i = 1
    while i < len(argv):
        token = argv[i]
        if token == "--":
            positionals += argv[i + 1 :]
            break
        name = token.partition("=")[0]
        if len(name) > 2 and "--name".startswith(name):  # argparse takes a unique prefix
            takes = "=" not in token
            options += argv[i : i + 1 + takes]
            i += 1 + takes
            continue
        if token == "-h" or token.startswith("--"):  # help, or an unknown option argparse names
            options.append(token)
        else:
            positionals.append(token)
        i += 1
    return [argv[0], *options, "--", *positionals]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bcrecord", description="Record intermediate values inside Python functions and PyTorch models."
    )
    # (for a bug report: which bcrecord, on which Python)
    python = platform.python_version()
    parser.add_argument("--version", action="version", version=f"bcrecord {__version__} (Python {python})")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("targets", help="list everything recordable in a function")
    p.add_argument("path", help="package.module:Class.method or package.module:function")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=_targets, parser=p)
    p = commands.add_parser("show", help="show the patched disassembly for some specs")
    p.add_argument("path", help="package.module:Class.method or package.module:function")
    p.add_argument("specs", nargs="*", help="specs such as x@1, self.fc.weight, return (one at least)")
    p.add_argument("--name", help="owner part of keys (default: show)")
    p.set_defaults(run=_show, parser=p)

    p = commands.add_parser(
        "run",
        help="run a program (like python -m cProfile) recording targets, optionally saving them",
        usage="bcrecord run --record TARGET [--record TARGET ...] [--save-dir DIR] [--every N]\n"
        "                    [--copy POLICY] [-q] (script.py | -m package.module | -) [args ...]",
        description="Run an unmodified script or module with functions patched from the start. "
        "A program '-' is read from stdin, as python - reads it. "
        "Its arguments, output and exit status pass through unchanged (but for status 2 "
        "where the records could not be saved and the program's status is 0).",
        epilog="TARGET is 'package.module:Class.method:SPEC' or 'package.module:function:SPEC', e.g. "
        "'torchvision.models.resnet:ResNet._forward_impl:x@0' or '__main__:main:loss'; "
        "'bcrecord targets package.module:Class.method' lists the SPECs. Targets are checked before "
        "the program starts and applied when their module is imported.",
    )
    p.add_argument(
        "-r",
        "--record",
        action="append",
        default=[],
        metavar="TARGET",
        help="what to record (repeat for more)",
    )
    p.add_argument(
        "-o",
        "--save-dir",
        metavar="DIR",
        help="save values here (safetensors + pickle + an index; read with bcrecord.load); $NAME in it "
        "is read from the environment: -o 'runs/rank$RANK' under torchrun gives each rank its own",
    )
    p.add_argument(
        "-n",
        "--every",
        type=int,
        default=1,
        metavar="N",
        help="save every N-th value of each key (default 1: all; needs --save-dir)",
    )
    p.add_argument(
        "--copy",
        default="clone",
        choices=["clone", "detach", "deepcopy", "none"],
        help="how values are copied when recorded (default clone; none, and detach for tensors and numpy "
        "arrays: each is saved as it is when written, up to seconds later, so a value the program "
        "changes in place meanwhile is saved changed)",
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no note of values saved before in the save dir, no summary at the end (on stderr; what did not "
        "record, warnings and errors are still said)",
    )
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m does")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script ('-': stdin) and its arguments")
    p.set_defaults(run=_run, parser=p)

    p = commands.add_parser("view", help="summarize saved records and draw them as PNGs in DIR/plots")
    # ~ expanded, as in --save-dir and --out: the shell leaves it in a quoted path, in '--out=~/demo'.
    p.add_argument(
        "directory",
        metavar="DIR",
        type=os.path.expanduser,
        help="a records directory (bcrecord run --save-dir, bcrecord demo, bcrecord.save, a training hook)",
    )
    p.add_argument("--no-plots", action="store_true", help="only print the summary table")
    p.add_argument(
        "--key",
        action="append",
        metavar="GLOB",
        help="only keys matching GLOB (repeatable); the plots folder then holds only their pictures",
    )
    p.add_argument(
        "--max-maps",
        type=_positive,
        default=32,
        metavar="N",
        help="feature maps per grid picture (default 32)",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    p.set_defaults(run=_view, parser=p)

    p = commands.add_parser("demo", help="record inside a small CNN, print the table and write plots")
    p.add_argument(
        "--out",
        default="bcrecord-demo",
        type=os.path.expanduser,
        metavar="DIR",
        help="where records and plots go (default ./bcrecord-demo)",
    )
    p.add_argument("--steps", type=int, default=5, help="training steps to record (default 5)")
    p.add_argument("--no-plots", action="store_true", help="skip the pictures (no matplotlib needed)")
    p.set_defaults(run=_demo, parser=p)
    return parser


def _console() -> int:
    """The ``bcrecord`` command: :func:`main` with the working directory first on
    ``sys.path``, as ``python -m bcrecord`` has it (a console script has its own
    ``bin/`` there), so that ``targets``, ``show`` and ``run -m`` find the user's modules.
    Under ``PYTHONSAFEPATH`` (``python -P``) or ``python -I`` nothing is added, as ``python -m``
    adds nothing then."""
    try:
        here = os.getcwd()
    except OSError:  # the working directory was removed: python -m adds none then
        here = None
    from .runner import safe_path

    if not safe_path() and here is not None:
        script_folder = os.path.dirname(os.path.realpath(sys.argv[0]))
        if sys.path and os.path.realpath(sys.path[0] or os.curdir) == script_folder:
            sys.path[0] = here
        else:
            sys.path.insert(0, here)
    return main()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit code.

    >>> main(["targets", "no_colon_here"])  # the message goes to stderr
    2
    """
    # Now, before any of the user's modules is imported (a program's own utils.py, the module
    # of 'targets mod:f'): those are theirs, not bcrecord's, and are never named below.
    taken = _taken_so_far()
    try:
        return _main(argv)
    except Exception:
        # bcrecord's own failure (the program's are the program's): where it imported a module
        # of the working directory as its own (a program's platform.py), that is likely why.
        if taken and sys.stderr is not None:
            from .runner import _taken_warning

            print(_taken_warning(taken), file=sys.stderr)
        raise


def _taken_so_far() -> List[str]:
    """The working directory's modules bcrecord has imported as its own so far (none, if it cannot tell)."""
    try:
        from .runner import taken_from_the_working_directory

        return taken_from_the_working_directory()
    except Exception:  # (the runner itself may be what a taken module broke)
        return []


def _main(argv: Optional[Sequence[str]]) -> int:
    """:func:`main`, which says so where a module of the working directory broke it."""
    tokens = list(sys.argv[1:] if argv is None else argv)
    program_args: List[str] = []
    if tokens[:1] == ["run"]:
        tokens, program_args = _split_run(tokens)
    elif tokens[:1] == ["show"]:
        tokens = _split_show(tokens)
    args, unknown = _parser().parse_known_args(tokens)
    if unknown:
        # Said by the command's own parser, whose usage is the one that helps.
        hint = ""
        if args.command == "run" and "-c" in unknown:
            hint = " (bcrecord run runs a script or -m module: save the -c code as a script)"
        args.parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    # A "--" before the script ends bcrecord's options; after -m MODULE it is the program's own.
    if getattr(args, "args", None) and args.args[0] == "--":
        args.args = args.args[1:]
    if program_args:
        args.args = list(args.args) + program_args
    try:
        return int(args.run(args))
    except BcrecordError as error:
        print(f"bcrecord: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `bcrecord targets ... | head`: the reader left; say nothing more
        _drop_output()
        return 1


def _drop_output() -> None:
    """Send what standard output still holds to the null device: writing it failed, and the
    interpreter would try again at exit and report that failure as a second one."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class _Output:
    """Standard output as ``targets``, ``show`` and ``view`` write their report to it: a write
    that fails (a full disk behind ``> file``) is said in one line, not as a traceback.

    A closed pipe is left to :func:`main`, which says nothing: its reader left on purpose.
    No standard output at all (``>&-``: ``sys.stdout`` is None) is written nothing, as
    ``print`` writes nothing there.
    """

    def __init__(self) -> None:
        # A key or local the terminal's encoding lacks is written escaped (run's report does so too).
        reconfigure = getattr(sys.stdout, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")

    @property
    def encoding(self) -> Optional[str]:
        """Standard output's encoding, which ``view`` measures its table's columns by (None: none)."""
        return getattr(sys.stdout, "encoding", None)

    def write(self, text: str) -> int:
        if sys.stdout is None:
            return len(text)
        with self._failing_said():
            return sys.stdout.write(text)

    def flush(self) -> None:
        if sys.stdout is None:
            return
        with self._failing_said():
            sys.stdout.flush()

    @staticmethod
    @contextlib.contextmanager
    def _failing_said() -> Iterator[None]:
        try:
            yield
        except BrokenPipeError:
            raise
        except OSError as error:
            _drop_output()
            raise BcrecordError(f"could not write the output: {error.strerror or error}") from None
