"""Forking while another thread holds one of bcrecord's locks, for the tests of each module's locks."""

import os
import signal
import threading
import time
import warnings


def fork_while_held(lock, in_child, wait=10):
    """Fork while another thread holds ``lock``; ``in_child()`` runs in the child, whose
    output is its repr, or ``'hung'`` when the child did not end within ``wait`` seconds
    (then it is killed), or the exception it raised."""
    held, forking = threading.Event(), threading.Event()

    def holder():
        with lock:
            held.set()
            forking.wait(wait)  # let go only once the fork is under way

    # Registered after bcrecord's own, so run before them: the holder still holds the
    # lock when they start (it needs the GIL, which the forking thread keeps, to let go).
    os.register_at_fork(before=forking.set)
    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(wait)
    read, write = os.pipe()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # "fork() in a multi-threaded process"
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                try:
                    out = repr(in_child())
                except BaseException as error:
                    out = f"raised {error!r}"
                os.write(write, out.encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as child:
            deadline = time.monotonic() + wait
            while not os.waitpid(pid, os.WNOHANG)[0]:
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    return "hung"
                time.sleep(0.01)
            return child.read()
    finally:
        forking.set()
        thread.join()
