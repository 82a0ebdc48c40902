"""Fixtures shared by the tests: a project for the command line (``bcrecord targets``,
``show``, ``run``), and records holding a tensor, read where torch is missing."""

import textwrap

import pytest


@pytest.fixture
def project(tmp_path):
    """A script, a helper module next to it, and a package with a __main__."""
    (tmp_path / "helper.py").write_text(
        textwrap.dedent(
            """
            def twice(x):
                y = x * 2
                return y

            class Scaler:
                factor = 3

                def scale(self, v):
                    out = v * self.factor
                    out = out + 1
                    return out
            """
        )
    )
    (tmp_path / "prog.py").write_text(
        textwrap.dedent(
            """
            import sys
            import helper

            def accumulate(n):
                acc = 0
                for i in range(n):
                    acc = acc + i
                return acc

            print("argv", sys.argv[1:])
            total = 0
            for k in range(6):
                total += accumulate(k) + helper.twice(k) + helper.Scaler().scale(k)
            print("total", total, "tracing", sys.gettrace() is not None)
            print("a line on stderr", file=sys.stderr)
            code = sys.argv[1] if len(sys.argv) > 1 else "0"
            if code == "raise":
                raise ValueError("the program failed")
            if code == "message":
                sys.exit("fatal: stopped")
            sys.exit(int(code))
            """
        )
    )
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tool.py").write_text(
        textwrap.dedent(
            """
            import sys

            def main(argv):
                words = [w.upper() for w in argv]
                joined = " ".join(words)
                return joined

            if __name__ == "__main__":
                print(main(sys.argv[1:]))
                sys.exit(len(sys.argv) - 1)
            """
        )
    )
    return tmp_path


@pytest.fixture
def tensors_without_torch(tmp_path, monkeypatch):
    """A records directory holding a number ('n') and a tensor ('t', in a safetensors file),
    read where neither torch nor safetensors imports."""
    import json
    import sys

    import bcrecord

    folder = bcrecord.save({"n": [3]}, tmp_path / "out")
    row = {"key": "t", "step": 0, "file": "records/000002.safetensors", "name": "t#0#0", "kind": "tensor"}
    with open(folder / "index.jsonl", "a") as journal:
        journal.write(json.dumps({"entries": [row]}) + "\n")
    (folder / "records" / "000002.safetensors").write_bytes(b"")
    for name in ("torch", "safetensors", "safetensors.torch"):  # (None: not importable here)
        monkeypatch.setitem(sys.modules, name, None)
    return folder
