#!/usr/bin/python3
"""The layering rule of docs/architecture.md ("Layers"), checked over the include graph.

Every folder of src/ is a layer. A file may include its own layer's headers, the public API
(include/ckpt/, "ckpt/..."), system and third-party headers, and the headers of the layers
beneath its own (MAY_INCLUDE below, followed down): never a layer above it, nor one beside it
(client and cuda, say, neither include the other). The public headers include only each
other. A folder of src/ that is in no layer is an error too, so the rule covers every file.

  check_layers.py [ROOT]    check the tree at ROOT (default: this checkout); exit 1 on a
                            violation, listing each as file:line: what
  check_layers.py --self-test
                            run the checker on small temporary trees with upward, sideways
                            and public-header violations and a layer-less folder, and on a
                            clean one; exit 1 unless it finds exactly those
"""
import os
import re
import sys
import tempfile

# Each layer and the layers directly beneath it (DESIGN.md, "Layers"):
#   common < shm < format ; common < protocol ; format, protocol, shm < plan
#   < loader, client, cuda < gpu_plugin (the plugin wraps the engine; not the client)
#   loader < remote (remote sources: the HttpReader engine of the loader) < daemon
#   < daemon, ctl, python, torch
# shm sits below format inside their tier: the parsers check their limits against the
# segment format (shm/segment_format.h).
MAY_INCLUDE = {
    "common": [],
    "shm": ["common"],
    "protocol": ["common"],
    "format": ["shm"],
    "plan": ["format", "protocol", "shm"],
    "loader": ["plan"],
    "client": ["plan"],
    "cuda": ["plan"],
    "gpu_plugin": ["cuda"],
    "remote": ["loader"],
    "daemon": ["loader", "client", "cuda", "remote"],
    "ctl": ["loader", "client", "cuda"],
    "python": ["loader", "client", "cuda"],
    "torch": ["loader", "client", "cuda"],
}
PUBLIC = "ckpt"  # include/ckpt/: anyone may include it
SOURCE_EXTENSIONS = (".h", ".hpp", ".c", ".cc", ".cpp", ".cu", ".cuh")
# Only quoted includes name the project's own headers (<cuda/std/...> is the CUDA toolkit's).
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def beneath(layer):
    """Every layer `layer` may include, its own excepted."""
    seen, todo = set(), list(MAY_INCLUDE[layer])
    while todo:
        below = todo.pop()
        if below not in seen:
            seen.add(below)
            todo.extend(MAY_INCLUDE[below])
    return seen


def includes(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m:
                yield number, m.group(1)


def source_files(top):
    for folder, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(SOURCE_EXTENSIONS):
                yield os.path.join(folder, name)


def check(root):
    """The violations in the tree at `root`, as 'file:line: what' strings."""
    problems = []
    src = os.path.join(root, "src")
    below = {layer: beneath(layer) for layer in MAY_INCLUDE}
    for entry in sorted(os.listdir(src)):
        if os.path.isdir(os.path.join(src, entry)) and entry not in MAY_INCLUDE:
            problems.append(f"src/{entry}: a folder in no layer (add it to docs/architecture.md's Layers "
                            f"and to MAY_INCLUDE in tests/layers/check_layers.py)")
    for path in source_files(src):
        rel = os.path.relpath(path, root)
        layer = rel.split(os.sep)[1]
        if layer not in MAY_INCLUDE:
            continue
        for number, target in includes(path):
            first = target.split("/")[0]
            if "/" not in target or first == PUBLIC or first == layer or first not in MAY_INCLUDE:
                continue  # own folder, public API, system or third-party
            if first in below[layer]:
                continue
            way = "upward" if layer in below[first] else "sideways"
            problems.append(f"{rel}:{number}: {layer} includes \"{target}\" ({way}: {layer} may include "
                            f"{', '.join(sorted(below[layer])) or 'no other layer'})")
    public = os.path.join(root, "include", PUBLIC)
    if os.path.isdir(public):
        for path in source_files(public):
            rel = os.path.relpath(path, root)
            for number, target in includes(path):
                if "/" in target and target.split("/")[0] in MAY_INCLUDE:
                    problems.append(f"{rel}:{number}: a public header includes \"{target}\" (the public API "
                                    f"includes only ckpt/ and system headers)")
    return problems


def self_test():
    def write(root, rel, text):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    failures = []
    with tempfile.TemporaryDirectory() as root:
        write(root, "src/common/status.h", "#pragma once\n#include <string>\n")
        write(root, "src/plan/tp_plan.cc", '#include "ckpt/tp_plan.h"\n#include "plan/tp_families.h"\n'
                                           '#include "common/status.h"\n#include <nlohmann/json.hpp>\n')
        write(root, "src/plan/tp_families.h", "#pragma once\n")
        write(root, "src/cuda/engine.cc", '#include "plan/tp_families.h"\n')
        write(root, "src/gpu_plugin/entry.cc", '#include "cuda/engine.h"\n#include "plan/tp_families.h"\n'
                                               '#include <cuda/std/atomic>\n')
        write(root, "src/daemon/main.cc", '#include "loader/x.h"\n#include "shm/y.h"\n')
        write(root, "include/ckpt/tp_plan.h", '#pragma once\n#include "ckpt/status.h"\n')
        clean = check(root)
        if clean:
            failures.append(f"a clean tree was reported: {clean}")
        write(root, "src/plan/shard.cc", '#include "ckpt/shard.h"\n\n#include "client/gpu_plugin.h"\n')
        write(root, "src/client/gpu_plugin.h", '#pragma once\n  #  include "cuda/gpu_loader_impl.h"\n')
        write(root, "src/gpu_plugin/nccl.cc", '#include <cstdio>\n#include "client/gpu_plugin.h"\n')
        write(root, "src/common/hex.cc", '#include "format/load_plan.h"\n')
        write(root, "include/ckpt/gpu.h", '#include "cuda/gpu_loader_impl.h"\n')
        write(root, "src/mystery/x.cc", '#include "client/gpu_plugin.h"\n')
        found = check(root)
        expected = [
            ("src/mystery: a folder in no layer", None),
            ("src/client/gpu_plugin.h:2: client includes \"cuda/gpu_loader_impl.h\" (sideways", None),
            ("src/common/hex.cc:1: common includes \"format/load_plan.h\" (upward", None),
            ("src/gpu_plugin/nccl.cc:2: gpu_plugin includes \"client/gpu_plugin.h\" (sideways", None),
            ("src/plan/shard.cc:3: plan includes \"client/gpu_plugin.h\" (upward", None),
            ("include/ckpt/gpu.h:1: a public header includes \"cuda/gpu_loader_impl.h\"", None),
        ]
        for want, _ in expected:
            if not any(p.startswith(want) for p in found):
                failures.append(f"not reported: {want}")
        if len(found) != len(expected):
            failures.append(f"{len(found)} violations reported, {len(expected)} expected: {found}")
        if main([root]) != 1:
            failures.append("the command exited 0 on a tree with violations")
    for f in failures:
        print("self-test FAILED:", f)
    if not failures:
        print(f"self-test ok: a clean tree passes, the {len(expected)} planted violations are each reported")
    return 1 if failures else 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    root = argv[0] if argv else os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s) break the layering of docs/architecture.md (Layers)")
        return 1
    print(f"ok: every include of {root}/src and include/ckpt follows the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
