#!/usr/bin/env python3
"""Writes PyTorch checkpoints for the format tests, with reference bytes.

  torch_cases.py OUT_DIR

Every case is a state dict saved by real PyTorch. For each loadable case C, it writes
OUT_DIR/ref/C/manifest.json ({name: {"dtype": ..., "shape": [...]}}) and
OUT_DIR/ref/C/<name>.bin, the tensor's bytes in row-major order (from
t.contiguous(), through numpy), which is what the segment must hold bit for bit.
Needs Debian's python3-torch (/usr/bin/python3).
"""
import io
import json
import os
import pickle
import sys
import zipfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
from make_checkpoint import write_safetensors  # noqa: E402

ST_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
            torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
            torch.uint8: "U8", torch.bool: "BOOL", torch.complex64: "C64", torch.complex128: "C128"}


def raw(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous().reshape(-1)
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def write_ref(out: str, case: str, sd: dict) -> None:
    d = os.path.join(out, "ref", case)
    os.makedirs(d, exist_ok=True)
    manifest = {}
    for name, t in sd.items():
        manifest[name] = {"dtype": ST_NAMES[t.dtype], "shape": list(t.shape)}
        with open(os.path.join(d, name + ".bin"), "wb") as f:
            f.write(raw(t))
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def all_dtypes(g) -> dict:
    base = torch.randn(5, 7, generator=g) * 100
    sd = {}
    for dt in [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
               torch.int16, torch.int8, torch.uint8]:
        sd["t_" + str(dt).split(".")[1]] = base.to(dt)
    sd["t_bool"] = base > 0
    sd["t_complex64"] = torch.complex(base, -base)
    sd["t_complex128"] = torch.complex(base.double(), base.double() * 3)
    sd["scalar"] = torch.tensor(3.5)
    sd["empty"] = torch.zeros(0, 4)
    sd["special"] = torch.tensor([float("nan"), float("inf"), -0.0, 1e-40])
    return sd


def views(g) -> dict:
    big = torch.randn(8, 6, generator=g)
    w = torch.randn(16, 4, generator=g)
    sd = {
        "transposed": big.t(),                 # non-contiguous
        "column_slice": big[:, 1:4],           # non-contiguous, offset
        "row_slice": big[2:5],                 # contiguous, storage offset
        "every_other": big[::2, ::3],          # non-contiguous, strides > 1
        "expanded": torch.arange(3.0).expand(4, 3),  # stride 0
        "whole": big,                          # the storage itself
        "embed.weight": w,                     # tied weights: one tensor, two names
        "lm_head.weight": w,
        "half_t": torch.randn(3, 5, generator=g).half().t(),
    }
    return sd


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(1)

    sd = all_dtypes(g)
    torch.save(sd, os.path.join(out, "all_dtypes.pt"))
    write_ref(out, "all_dtypes", sd)

    sd = views(g)
    torch.save(sd, os.path.join(out, "views.bin"))
    write_ref(out, "views", sd)

    # An OrderedDict state dict from a real module, with parameters saved as nn.Parameter.
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 3))
    torch.save(model.state_dict(), os.path.join(out, "module.pt"))
    write_ref(out, "module", model.state_dict())
    params = dict(model.named_parameters())
    torch.save(params, os.path.join(out, "params.pt"))
    write_ref(out, "params", params)

    # Sharded folders: safetensors and .bin, each with its index.json.
    full = {f"layers.{i}.weight": torch.randn(4, 3, generator=g) for i in range(5)}
    full["norm.bias"] = torch.randn(3, generator=g).to(torch.bfloat16)
    names = list(full)
    shards = [names[:3], names[3:]]
    for kind, prefix, ext in [("st", "model", "safetensors"), ("bin", "pytorch_model", "bin")]:
        d = os.path.join(out, "sharded_" + kind)
        os.makedirs(d, exist_ok=True)
        weight_map = {}
        for i, part in enumerate(shards):
            fname = f"{prefix}-{i + 1:05d}-of-{len(shards):05d}.{ext}"
            part_sd = {n: full[n] for n in part}
            if ext == "safetensors":
                write_safetensors(os.path.join(d, fname), part_sd)
            else:
                torch.save(part_sd, os.path.join(d, fname))
            for n in part:
                weight_map[n] = fname
        with open(os.path.join(d, f"{prefix}.{ext}.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)
        write_ref(out, "sharded_" + kind, full)

    # A folder with a single pytorch_model.bin.
    d = os.path.join(out, "bin_folder")
    os.makedirs(d, exist_ok=True)
    torch.save(full, os.path.join(d, "pytorch_model.bin"))

    # More than 65535 zip entries: torch writes ZIP64 end-of-directory records.
    many = {f"t{i}": torch.full((1,), float(i)) for i in range(65600)}
    torch.save(many, os.path.join(out, "many.pt"))

    # Refused cases.
    torch.save(all_dtypes(g), os.path.join(out, "legacy.pt"), _use_new_zipfile_serialization=False)
    torch.save({"state_dict": {"w": torch.ones(2)}, "epoch": 3}, os.path.join(out, "nested.pt"))
    torch.save([torch.ones(2)], os.path.join(out, "list.pt"))

    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), os.path.join(out, "scripted.pt"))

    marker = os.path.join(out, "PWNED")

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + marker,))

    evil_pkl = pickle.dumps({"w": Evil()}, protocol=2)
    with zipfile.ZipFile(os.path.join(out, "evil.pt"), "w", zipfile.ZIP_STORED) as z:
        z.writestr("evil/data.pkl", evil_pkl)
        z.writestr("evil/byteorder", "little")
        z.writestr("evil/version", "3\n")

    class Eval:
        def __reduce__(self):
            return (eval, ("__import__('os').system('touch " + marker + "')",))

    with zipfile.ZipFile(os.path.join(out, "eval.pt"), "w", zipfile.ZIP_STORED) as z:
        z.writestr("eval/data.pkl", pickle.dumps({"w": Eval()}, protocol=4))

    # A torch checkpoint re-packed with compressed entries.
    src = zipfile.ZipFile(os.path.join(out, "module.pt"))
    with zipfile.ZipFile(os.path.join(out, "compressed.pt"), "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            z.writestr(info.filename, src.read(info.filename))

    # Big-endian byte order record.
    with zipfile.ZipFile(os.path.join(out, "bigendian.pt"), "w", zipfile.ZIP_STORED) as z:
        for info in src.infolist():
            if not info.filename.endswith("/byteorder"):
                z.writestr(info.filename, src.read(info.filename))
        z.writestr(src.infolist()[0].filename.split("/")[0] + "/byteorder", b"big")
    print("ok")


if __name__ == "__main__":
    main()
