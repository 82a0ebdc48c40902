"""Reading probed code objects, for tests that check which probes are armed; collecting garbage fully."""

import dis
import gc

from bcrecord.rewrite import SINKS_GET


def probes_in(code):
    """How many inserted probes ``code`` has (each loads bcrecord's probe or sinks getter)."""
    return sum(
        1
        for ins in dis.get_instructions(code)
        if (ins.opname == "LOAD_GLOBAL" and str(ins.argval).startswith("__bcrecord_"))
        or ins.argval is SINKS_GET
    )


def collect_all(passes=10):
    """Run the cyclic collector until a pass frees nothing (at most ``passes`` times).

    One pass is not enough for what earlier tests left: the finalizers it runs (a dropped
    patch's removal, weakref callbacks) let go of more, which only the next pass frees, so
    a count taken after one pass could drop later, inside what a test measures.
    """
    for _ in range(passes):
        if gc.collect() == 0:
            return
