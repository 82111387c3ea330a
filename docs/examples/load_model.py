#!/usr/bin/env python3
"""A transformers model, tensor-parallel, straight from ckptd's shared memory.

    ckptctl load /models/Qwen3-8B --name qwen3            # once per node: the folder, config.json kept
    torchrun --nproc-per-node 2 docs/examples/load_model.py --name qwen3
    CUDA_VISIBLE_DEVICES= torchrun --nproc-per-node 2 docs/examples/load_model.py --name qwen3 --device cpu

Every rank gets transformers' own tensor-parallel model (its forward does the collectives)
holding only its shards, read from the daemon's one copy; the greedy continuation printed by
rank 0 is the one from_pretrained(tp_plan="auto") would give.
"""
import argparse

import torch

import ckpt
import ckpt.transformers


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", required=True, help="the checkpoint's name in ckptd")
    ap.add_argument("--device", default=None, help="default: cuda:LOCAL_RANK, else cpu")
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()

    launch = ckpt.launcher_env()  # RANK / WORLD_SIZE / LOCAL_RANK from torchrun
    device = args.device or (f"cuda:{launch.local_rank}" if torch.cuda.is_available() else "cpu")
    model = ckpt.transformers.load_model(args.name, device=device)  # rank and world from the launcher
    ids = torch.tensor([[1, 2, 3, 4]], device=device)
    with torch.no_grad():
        for _ in range(args.tokens):  # greedy decoding, every rank in step
            next_id = model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, next_id], dim=1)
    if launch.rank == 0:
        print(f"{type(model).__name__} on {launch.world} rank(s), fill={model.ckpt_fill}: {ids.tolist()[0]}")


if __name__ == "__main__":
    main()
