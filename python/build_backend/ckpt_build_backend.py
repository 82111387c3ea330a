"""PEP 517 build backend of the `ckpt` package (in-tree, standard library only).

    python3 -m pip install ./python   (a Python that has torch; Debian 12: see below)
    python3 -m pip wheel ./python -w dist

The interpreter that runs pip must have torch (the package's one dependency): without
it the backend stops at once, saying which Python to use, instead of pip's "No matching
distribution found for torch". On Debian 12, torch is the python3-torch package of
/usr/bin/python3, and pip may not install into that Python (PEP 668,
"externally-managed-environment"): use a venv that sees the system's packages,

    apt-get install python3-torch python3-venv
    /usr/bin/python3 -m venv --system-site-packages ~/ckpt-venv
    ~/ckpt-venv/bin/pip install ./python

It runs the project's CMake build in a temporary directory (the checkout may be
read-only), building the _ckpt extension for the interpreter that runs pip, and the GPU
plugin libckptclient-cuda.so.0 when nvcc is found, and writes the wheel itself: no
setuptools, no `wheel` package, nothing from the network (build requirements: none).
Needs what the C++ build needs (tools/install-deps.sh: CMake, a C++17 compiler, the
libraries, pybind11 or the pybind11 headers PyTorch ships).

Environment:
  CKPT_PIP_BUILD_DIR  build here and keep it (incremental rebuilds); default: a temporary
                      directory, removed afterwards
  CKPT_CMAKE_ARGS     extra arguments for CMake's configure step (shell syntax)
  CKPT_BUILD_JOBS     parallel build jobs (default: the CPU count)
  CKPT_SKIP_TORCH_CHECK=1  build even when this Python has no torch (a wheel made on a
                      build machine for another; pip then needs torch where it installs it)
"""
import base64
import csv
import glob
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(PYTHON_DIR)


def _project():
    """The [project] table of pyproject.toml (the subset this project uses: strings, lists
    of strings, an inline table, and [project.optional-dependencies]); no tomllib before 3.11."""
    table, section, key = {}, None, None
    with open(os.path.join(PYTHON_DIR, "pyproject.toml"), encoding="utf-8") as f:
        for raw in f:
            line = re.sub(r'^((?:[^"#]|"[^"]*")*)#.*$', r"\1", raw).strip()  # a comment, outside quotes
            if not line:
                continue
            m = re.fullmatch(r"\[([^\]]+)\]", line)
            if m:
                section = m.group(1)
                continue
            if section not in ("project", "project.optional-dependencies"):
                continue
            target = table if section == "project" else table.setdefault("optional-dependencies", {})
            m = re.fullmatch(r'([A-Za-z0-9_-]+)\s*=\s*(.*)', line)
            if not m:
                raise RuntimeError(f"pyproject.toml: cannot read {raw!r}")
            key, value = m.group(1), m.group(2)
            if value.startswith("["):
                target[key] = re.findall(r'"([^"]*)"', value)
            elif value.startswith("{"):
                target[key] = dict(re.findall(r'([A-Za-z0-9_-]+)\s*=\s*"([^"]*)"', value))
            else:
                target[key] = value.strip('"')
    return table


def _metadata():
    p = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}",
             f"Summary: {p.get('description', '')}", f"Requires-Python: {p.get('requires-python', '')}"]
    if "license" in p:
        lines.append(f"License: {p['license'].get('text', '')}")
    lines += [f"Requires-Dist: {d}" for d in p.get("dependencies", [])]
    for extra, deps in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
    return p, "\n".join(lines) + "\n"


def _tag():
    """cpXY-cpXY[t]-<platform> for the running interpreter (the extension is built for it)."""
    impl = "cp" if sys.implementation.name == "cpython" else sys.implementation.name[:2]
    py = f"{impl}{sys.version_info[0]}{sys.version_info[1]}"
    abi = py + getattr(sys, "abiflags", "")
    plat = re.sub(r"[-.]", "_", sysconfig.get_platform())
    return f"{py}-{abi}-{plat}"


def _dist_info(p):
    return f"{p['name']}-{p['version']}.dist-info"


def _cmake_env():
    """The environment for CMake: without pip's build-isolation overlay, so that CMake's
    checks run the target interpreter with its own site-packages (torch's headers)."""
    env = dict(os.environ)
    path = [x for x in env.get("PYTHONPATH", "").split(os.pathsep) if x and "pip-build-env" not in x]
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    else:
        env.pop("PYTHONPATH", None)
    env.pop("PYTHONNOUSERSITE", None)
    return env


def _torch_missing_message():
    """None when the interpreter running the backend imports torch (outside pip's build
    isolation, as the extension will run), else what to do, naming this interpreter."""
    if os.environ.get("CKPT_SKIP_TORCH_CHECK") == "1":
        return None
    probe = subprocess.run([sys.executable, "-c", "import torch"], env=_cmake_env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    if probe.returncode == 0:
        return None
    why = (probe.stderr.strip().splitlines() or ["import torch failed"])[-1]
    version = ".".join(map(str, sys.version_info[:3]))
    debian = os.path.exists("/etc/debian_version")
    lines = [
        f"ckpt: this Python ({sys.executable}, {version}) has no torch ({why}), and the ckpt package needs it.",
        "ckpt: without torch pip would next look for it on a package index (offline: \"No matching distribution",
        "ckpt: found for torch\"). Run pip with a Python that has torch:",
        "ckpt:   Debian 12: torch is the python3-torch package of /usr/bin/python3, which refuses pip installs",
        "ckpt:   (PEP 668); a venv that sees the system's packages takes it:",
        "ckpt:     apt-get install python3-torch python3-venv",
        "ckpt:     /usr/bin/python3 -m venv --system-site-packages ~/ckpt-venv",
        "ckpt:     ~/ckpt-venv/bin/pip install ./python",
        "ckpt:   another Python: install torch into it first (python -m pip install torch), then ./python.",
        "ckpt: (CKPT_SKIP_TORCH_CHECK=1 builds anyway, for a wheel meant for another machine.)",
    ]
    if sys.prefix != sys.base_prefix:
        lines.insert(1, f"ckpt: ({sys.prefix} is a venv: one made without --system-site-packages does not see "
                        "the system's torch)")
    elif debian and os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath(
            "/usr/bin/python3"):
        lines.insert(1, f"ckpt: ({sys.executable} is not Debian's /usr/bin/python3: is the wrong python3 first "
                        "on PATH?)")
    return "\n".join(lines)


def _require_torch():
    """Stops the build (exit status 1, the message on stderr, which pip shows) when this
    Python has no torch."""
    message = _torch_missing_message()
    if message is not None:
        print(message, file=sys.stderr, flush=True)
        raise SystemExit(1)


def _build(build_dir):
    args = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DCKPT_BUILD_TESTS=OFF",
            "-DCKPT_PYTHON=ON", f"-DPython3_EXECUTABLE={sys.executable}"]
    if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "Makefile")):
        args += ["-G", "Ninja"]
    if shutil.which("ccache"):
        args += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_C_COMPILER_LAUNCHER=ccache"]
    args += shlex.split(os.environ.get("CKPT_CMAKE_ARGS", ""))
    env = _cmake_env()
    print("ckpt:", " ".join(shlex.quote(a) for a in args), file=sys.stderr, flush=True)
    subprocess.check_call(args, env=env, stdout=sys.stderr)
    jobs = os.environ.get("CKPT_BUILD_JOBS") or str(os.cpu_count() or 2)
    subprocess.check_call(["cmake", "--build", build_dir, "--target", "_ckpt", "-j", jobs], env=env, stdout=sys.stderr)
    built = os.path.join(build_dir, "python", "ckpt")
    ext = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    if not os.path.exists(os.path.join(built, "_ckpt" + ext)):
        raise RuntimeError(f"the CMake build made no {built}/_ckpt{ext} (pybind11 or Python development files "
                           "missing? see the configure output above)")
    binaries = [os.path.join(built, "_ckpt" + ext)] + sorted(glob.glob(os.path.join(built, "libckptclient-cuda.so.*")))
    return binaries


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [arcname, f"sha256={digest}", str(len(data))]


# PEP 517 hooks -------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _require_torch()  # before pip resolves the dependency on torch from an index
    p, metadata = _metadata()
    d = os.path.join(metadata_directory, _dist_info(p))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w", encoding="utf-8") as f:
        f.write(metadata)
    with open(os.path.join(d, "WHEEL"), "w", encoding="utf-8") as f:
        f.write(_wheel_file())
    return _dist_info(p)


def _wheel_file():
    return f"Wheel-Version: 1.0\nGenerator: ckpt_build_backend\nRoot-Is-Purelib: false\nTag: {_tag()}\n"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _require_torch()
    p, metadata = _metadata()
    keep = os.environ.get("CKPT_PIP_BUILD_DIR")
    build_dir = os.path.abspath(keep) if keep else tempfile.mkdtemp(prefix="ckpt-pip-build-")
    try:
        binaries = _build(build_dir)
        files = []  # (arcname, bytes, mode)
        for src in sorted(glob.glob(os.path.join(PYTHON_DIR, "ckpt", "*.py"))):
            with open(src, "rb") as f:
                files.append(("ckpt/" + os.path.basename(src), f.read(), 0o644))
        for src in binaries:
            with open(src, "rb") as f:
                files.append(("ckpt/" + os.path.basename(src), f.read(), 0o755))
    finally:
        if not keep:
            shutil.rmtree(build_dir, ignore_errors=True)
    dist_info = _dist_info(p)
    license_path = os.path.join(ROOT, "LICENSE")
    meta = [(f"{dist_info}/METADATA", metadata.encode(), 0o644), (f"{dist_info}/WHEEL", _wheel_file().encode(), 0o644)]
    if os.path.exists(license_path):
        with open(license_path, "rb") as f:
            meta.append((f"{dist_info}/LICENSE", f.read(), 0o644))
    name = f"{p['name']}-{p['version']}-{_tag()}.whl"
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as whl:
        for arcname, data, mode in files + meta:
            info = zipfile.ZipInfo(arcname, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            whl.writestr(info, data)
            writer.writerow(_record_line(arcname, data))
        writer.writerow([f"{dist_info}/RECORD", "", ""])
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2026, 1, 1, 0, 0, 0))
        info.external_attr = (0o100644) << 16
        whl.writestr(info, record.getvalue())
    return name
