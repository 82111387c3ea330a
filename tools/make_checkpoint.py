#!/usr/bin/env python3
"""Writes example checkpoints with real PyTorch tensors, in the safetensors format.

  make_checkpoint.py OUT.safetensors [--mib N] [--layers L] [--seed S]
      [--slices DIR --world W]

The state dict is GPT-shaped (embeddings, per-layer attention and MLP weights, norms,
biases) in fp32 with a few other dtypes mixed in, scaled so the data is about N MiB.
With --slices, it also writes PyTorch's own tensor-parallel slices of every tensor to
DIR/<tensor>.<dim>.<rank>-of-<world>.bin (raw bytes, via torch.tensor_split) and each
whole tensor to DIR/<tensor>.full.bin, the reference that the client library's slices are compared with byte for byte.

Needs Debian's python3-torch (/usr/bin/python3). The writer follows the safetensors
specification: 8-byte little-endian header size, JSON header, then the data.

Its write_safetensors and safetensors_header are Python's one safetensors writer: the
tests, the tools and docs/examples import them (C++ has format/safetensors_writer.h;
docs/formats.md, "Writing safetensors").
"""
import torch_python  # noqa: F401  (first: re-runs this script under a Python with torch if need be)
import argparse
import json
import os
import struct

import torch

DTYPE_NAMES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
# What write_safetensors puts in "__metadata__" unless told otherwise.
DEFAULT_METADATA = {"format": "pt", "writer": "ckpt make_checkpoint.py"}


def tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.contiguous()
    # numpy has no bfloat16: reinterpret as int16, same bytes.
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def safetensors_header(entries, metadata=None) -> bytes:
    """The bytes a safetensors file begins with: the 8-byte little-endian length N, then N
    bytes of JSON, "__metadata__" first (when `metadata`, a dict of strings, is not empty),
    then the tensors of `entries` [(name, dtype name such as "F32", shape, nbytes)] in order,
    their data_offsets back to back from 0, padded with spaces to a multiple of 8. The
    sum of the nbytes must follow (for a sparse file: truncate to the full size)."""
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = dict(metadata)
    for name, dtype, shape, nbytes in entries:
        if name == "__metadata__" or name in header:
            raise ValueError(f"tensor name {name!r} is reserved or given twice")
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write_safetensors(path: str, tensors: dict, metadata=DEFAULT_METADATA) -> None:
    """Writes `tensors` (name -> torch tensor, in order) to `path` as safetensors, with
    `metadata` as its "__metadata__" (None or {}: none); atomically (PATH.tmp, renamed)."""
    blobs = [tensor_bytes(t) for t in tensors.values()]
    entries = [(name, DTYPE_NAMES[t.dtype], t.shape, len(b)) for (name, t), b in zip(tensors.items(), blobs)]
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(safetensors_header(entries, metadata))
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def gpt_state_dict(mib: float, layers: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    # hidden chosen so the total is about `mib` MiB: a layer holds 32 h^2 bytes (fp32 attention, 16-bit MLP).
    vocab = 1024
    hidden = 64
    while 32 * layers * (hidden + 64) ** 2 + 4 * vocab * (hidden + 64) < mib * (1 << 20):
        hidden += 64
    sd = {"wte.weight": torch.randn(vocab, hidden, generator=g),
          "wpe.weight": torch.randn(256, hidden, generator=g)}
    for i in range(layers):
        p = f"h.{i}."
        sd[p + "ln_1.weight"] = torch.randn(hidden, generator=g)
        sd[p + "attn.qkv.weight"] = torch.randn(3 * hidden, hidden, generator=g)  # fused QKV
        sd[p + "attn.qkv.bias"] = torch.randn(3 * hidden, generator=g)
        sd[p + "attn.out_proj.weight"] = torch.randn(hidden, hidden, generator=g)
        sd[p + "mlp.c_fc.weight"] = torch.randn(4 * hidden, hidden, generator=g).to(torch.bfloat16)
        sd[p + "mlp.c_proj.weight"] = torch.randn(hidden, 4 * hidden, generator=g).to(torch.float16)
    sd["ln_f.weight"] = torch.randn(hidden, generator=g).to(torch.float64)
    sd["attn.masked_bias"] = torch.tensor(-1e4)  # a 0-d tensor
    sd["position_ids"] = torch.arange(256, dtype=torch.int64).reshape(1, 256)
    sd["token_type_mask"] = torch.randint(0, 2, (8, 16), generator=g, dtype=torch.int32).to(torch.bool)
    sd["quant.scale"] = torch.randint(-128, 127, (16, 32), generator=g, dtype=torch.int32).to(torch.int8)
    return sd


# The GPT-Neo-2.7B shape (fp32, 420 tensors, 9.877 GiB) that the benchmarks share
# (tools/bench_baselines.py gen, tools/gpu/bench_save.py): the one definition of it.
NEO_27B = {"hidden": 2560, "layers": 32, "vocab": 50257, "positions": 2048}
NEO_SMALL = {"hidden": 256, "layers": 2, "vocab": 1000, "positions": 128}  # a dry run of a benchmark


def gpt_neo_state_dict(device="cuda", out_device=None, shape=None, seed=0) -> dict:
    """The GPT-Neo-shaped fp32 state dict (transformers' GPTNeoForCausalLM names), random
    N(0, 0.02) drawn from a generator on `device` (`shape`: NEO_27B by default), each
    tensor moved to `out_device` as soon as it is drawn when given (so a CPU copy never
    holds the whole dict on the GPU)."""
    s = NEO_27B if shape is None else shape
    hidden, layers, vocab, positions = s["hidden"], s["layers"], s["vocab"], s["positions"]
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    sd = {}

    def add(name, *dims):
        t = torch.randn(*dims, generator=g, device=dev) * 0.02
        sd[name] = t if out_device is None else t.to(out_device)
    add("transformer.wte.weight", vocab, hidden)
    add("transformer.wpe.weight", positions, hidden)
    for i in range(layers):
        p = f"transformer.h.{i}."
        add(p + "ln_1.weight", hidden); add(p + "ln_1.bias", hidden)
        for k in "kvq":
            add(p + f"attn.attention.{k}_proj.weight", hidden, hidden)
        add(p + "attn.attention.out_proj.weight", hidden, hidden); add(p + "attn.attention.out_proj.bias", hidden)
        add(p + "ln_2.weight", hidden); add(p + "ln_2.bias", hidden)
        add(p + "mlp.c_fc.weight", 4 * hidden, hidden); add(p + "mlp.c_fc.bias", 4 * hidden)
        add(p + "mlp.c_proj.weight", hidden, 4 * hidden); add(p + "mlp.c_proj.bias", hidden)
    add("transformer.ln_f.weight", hidden); add("transformer.ln_f.bias", hidden)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return sd


def write_slices(tensors: dict, out_dir: str, world: int) -> None:
    os.makedirs(out_dir, exist_ok=True)
    for name, t in tensors.items():
        with open(os.path.join(out_dir, f"{name}.full.bin"), "wb") as f:
            f.write(tensor_bytes(t))
        for dim in range(t.dim()):
            for rank in range(world):
                part = torch.tensor_split(t, world, dim=dim)[rank]
                with open(os.path.join(out_dir, f"{name}.{dim}.{rank}-of-{world}.bin"), "wb") as f:
                    f.write(tensor_bytes(part))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--mib", type=float, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--slices", help="directory for PyTorch's reference slices")
    ap.add_argument("--world", type=int, default=4)
    args = ap.parse_args()
    sd = gpt_state_dict(args.mib, args.layers, args.seed)
    write_safetensors(args.out, sd)
    if args.slices:
        write_slices(sd, args.slices, args.world)
    total = sum(t.numel() * t.element_size() for t in sd.values())
    print(f"wrote {args.out}: {len(sd)} tensors, {total} bytes")


if __name__ == "__main__":
    main()
