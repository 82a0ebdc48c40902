"""The README's Python examples run as written (torch ones in tests/models)."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def python_blocks(torch: bool):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return [b for b in blocks if ("import torch" in b) == torch]


def test_core_examples_run_and_say_what_they_claim():
    namespace = {"__name__": "__main__"}
    blocks = python_blocks(torch=False)
    assert len(blocks) >= 3
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    rec = namespace["rec"]
    assert rec.keys() == ["__main__:area:a@0", "__main__:area:return"]
    assert namespace["summed"]([1, 2]) == -3
