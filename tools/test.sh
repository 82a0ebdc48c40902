#!/usr/bin/env bash
# The whole test suite: every tox environment (core tests on Python 3.10-3.13, the torch,
# models, MMEngine, Lightning and transformers environments, and lint), then the core tests
# on Python 3.14 (py314) where one can be had.
# Installs what it needs; finds the pyenv interpreters on its own.
set -euo pipefail
cd "$(dirname "$0")/.."
# tox goes into the active virtual environment, if any (else into the newest pyenv Python below).
py=python3
if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  py="$VIRTUAL_ENV/bin/python"
fi
if command -v pyenv >/dev/null 2>&1; then
  for v in 3.10 3.11 3.12 3.13 3.14; do
    dir=$(ls -d "$(pyenv root)"/versions/"$v".* 2>/dev/null | sort -V | tail -n 1 || true)
    [ -n "$dir" ] && PATH="$dir/bin:$PATH"
  done
  export PATH
fi
"$py" -m pip install --quiet --disable-pip-version-check "tox>=4"
# Python 3.14 (py314): pyenv's or the system's, else Debian's build (tools/python314.sh).
python314=$(command -v python3.14 || bash tools/python314.sh || true)
if [ -n "$python314" ]; then
  PATH="$(dirname "$python314"):$PATH"
fi
if [ $# -gt 0 ]; then
  exec "$py" -m tox run "$@"
fi
# py314 runs even when an env above failed, so one run reports every failure; the exit
# status is the first failure's.
status=0
"$py" -m tox run || status=$?
if [ -n "$python314" ]; then
  "$py" -m tox run -e py314 || { rc=$?; [ "$status" -ne 0 ] || status=$rc; }
else
  echo "tools/test.sh: py314 not run: no Python 3.14 here, and tools/python314.sh could not fetch one (why: above)" >&2
fi
exit "$status"
