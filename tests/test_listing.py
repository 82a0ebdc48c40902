"""Listings of what a patch inserts (:mod:`bcrecord.listing`)."""

import bcrecord
from bcrecord.listing import decompiled, instructions_text, side_by_side


def scaled(a, k):
    y = a * k
    return y + 1


def test_instructions_text_one_row_per_instruction_with_lines():
    rows = instructions_text(scaled.__code__).splitlines()
    first = scaled.__code__.co_firstlineno
    store = next(row for row in rows if row.split()[1] == "STORE_FAST")
    assert int(store.split()[0]) == first + 1 and store.split()[-1] == "y"
    assert "CACHE" not in "\n".join(rows)
    assert rows[-1].split()[1].startswith("RETURN")


def test_side_by_side_marks_only_the_inserted_instructions():
    with bcrecord.patch_function(scaled, ["y", "return"]) as patch:
        lines = side_by_side(patch.original_code, patch.code, width=40).splitlines()
    body = lines[2:]
    plus = [line for line in body if line.startswith("+")]
    # "~": an instruction rewritten in place (3.13's LOAD_FAST_LOAD_FAST pairs are split).
    kept = [line for line in body if line.startswith((" ", "~"))]
    # Every original instruction is still there, on the left, in order.
    left = [line[2:42].split() for line in kept if line[2:42].strip()]
    original = [row.split() for row in instructions_text(scaled.__code__).splitlines()]
    assert [row[1] for row in left] == [row[1] for row in original]
    # Two probes (after the store, before the return), each citing the probe or the sinks getter.
    assert sum("bcrecord" in line for line in plus) == 2
    assert all(line[2:42].strip() == "" for line in plus)  # nothing on the original's side


def stepped(i):
    loss = i * 2.0
    loss = loss + 1
    return loss


def test_side_by_side_pairs_each_original_instruction_with_itself_not_with_a_probe_s():
    # The probe after `loss = loss + 1` loads loss (line 3) as the return does (line 4): the
    # original's `4 LOAD_FAST loss` stood beside the probe's `3 LOAD_FAST loss`, and the
    # return's own load was marked '+', inserted.
    with bcrecord.patch_function(stepped, ["loss@1", "return"]) as patch:
        lines = side_by_side(patch.original_code, patch.code, width=40).splitlines()
    kept = [line for line in lines[2:] if line.startswith(" ")]
    assert kept and all(line[2:42].rstrip() == line[45:] for line in kept), "\n".join(lines)
    first = stepped.__code__.co_firstlineno
    own = [line[45:].split() for line in lines[2:] if not line.startswith("+")]
    loads = [
        int(row[0]) - first for row in own if row[1:] in (["LOAD_FAST", "loss"], ["LOAD_FAST_BORROW", "loss"])
    ]
    assert loads == [2, 3]  # (3.14 loads a local it can borrow with LOAD_FAST_BORROW)


def test_side_by_side_of_identical_code_marks_nothing():
    lines = side_by_side(scaled.__code__, scaled.__code__).splitlines()
    assert not any(line.startswith(("+", "~", "-")) for line in lines[2:])


def test_decompiled_is_source_like_or_none():
    text = decompiled(scaled.__code__)
    assert text is None or ("return" in text and "y" in text)
