#!/usr/bin/env bash
# pip_install_test.sh SOURCE_DIR WORK_DIR TORCH_PYTHON: issue 13, "pip like any PyTorch
# extension". A read-only copy of the checkout; `pip install` of its python/ into a venv
# (python -m venv --system-site-packages, so torch is the system's) with pip's default
# build isolation and no index (nothing may come from the network), then `pip wheel`;
# the installed package imports from outside the tree and has the extension and, in a
# CUDA build, the GPU plugin beside it; a Python without torch is refused with what to do
# (issue 22). WORK_DIR keeps the CMake build between runs
# (CKPT_PIP_BUILD_DIR) so that a re-run is incremental.
set -euo pipefail
src=$(cd "$1" && pwd) work=$2 py=$3
mkdir -p "$work"
work=$(cd "$work" && pwd)
copy=$work/src venv=$work/venv
if [ -z "${CKPT_PIP_IN_NS:-}" ]; then
  rm -rf "$venv" "$work/wheels" "$work/out"
  if [ -d "$copy" ]; then chmod -R u+w "$copy"; fi
  rm -rf "$copy" && mkdir -p "$copy"
  # The checkout's files (tracked or not, but not ignored ones: no build directories).
  (cd "$src" && git ls-files -co --exclude-standard -z | tar --null --ignore-failed-read -T - -cf - 2> /dev/null) |
    tar -xf - -C "$copy"
  chmod -R a-w "$copy"
  # Read-only for root too: a read-only bind mount in a private mount namespace.
  if unshare -rm true 2> /dev/null; then exec env CKPT_PIP_IN_NS=1 unshare -rm "$0" "$@"; fi
else
  mount --bind "$copy" "$copy" && mount -o remount,bind,ro "$copy" "$copy"
fi
if touch "$copy/probe" 2> /dev/null; then echo "FAIL: the copy is writable"; exit 1; fi
export CKPT_PIP_BUILD_DIR=$work/build PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Issue 22: a Python without torch (a venv that does not see the system's packages) is
# stopped by the backend at once with what to do, not by pip's "No matching distribution
# found for torch", and builds nothing.
rm -rf "$work/bare" && "$py" -m venv "$work/bare"
if "$work/bare/bin/pip" install "$copy/python" > "$work/pip_bare.log" 2>&1; then
  echo "FAIL: pip install with a Python without torch succeeded"; exit 1
fi
for want in "$work/bare/bin/python" "has no torch" "venv --system-site-packages" "python3-torch"; do
  grep -qF -- "$want" "$work/pip_bare.log" || { echo "FAIL: no '$want' in:"; cat "$work/pip_bare.log"; exit 1; }
done
if grep -q "^ERROR: No matching distribution" "$work/pip_bare.log"; then
  echo "FAIL: pip went looking for torch:"; cat "$work/pip_bare.log"; exit 1
fi
echo "ok: a Python without torch is told which Python to use"
"$py" -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -v "$copy/python" > "$work/pip_install.log" 2>&1 || { tail -40 "$work/pip_install.log"; exit 1; }
echo "ok: pip install"
"$venv/bin/pip" wheel --no-deps -w "$work/wheels" "$copy/python" > "$work/pip_wheel.log" 2>&1 ||
  { tail -40 "$work/pip_wheel.log"; exit 1; }
ls "$work"/wheels/ckpt-*.whl
echo "ok: pip wheel"
find "$copy" -newer "$work/pip_install.log" -print -quit | grep -q . && { echo "FAIL: the build wrote into the source"; exit 1; }
mkdir -p "$work/out" && cd "$work/out"
unset PYTHONPATH
"$venv/bin/python" - "$venv" "$copy" << 'PY'
import os, sys, sysconfig, zipfile, glob
import torch
import ckpt
pkg = os.path.dirname(ckpt.__file__)
assert pkg.startswith(os.path.join(sys.argv[1], "lib")), f"not imported from the venv: {pkg}"
assert not pkg.startswith(sys.argv[2]), f"imported from the source tree: {pkg}"
plugin_built = os.path.exists(os.path.join(os.environ["CKPT_PIP_BUILD_DIR"], "lib", "libckptclient-cuda.so.0"))
names = os.listdir(pkg)
assert any(n.startswith("_ckpt") and n.endswith(".so") for n in names), names
if plugin_built:
    assert "libckptclient-cuda.so.0" in names, names
print("gpu_available:", ckpt._ckpt.gpu_available())
print("ok: import ckpt from", pkg, "with torch", torch.__version__)
whl = glob.glob(os.path.join(os.path.dirname(os.environ["CKPT_PIP_BUILD_DIR"]), "wheels", "ckpt-*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    members = z.namelist()
assert "ckpt/__init__.py" in members and any(m.startswith("ckpt/_ckpt") for m in members), members
assert any(m.endswith(".dist-info/RECORD") for m in members), members
print("ok: wheel", os.path.basename(whl), len(members), "files")
PY
