"""The README's Python examples run as written (torch ones in tests/models)."""

import ast
import configparser
import contextlib
import io
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def python_blocks(torch: bool):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return [b for b in blocks if ("import torch" in b) == torch]


def claimed_values(block):
    """``(expression, value)`` for each line ``expression  # value: what it is`` of a block."""
    for line in block.splitlines():
        code, _, comment = line.partition("  # ")
        if not code.strip() or code.startswith((" ", "#")) or not comment:
            continue
        for end in [m.start() for m in re.finditer(": ", comment)]:
            try:
                yield code.strip(), ast.literal_eval(comment[:end])
            except (ValueError, SyntaxError):
                continue
            break


def test_core_examples_run_and_say_what_they_claim():
    namespace = {"__name__": "__main__"}
    blocks = python_blocks(torch=False)
    assert len(blocks) >= 3
    printed = {}
    checked = 0
    for block in blocks:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            exec(compile(block, str(README), "exec"), namespace)
        printed[block] = out.getvalue()
        for expression, value in claimed_values(block):  # what a comment says the line gives
            assert eval(expression, namespace) == value, expression
            checked += 1
    assert checked == 5
    # The table printed after the first example is what targets() prints for it.
    pattern = r"```python\n(print\(bcrecord.targets\(ToyModel.forward\)\)\n)```\n```\n(.*?)```"
    shown = re.search(pattern, README.read_text(), re.S)
    table = shown.group(2)
    if sys.version_info < (3, 11):  # no column positions on 3.10: '8:18 ' is '8    '
        table = re.sub(r"(\d+)(:\d+)", lambda m: m.group(1) + " " * len(m.group(2)), table)
    assert printed[shown.group(1)] == table
    rec = namespace["rec"]
    assert rec.keys() == ["__main__:area:a@0", "__main__:area:return"]
    assert namespace["summed"]([1, 2]) == -3


def test_the_measured_costs_quoted_are_those_of_benchmarks_results():
    # The README quotes case 7b of benchmarks/RESULTS.md: regenerating it must update the README.
    results = (README.parent / "benchmarks" / "RESULTS.md").read_text()

    def ratio(variant):
        return float(re.search(rf"\| {re.escape(variant)} \| ([\d.]+)x \|", results).group(1))

    every_site = "every Bottleneck call site recorded (clone)"
    hooks = "forward hooks, clone of every module call"
    probes = "the same, reduced to a number (probes only)"
    measured = [
        ratio(f"glibc's defaults: {every_site}"),
        ratio(f"glibc's defaults: {hooks}"),
        ratio(f"freed memory kept (MALLOC_*): {every_site}"),
        ratio(f"freed memory kept (MALLOC_*): {hooks}"),
        ratio(f"glibc's defaults: {probes}"),
    ]
    text = " ".join(README.read_text().split())
    quoted = re.search(
        r"the default clones cost ([\d.]+)x the unpatched forward and cloning forward hooks ([\d.]+)x; "
        r"started with .*? \(glibc keeps freed memory for reuse\), ([\d.]+)x and ([\d.]+)x\. The probes "
        r"themselves \(each value reduced to a number\) cost ([\d.]+)x",
        text,
    )
    assert quoted is not None
    for said, result in zip(map(float, quoted.groups()), measured, strict=True):
        assert abs(said - result) <= 0.0051, (said, result)


def test_how_it_works_shows_what_bcrecord_show_prints():
    if sys.version_info[:2] != (3, 12):
        import pytest

        pytest.skip("the README shows Python 3.12's bytecode")
    import bcrecord
    from bcrecord.listing import side_by_side

    shown = re.search(r"## How it works.*?```\n(.*?)```", README.read_text(), re.S).group(1)
    namespace = {}
    exec("def scale(self, x):\n    y = x * self.factor\n    return y\n", namespace)
    previous = bcrecord.set_probe_style("inline")  # the README shows the inline spelling
    try:
        with bcrecord.patch_function(namespace["scale"], ["y", "self.factor@0"]) as patch:
            printed = side_by_side(patch.original_code, patch.code)
    finally:
        bcrecord.set_probe_style(previous)

    def site_ids_out(listing):  # site ids depend on what this process patched before
        return re.sub(r"LOAD_CONST( +)\d+$", r"LOAD_CONST\1N", listing.rstrip(), flags=re.M)

    assert site_ids_out(printed) == site_ids_out(shown)


def test_the_reliability_reproductions_print_what_their_comments_say():
    # docs/RELIABILITY.md's reproductions (all but the 10,000-patch memory one, which
    # tests/test_stress.py measures): what each prints is what its comments say.
    text = (README.parent / "docs" / "RELIABILITY.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 4

    def printed(block):
        namespace = {"__name__": "__main__"}
        with contextlib.redirect_stdout(io.StringIO()) as out:
            exec(compile(block, "docs/RELIABILITY.md", "exec"), namespace)
        return out.getvalue().splitlines()

    retention, recursion, contexts, _ = blocks
    assert "# <Thing object>: held as __main__:make:thing@0" in retention
    none, held = printed(retention)
    assert none == "None" and held.startswith("<__main__.Thing object at ")
    assert "# now (inline):     no difference at any headroom on 3.10-3.13" in recursion
    # A script of its own: it sets the recursion limit from the depth it counts, which pytest's
    # frames above it would put off; and there its probes are inline, as the comment says.
    done = subprocess.run([sys.executable, "-c", recursion], capture_output=True, text=True, check=True)
    lines = [line.split(" ", 1) for line in done.stdout.splitlines()]
    assert [h for h, _ in lines] == ["1", "2", "3", "4", "5"]
    assert all(both == "ok ok" for _, both in lines), lines
    said = [ast.literal_eval(c) for c in re.findall(r"print\(rec\.keys\(\)\) +# (.*)", contexts)]
    assert said == [[], ["m:f:y@0"]]
    assert [ast.literal_eval(line) for line in printed(contexts)] == said


def test_the_supported_line_names_the_declared_bounds_and_every_pinned_version_tested():
    """The README's "Supported" line gives setup.cfg's lower bounds and the torch versions tox tests;
    tox tests the lowest bytecode on 3.13 too, where pip would pick a newer one."""
    root = README.parent
    supported = README.read_text().split("* Supported: ", 1)[1].split("\n* ", 1)[0]
    setup = (root / "setup.cfg").read_text()
    declared = r'^\s+(bytecode|torch)>=([\d.]+)(?:; python_version (>=|<) "3.14")?$'
    bounds = sorted(set(re.findall(declared, setup, flags=re.M)))
    assert bounds == [("bytecode", "0.17", "<"), ("bytecode", "0.18", ">="), ("torch", "2.1", "")]
    for name, bound, before in bounds:
        assert f"`{name}>={bound}`{' on 3.14' if before == '>=' else ''}" in supported
    tox = (root / "tox.ini").read_text()
    lowest = r"^\[testenv:(py3\d+)-bytecode017\]\n(?:.*\n)*?    bytecode==([\d.]+)$"
    assert re.findall(lowest, tox, flags=re.M) == [("py313", "0.17.0")]
    pinned = set(re.findall(r"\btorch==([\d.]+)", tox))
    assert pinned == {"2.13.0", "2.14.1"}
    assert [version for version in sorted(pinned) if version not in supported] == []


def test_the_reliability_summary_quotes_the_newest_run_and_the_totals_table():
    # The summary's figures: the probes of the newest stdlib rerun (what is current), and the
    # totals row of the full table it names by commit (functions and events were counted there only).
    text = (README.parent / "docs" / "RELIABILITY.md").read_text()
    summary = " ".join(text.split("**Summary.**", 1)[1].split("\n\n", 1)[0].split())
    reruns = re.findall(r"\*\*Reruns? on (\d{4}-\d\d-\d\d)\*\*.*?\n\n(\|.*?)\n\n", text, flags=re.S)
    date, table = max(run for run in reruns if " probes |" in run[1].splitlines()[0])  # the stdlib's
    rows = [line.split("|")[1:-1] for line in table.splitlines()]
    column = [cell.strip() for cell in rows[0]].index("probes")
    newest = sum(int(row[column].replace(",", "")) for row in rows[2:])
    assert f"{newest:,} probes in the newest run, {date}" in summary
    total = re.search(r"^\| \*\*all\*\* \| (.*) \|$", text, flags=re.M).group(1).split(" | ")
    functions, probes, events, tests = (int(total[i].replace(",", "")) for i in (1, 4, 6, 7))
    assert summary.startswith(f"{tests:,} regression tests of 38 modules on four interpreters")
    millions = round(events / 1e6)
    assert f"{probes:,} probes in {functions:,} functions firing {millions} million times" in summary


def third_party_imports(source):
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    return imported - set(sys.stdlib_module_names) - {"bcrecord"}


def installed_by(command):
    """The distributions ``pip install <command>`` asks for, bcrecord's extras resolved."""
    # (configparser: the copy of setup.cfg in an sdist has its lines indented by tabs)
    setup = configparser.ConfigParser()
    setup.read(README.parent / "setup.cfg")
    extras = dict(setup["options.extras_require"])
    installed = set()
    for word in command.replace("'", "").split():
        name, _, chosen = word.partition("[")
        installed.add(name)
        for extra in chosen.rstrip("]").split(",") if chosen else []:
            lines = filter(None, map(str.strip, extras[extra].splitlines()))
            installed |= {re.split(r"[<>=]", line)[0] for line in lines}
    return installed


def test_each_example_can_run_after_the_install_command_before_it():
    # A reader runs the last `pip install ...` the README gives before a block, then the block:
    # every package the block imports must come with that command (through bcrecord's extras too).
    text = README.read_text()
    checked = 0
    for match in re.finditer(r"```python\n(.*?)```", text, flags=re.S):
        imported = third_party_imports(match.group(1))
        if imported:
            command = re.findall(r"`pip install ([^`]*)`", text[: match.start()])[-1]
            assert imported <= installed_by(command), (command, imported)
            checked += 1
    assert checked >= 1


def test_each_example_script_says_what_to_install():
    # Each docs/examples script that uses bcrecord names a pip install that brings what it imports,
    # and safetensors where it saves tensors (transformers depends on safetensors itself).
    checked = 0
    for script in sorted((README.parent / "docs" / "examples").glob("*.py")):
        source = script.read_text()
        if "import bcrecord" not in source:
            continue  # a program the others run (train_plain.py), or a config
        commands = re.findall(r"``pip install ([^`]*)``", source)
        assert commands, f"{script.name} does not say what to pip install"
        installed = installed_by(commands[0])
        assert third_party_imports(source) <= installed, (script.name, commands[0])
        if re.search(r"bcrecord\.save\(|--save-dir|save_dir=", source):
            assert installed & {"safetensors", "transformers"}, (script.name, commands[0])
        checked += 1
    assert checked == 6


def test_the_reliability_summary_counts_the_generated_programs_its_tables_give():
    text = (README.parent / "docs" / "RELIABILITY.md").read_text()
    summary = " ".join(text.split("**Summary.**", 1)[1].split("\n\n", 1)[0].split())
    long_run = re.search(r"long run, `BCRECORD_HYPOTHESIS_EXAMPLES=\d+` \((\d+) / (\d+) / (\d+)\)", text)
    per_interpreter = sum(int(n) for n in long_run.groups())
    campaign = text.split("**Campaign of ", 1)[1].split("\n\n", 2)[1]
    programs = sum(int(n) for n in re.findall(r"\| (\d+) passing", campaign))
    in_all = 4 * per_interpreter  # four interpreters
    assert f"{per_interpreter:,} examples per interpreter in the long runs ({in_all:,} in all)" in summary
    assert f"{programs:,} more `generated_functions` programs in the campaign of" in summary


def test_the_stores_the_compiler_drops_are_dropped_where_said():
    import bcrecord

    text = " ".join(README.read_text().split())
    said = re.search(r"On (3\.\d+) and (3\.\d+) the compiler drops a store .*?\(`_, _, h = shape`", text)
    namespace = {}
    exec("def f(shape):\n    _, _, h = shape\n    return h\n", namespace)
    dropping = [tuple(map(int, version.split("."))) for version in said.groups()]
    expected = ["_@0", "h@0"] if sys.version_info[:2] in dropping else ["_@0", "_@1", "h@0"]
    assert [s for s in bcrecord.targets(namespace["f"]).specs() if s != "return"] == expected


def test_the_formatting_3_14_compiles_otherwise_is_as_said():
    import bcrecord

    text = " ".join(README.read_text().split())
    said = re.search(
        r"3\.14's compiler folds more or less: `(.+?)` is f-string code there \(no `%` operator\), "
        r"and `(.+?)` stays a `%`, where 3\.13 makes it f-string code",
        text,
    )

    def operators(expression):
        namespace = {}
        exec(f"def f(x, y):\n    s = {expression}\n    return s\n", namespace)
        return [s for s in bcrecord.targets(namespace["f"]).specs() if s.startswith("%")]

    on_314 = sys.version_info >= (3, 14)
    assert operators(said.group(1)) == ([] if on_314 else ["%@0"])
    assert operators(said.group(2)) == (["%@0"] if on_314 else [])
