"""transformers' load-time conversions that ckptd reproduces (issue 25), through the real
ckptd: a checkpoint of each model type's own tensor names (the examples of test_hf_plans,
random values), loaded by the daemon, and every rank's state_dict(plan="auto",
convention="hf") against the same conversion done with torch the way transformers'
core_model_loading does it, then split as transformers' style says:
  qwen3_vl_moe  Transpose(1, 2, check_dims): hub experts [E, H, 2I] become [E, 2I, H]
  kimi_k25      Chunk + PermuteForRope of the vision tower's fused wqkv
  step3p7       Concatenate(dim 1) of stacked moe.gate_proj / moe.up_proj, packed_colwise
  inkling_mm_model  Interleave(1) of the stacked experts' w13_weight, Interleave + Chunk of the
                shared experts' and of the dense MLP's w13
  ernie4_5_vl_moe  ErnieFuseAndSplitTextVisionExperts (text and vision experts of one list),
                its routers' Transpose(0, 1) under new names, a Chunk of their shared bias
Run by ctest (tests/CMakeLists.txt sets CKPTD_BIN, CKPT_TOOLS_DIR, PYTHONPATH)."""
import json
import os
import sys
import tempfile
import unittest

import torch

import ckpt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_ckpt import Daemon  # noqa: E402

sys.path.insert(0, os.environ.get("CKPT_TOOLS_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "tools")))
import make_checkpoint  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf_family_examples.json")
E, I, H = 4, 32, 64  # experts, expert rows, hidden (the examples' tiny sizes)


def permute_for_rope(t, heads):
    """transformers' PermuteForRope._apply (not inverse)."""
    rows = t.shape[0]
    if t.ndim == 2:
        return t.view(heads, rows // heads // 2, 2, t.shape[1]).transpose(1, 2).reshape(rows, t.shape[1])
    return t.view(heads, rows // heads // 2, 2).transpose(1, 2).reshape(rows)


class HfConversionsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(EXAMPLES) as f:
            examples = json.load(f)["families"]
        cls.tmp = tempfile.TemporaryDirectory()
        cls.daemon = Daemon(cls.tmp.name)
        cls.daemon.start()
        cls.client = ckpt.connect(cls.daemon.socket)
        g = torch.Generator().manual_seed(25)
        cls.sd, cls.config = {}, {}
        extra = {  # tensors the tiny examples lack, as their hub checkpoints hold them
            # (2 x 16 rows, not 2 x 32 = H: a square [E, H, H] is the model's layout either way,
            # and transformers' check_dims then keeps it as it is)
            "qwen3_vl_moe": {"model.language_model.layers.0.mlp.experts.gate_up_proj": [E, H, 2 * 16],
                             "model.language_model.layers.0.mlp.experts.down_proj": [E, 16, H]},
            "step3p7": {"model.layers.1.moe.gate_proj.weight": [E, I, H], "model.layers.1.moe.up_proj.weight": [E, I, H],
                        "model.layers.1.moe.down_proj.weight": [E, H, I]},
            "kimi_k25": {},
            # inkling's dense MLP (the tiny example's layers are all sparse): [2I, H]
            "inkling_mm_model": {"model.llm.layers.1.mlp.w13_dn.weight": [64, 64]}}
        for mt, more in extra.items():
            ex = examples[mt]
            shapes = {n: s for n, _, s in ex["tensors"] if not n.startswith(tuple(k.rsplit(".", 2)[0] for k in more))}
            shapes.update(more)
            sd = {n: torch.randn(*s, generator=g) if s else torch.randn((), generator=g) for n, s in shapes.items()}
            folder = os.path.join(cls.tmp.name, mt)
            os.makedirs(folder)
            make_checkpoint.write_safetensors(os.path.join(folder, "model.safetensors"), sd)
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(ex["config"], f)
            cls.client.load(folder, mt)
            cls.sd[mt], cls.config[mt] = sd, ex["config"]
        # ernie4_5_vl_moe (no example: transformers' own tiny model of it is checked on the GPU
        # machine): 4 text experts of 6 rows, then 4 vision experts of 2, one list
        L, sd = "model.layers.1.mlp.", {}
        for e in range(8):
            r = 6 if e < 4 else 2
            for w, s in (("gate_proj", [r, 8]), ("up_proj", [r, 8]), ("down_proj", [8, r])):
                sd[L + f"experts.{e}.{w}.weight"] = torch.randn(*s, generator=g)
        sd.update({L + "gate.weight": torch.randn(8, 8, generator=g), L + "gate.weight_1": torch.randn(8, 8, generator=g),
                   L + "moe_statics.e_score_correction_bias": torch.randn(2, 8, generator=g),
                   "model.embed_tokens.weight": torch.randn(64, 8, generator=g)})
        folder = os.path.join(cls.tmp.name, "ernie")
        os.makedirs(folder)
        make_checkpoint.write_safetensors(os.path.join(folder, "model.safetensors"), sd)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump({"model_type": "ernie4_5_vl_moe", "text_config": {"moe_num_experts": [4, 4], "hidden_size": 8}}, f)
        cls.client.load(folder, "ernie")
        cls.sd["ernie"] = sd

    @classmethod
    def tearDownClass(cls):
        cls.client = None
        cls.daemon.cleanup()
        cls.tmp.cleanup()

    def shards(self, mt, names):
        """{world: [{name: tensor} per rank]} of `names` at worlds 1, 2, 4."""
        out = {}
        for world in (1, 2, 4):
            out[world] = [self.client.state_dict(mt, rank, world, "auto", convention="hf", names=names)
                          for rank in range(world)]
        return out

    def test_qwen3_vl_moe_hub_experts_are_transposed_into_the_models_layout(self):
        p = "model.language_model.layers.0.mlp.experts."
        sd = self.sd["qwen3_vl_moe"]
        for world, ranks in self.shards("qwen3_vl_moe", [p + "gate_up_proj", p + "down_proj"]).items():
            for rank, got in enumerate(ranks):
                with self.subTest(world=world, rank=rank):
                    for name in ("gate_up_proj", "down_proj"):  # replicated: the plan has no style for them
                        self.assertTrue(torch.equal(got[p + name], sd[p + name].transpose(1, 2).contiguous()), name)

    def test_kimi_k25_vision_qkv_is_chunked_and_rope_permuted(self):
        sd, heads = self.sd["kimi_k25"], self.config["kimi_k25"]["vision_config"]["num_attention_heads"]
        src, dst = "vision_tower.encoder.blocks.0.wqkv.", "model.vision_tower.layers.0.attn."
        names = [dst + f"{x}_proj.{k}" for x in "qkv" for k in ("weight", "bias")]
        for world, ranks in self.shards("kimi_k25", names).items():
            for rank, got in enumerate(ranks):
                for kind in ("weight", "bias"):
                    q, k, v = torch.chunk(sd[src + kind], 3, dim=0)
                    want = {"q": permute_for_rope(q, heads), "k": permute_for_rope(k, heads), "v": v}
                    for x, t in want.items():
                        with self.subTest(world=world, rank=rank, tensor=x + kind):
                            self.assertTrue(torch.equal(got[dst + f"{x}_proj.{kind}"], t))

    def test_step3p7_stacked_gate_and_up_are_concatenated_along_dim_1_and_split_per_block(self):
        sd = self.sd["step3p7"]
        gu, down = ("model.language_model.layers.1.mlp.experts." + n for n in ("gate_up_proj", "down_proj"))
        gate, up = sd["model.layers.1.moe.gate_proj.weight"], sd["model.layers.1.moe.up_proj.weight"]
        for world, ranks in self.shards("step3p7", [gu, down]).items():
            for rank, got in enumerate(ranks):
                with self.subTest(world=world, rank=rank):
                    # torch.cat([gate, up], dim=1) split packed_colwise: each of the two blocks of
                    # dim 1 split over the ranks; down_proj rowwise (its last dim)
                    fused = torch.cat([gate, up], dim=1)
                    blocks = [b.chunk(world, dim=1)[rank] for b in fused.chunk(2, dim=1)]
                    self.assertTrue(torch.equal(got[gu], torch.cat(blocks, dim=1)))
                    self.assertTrue(torch.equal(got[down], sd["model.layers.1.moe.down_proj.weight"].chunk(world, dim=2)[rank]))
            # What the shards mean: the experts' MLP summed over the ranks (rowwise down's
            # all-reduce) is the whole MLP's. transformers 5.17 instead splits each stacked source
            # as if it were the packed target (_StridedShard(1, split_factor=2) on [E, I, H]:
            # part r of each half of I), which computes another function (docs/tp-plans.md).
            x = torch.randn(E, 5, H, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
            full_down = sd["model.layers.1.moe.down_proj.weight"].double()

            def mlp(gate_up, down_w):
                g, u = gate_up.double().chunk(2, dim=1)
                return torch.bmm(torch.nn.functional.silu(torch.bmm(x, g.transpose(1, 2))) * torch.bmm(x, u.transpose(1, 2)),
                                 down_w.double().transpose(1, 2))

            whole = mlp(torch.cat([gate, up], dim=1), full_down)
            if world > 1:
                self.assertTrue(torch.allclose(sum(mlp(r[gu], r[down]) for r in ranks), whole))
                strided = [torch.cat([torch.cat([h.chunk(world, dim=1)[r] for h in w.chunk(2, dim=1)], dim=1)
                                      for w in (gate, up)], dim=1) for r in range(world)]
                self.assertFalse(torch.allclose(sum(mlp(strided[r], ranks[r][down]) for r in range(world)), whole))

    def test_inkling_interleaved_rows_are_taken_apart_after_the_split_as_transformers_does(self):
        """transformers' Interleave(dim): each rank's contiguous part of the source (the target's
        colwise split, done on read), then its pairs of rows taken apart (row 2j to j, 2j + 1 to
        half + j); with a Chunk after it, the halves are two tensors (gate, up)."""
        sd, L, M = self.sd["inkling_mm_model"], "model.llm.layers.", "model.language_model.layers."

        def interleave(t, dim):  # transformers' Interleave.convert (not inverse)
            shape = list(t.shape)
            return t.reshape(shape[:dim] + [shape[dim] // 2, 2] + shape[dim + 1:]).transpose(dim, dim + 1).reshape(shape)

        names = [M + "0.mlp.experts.gate_up_proj", M + "0.mlp.shared_experts.gate_proj",
                 M + "0.mlp.shared_experts.up_proj", M + "1.mlp.gate_proj.weight", M + "1.mlp.up_proj.weight"]
        for world, ranks in self.shards("inkling_mm_model", names).items():
            for rank, got in enumerate(ranks):
                with self.subTest(world=world, rank=rank):
                    experts = interleave(sd[L + "0.mlp.experts.w13_weight"].chunk(world, dim=1)[rank], 1)
                    self.assertTrue(torch.equal(got[names[0]], experts))
                    shared = interleave(sd[L + "0.mlp.shared_experts.shared_w13_weight"].chunk(world, dim=1)[rank], 1)
                    self.assertTrue(torch.equal(got[names[1]], shared.chunk(2, dim=1)[0]))
                    self.assertTrue(torch.equal(got[names[2]], shared.chunk(2, dim=1)[1]))
                    dense = interleave(sd[L + "1.mlp.w13_dn.weight"].chunk(world, dim=0)[rank], 0)
                    self.assertTrue(torch.equal(got[names[3]], dense.chunk(2, dim=0)[0]))
                    self.assertTrue(torch.equal(got[names[4]], dense.chunk(2, dim=0)[1]))

    def test_ernie4_5_vl_moe_experts_split_into_text_and_vision_and_routers_transposed(self):
        sd, L = self.sd["ernie"], "model.layers.1.mlp."
        M = "model.language_model.layers.1.mlp."
        # transformers: the collected list cut into ceil(8 / 2) = 4 per target, each stacked
        # (dim 0), gate and up concatenated along dim 1
        experts = {"text_moe": range(0, 4), "vision_moe": range(4, 8)}
        want = {}
        for moe, ids in experts.items():
            stack = {w: torch.stack([sd[L + f"experts.{e}.{w}.weight"] for e in ids]) for w in ("gate_proj", "up_proj", "down_proj")}
            want[M + moe + ".experts.gate_up_proj"] = torch.cat([stack["gate_proj"], stack["up_proj"]], dim=1)
            want[M + moe + ".experts.down_proj"] = stack["down_proj"]
        want[M + "text_moe.gate.weight"] = sd[L + "gate.weight"].transpose(0, 1).contiguous()
        want[M + "vision_moe.gate.weight"] = sd[L + "gate.weight_1"].transpose(0, 1).contiguous()
        bias = torch.chunk(sd[L + "moe_statics.e_score_correction_bias"], 2, dim=0)
        want[M + "text_moe.gate.moe_statics.e_score_correction_bias"] = bias[0]
        want[M + "vision_moe.gate.moe_statics.e_score_correction_bias"] = bias[1]
        for world, ranks in self.shards("ernie", list(want)).items():
            for rank, got in enumerate(ranks):
                for name, t in want.items():  # the plan has no style for them: replicated
                    with self.subTest(world=world, rank=rank, tensor=name):
                        self.assertTrue(torch.equal(got[name], t))


if __name__ == "__main__":
    unittest.main()
