"""Reading probed code objects, for tests that check which probes are armed."""

import dis


def probes_in(code):
    """How many inserted probes ``code`` has (each loads one of bcrecord's names)."""
    return sum(
        1
        for ins in dis.get_instructions(code)
        if ins.opname == "LOAD_GLOBAL" and str(ins.argval).startswith("__bcrecord_")
    )
