"""FP8 block scales through the plan engine and the real ckptd (issue 25): a safetensors
checkpoint of F8_E4M3 weights with their weight_scale_inv blocks, resolved for TP 2/4/8
under both conventions; each rank's weight shard dequantized with the rank's scale shard
equals the same slice of the dequantized whole tensor. torch 1.13 has no float8: the E4M3FN
bytes are decoded with a table computed here from the bit layout. Run by ctest
(tests/CMakeLists.txt sets CKPTD_BIN, CKPT_TOOLS_DIR, PYTHONPATH)."""
import json
import os
import sys
import tempfile
import unittest

import torch

import ckpt
import ckpt.plans

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_ckpt import Daemon  # noqa: E402

sys.path.insert(0, os.environ.get("CKPT_TOOLS_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "tools")))
import make_checkpoint  # noqa: E402

BLOCK = 128
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 1024, 16, 8, 128, 2048
# name -> ([out, in], split dim of column/row parallel, scale dtype)
PROJ = {
    "self_attn.q_proj": ((HEADS * HEAD_DIM, HIDDEN), 0, torch.float32),
    "self_attn.k_proj": ((KV_HEADS * HEAD_DIM, HIDDEN), 0, torch.float32),
    "self_attn.v_proj": ((KV_HEADS * HEAD_DIM, HIDDEN), 0, torch.float32),
    "self_attn.o_proj": ((HIDDEN, HEADS * HEAD_DIM), 1, torch.float32),
    "mlp.gate_proj": ((INTER, HIDDEN), 0, torch.bfloat16),  # fused with up: one dtype
    "mlp.up_proj": ((INTER, HIDDEN), 0, torch.bfloat16),
    "mlp.down_proj": ((HIDDEN, INTER), 1, torch.bfloat16),
}
CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN,
          "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
          "intermediate_size": INTER, "num_hidden_layers": 1, "vocab_size": 256, "tie_word_embeddings": False,
          "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [BLOCK, BLOCK]}}


def e4m3fn_table() -> torch.Tensor:
    """The float32 value of every E4M3FN byte: 1 sign bit, 4 exponent bits (bias 7), 3
    mantissa bits; exponent 0 is subnormal; no infinities; 0x7F and 0xFF are NaN."""
    values = []
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        exp, man = (b >> 3) & 0xF, b & 0x7
        if exp == 0xF and man == 0x7:
            values.append(float("nan"))
        elif exp == 0:
            values.append(sign * (man / 8.0) * 2.0 ** -6)
        else:
            values.append(sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7))
    return torch.tensor(values, dtype=torch.float32)


E4M3 = e4m3fn_table()


def dequantize(weight_bytes: torch.Tensor, scale: torch.Tensor, block=(BLOCK, BLOCK)) -> torch.Tensor:
    """weight (uint8 E4M3FN bytes [o, i]) times its block's scale, in float32."""
    o, i = weight_bytes.shape
    s = scale.float().repeat_interleave(block[0], 0)[:o].repeat_interleave(block[1], 1)[:, :i]
    return E4M3[weight_bytes.long()] * s


def random_e4m3(shape, g) -> torch.Tensor:
    """Random E4M3FN bytes, none of them NaN (0x7F, 0xFF)."""
    r = torch.randint(0, 254, shape, generator=g, dtype=torch.int32)
    return (r + (r >= 0x7F).int()).to(torch.uint8)


def write_fp8(path: str, tensors: dict) -> None:
    """Safetensors with the project's writer (make_checkpoint.safetensors_header): uint8
    tensors named "*.weight" are written as F8_E4M3 bytes, the others as their dtype."""
    entries, blobs = [], []
    for name, t in tensors.items():
        b = make_checkpoint.tensor_bytes(t)
        is_fp8 = t.dtype == torch.uint8 and name.endswith(".weight")
        entries.append((name, "F8_E4M3" if is_fp8 else make_checkpoint.DTYPE_NAMES[t.dtype], t.shape, len(b)))
        blobs.append(b)
    with open(path, "wb") as f:
        f.write(make_checkpoint.safetensors_header(entries))
        for b in blobs:
            f.write(b)


def raw_output(model, output) -> torch.Tensor:
    """One resolved output gathered by the plan engine (GatherOutput) as uint8 bytes, or
    viewed as its dtype when torch 1.13 has it."""
    shape, dtype_name, nbytes, _ = model._h.output_layout(output)
    buf = torch.empty(nbytes, dtype=torch.uint8)
    if nbytes:
        model._h.copy_output(output, buf.data_ptr(), nbytes)
    if dtype_name == "F8_E4M3":
        return buf.view(shape)
    return buf.view(ckpt.DTYPES[dtype_name]).view(shape)


class Fp8BlockScalesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        g = torch.Generator().manual_seed(25)
        p = "model.layers.0."
        sd = {"model.embed_tokens.weight": torch.randn(256, HIDDEN, generator=g).bfloat16(),
              p + "input_layernorm.weight": torch.ones(HIDDEN).bfloat16()}
        for name, ((o, i), _, sdt) in PROJ.items():
            sd[p + name + ".weight"] = random_e4m3((o, i), g)
            sd[p + name + ".weight_scale_inv"] = (torch.rand(-(-o // BLOCK), -(-i // BLOCK), generator=g) + 0.5).to(sdt)
        sd["model.norm.weight"] = torch.ones(HIDDEN).bfloat16()
        sd["lm_head.weight"] = torch.randn(256, HIDDEN, generator=g).bfloat16()
        cls.sd = sd
        folder = os.path.join(cls.tmp.name, "fp8")
        os.makedirs(folder)
        write_fp8(os.path.join(folder, "model.safetensors"), sd)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(CONFIG, f)
        # 320 rows: torch.chunk parts of 160 at TP 2 cut the second 128-row block.
        write_fp8(os.path.join(cls.tmp.name, "odd.safetensors"),
                  {"odd.weight": random_e4m3((320, 256), g), "odd.weight_scale_inv": torch.ones(3, 2)})
        cls.daemon = Daemon(cls.tmp.name)
        cls.daemon.start()
        cls.client = ckpt.connect(cls.daemon.socket)
        cls.client.load(os.path.join(folder, "model.safetensors"), "fp8")
        cls.client.load(os.path.join(cls.tmp.name, "odd.safetensors"), "fp8.odd")

    @classmethod
    def tearDownClass(cls):
        cls.client = None
        cls.daemon.cleanup()
        cls.tmp.cleanup()

    def test_dequantized_shards_equal_shards_of_the_dequantized_whole(self):
        model = self.client.attach("fp8")
        p = "model.layers.0."
        whole = {n: dequantize(self.sd[p + n + ".weight"], self.sd[p + n + ".weight_scale_inv"]) for n in PROJ}
        for conv in ("hf", "megatron"):
            for world in (2, 4, 8):
                for rank in range(world):
                    outs = {o.name: o for o in model.resolve(rank, world, "auto", convention=conv, config=CONFIG)}
                    for name, (_, dim, sdt) in PROJ.items():
                        with self.subTest(convention=conv, world=world, rank=rank, tensor=name):
                            w = raw_output(model, outs[p + name + ".weight"])
                            s = raw_output(model, outs[p + name + ".weight_scale_inv"])
                            self.assertEqual(s.dtype, sdt)
                            self.assertEqual(tuple(s.shape), (-(-w.shape[0] // BLOCK), -(-w.shape[1] // BLOCK)))
                            want = whole[name].chunk(world, dim)[rank]
                            self.assertEqual(tuple(w.shape), tuple(want.shape))
                            self.assertTrue(torch.equal(dequantize(w, s), want))

    def test_megatron_fused_qkv_and_gate_up_fuse_their_scales(self):
        model = self.client.attach("fp8")
        p = "model.layers.0."
        whole = {n: dequantize(self.sd[p + n + ".weight"], self.sd[p + n + ".weight_scale_inv"]) for n in PROJ}
        fused = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                 "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}
        for world in (2, 4, 8):
            for rank in range(world):
                outs = {o.name: o for o in model.resolve(rank, world, "auto", config=CONFIG, fuse_qkv=True,
                                                         fuse_gate_up=True)}
                for name, parts in fused.items():
                    with self.subTest(world=world, rank=rank, tensor=name):
                        w = raw_output(model, outs[p + name + ".weight"])
                        s = raw_output(model, outs[p + name + ".weight_scale_inv"])
                        want = torch.cat([whole[n].chunk(world, 0)[rank] for n in parts])
                        self.assertTrue(torch.equal(dequantize(w, s), want))

    def test_block_cut_by_an_uneven_split_is_a_clear_error(self):
        model = self.client.attach("fp8.odd")
        plan = ckpt.plans.from_json(json.dumps({"convention": "hf", "rules": [{"pattern": "odd", "rule": "colwise"}]}))
        for world in (2, 4, 8):
            with self.subTest(world=world):
                with self.assertRaisesRegex(ckpt.InvalidArgument,
                                            rf"rank 0 of world {world} takes rows \[0, \d+\) of weight 'odd.weight' "
                                            r"\[320, 256\], which cuts its blocks of 128.*'odd.weight_scale_inv'"):
                    model.resolve(0, world, plan)
        # At world 1 nothing is cut: the whole weight and scale.
        outs = {o.name: o for o in model.resolve(0, 1, plan)}
        self.assertEqual(tuple(raw_output(model, outs["odd.weight_scale_inv"]).shape), (3, 2))

    def test_the_block_size_comes_from_the_config(self):
        model = self.client.attach("fp8")
        cfg = dict(CONFIG, quantization_config={"quant_method": "fp8", "weight_block_size": [64, 128]})
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"has shape \[\d+, \d+\], but weight .* in blocks of \[64, 128\] needs \[\d+, \d+\]"):
            model.resolve(0, 2, "auto", convention="hf", config=cfg)


if __name__ == "__main__":
    unittest.main()
