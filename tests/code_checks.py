"""Reading probed code objects, for tests that check which probes are armed."""

import dis

from bcrecord.rewrite import SINKS_GET


def probes_in(code):
    """How many inserted probes ``code`` has (each loads bcrecord's probe or sinks getter)."""
    return sum(
        1
        for ins in dis.get_instructions(code)
        if (ins.opname == "LOAD_GLOBAL" and str(ins.argval).startswith("__bcrecord_"))
        or ins.argval is SINKS_GET
    )
