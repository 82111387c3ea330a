"""The small model the torchrun examples share: a tensor-parallel MLP block and a demo
checkpoint of it. Not an example on its own; `python3 demo_model.py PATH` writes the
checkpoint (a safetensors file, by the repository's one Python writer,
tools/make_checkpoint.py: no extra package).

    python3 docs/examples/demo_model.py /tmp/demo.safetensors
    ckptctl load /tmp/demo.safetensors --name demo

Tensors: embed.weight [V, H] (replicated), fc1.weight [F, H] and fc1.bias [F] (column
parallel: split along dim 0), fc2.weight [H, F] (row parallel: split along dim 1),
fc2.bias [H] (replicated), norm.weight [H] (replicated).
"""
import os
import sys

import torch
from torch import nn

V, H, F = 512, 64, 256


# The tensor-parallel plan in ckpt's {regex: rule} form (first match wins, others replicated).
def tp_plan():
    import ckpt
    return {r"^fc1\.(weight|bias)$": ckpt.column(), r"^fc2\.weight$": ckpt.row()}


def reference_state_dict(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"embed.weight": torch.randn(V, H, generator=g), "fc1.weight": torch.randn(F, H, generator=g) / 8,
            "fc1.bias": torch.randn(F, generator=g), "fc2.weight": torch.randn(H, F, generator=g) / 16,
            "fc2.bias": torch.randn(H, generator=g), "norm.weight": torch.rand(H, generator=g) + 0.5}


def write_safetensors(path: str, tensors: dict) -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "tools"))
    import make_checkpoint
    make_checkpoint.write_safetensors(path, tensors, metadata=None)


class Norm(nn.Module):
    """Layer norm with a weight and no bias."""

    def __init__(self, h: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), self.weight)


class Block(nn.Module):
    """embed -> fc1 -> gelu -> fc2 -> norm, holding rank `rank`'s shards of `world`: fc1 has
    F / world output features, fc2 F / world input features; fc2's partial sums are added
    over the ranks (all_reduce) before its bias. world 1 is the plain model."""

    def __init__(self, world: int = 1):
        super().__init__()
        self.world = world
        self.embed = nn.Embedding(V, H)
        self.fc1 = nn.Linear(H, F // world)
        self.fc2 = nn.Linear(F // world, H)
        self.norm = Norm(H)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.gelu(self.fc1(self.embed(ids)))
        y = torch.nn.functional.linear(x, self.fc2.weight)
        if self.world > 1:
            import torch.distributed as dist
            partial = y.float()  # summed in float32 (gloo, and precision, for 16-bit weights)
            dist.all_reduce(partial)
            y = partial.to(y.dtype)
        return self.norm(y + self.fc2.bias)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} PATH.safetensors")
    write_safetensors(sys.argv[1], reference_state_dict())
    print(f"wrote {sys.argv[1]}")
