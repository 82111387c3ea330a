"""The plan engine through the Python module and the real ckptd: every built-in family, both
conventions, worlds 1, 2 and 4, each rank's state dict (names, shapes, bytes) against the
slices tp_cases.py computes with torch; plan="auto"; and the bad inputs issue 16 names.
Run by ctest (tests/CMakeLists.txt sets CKPTD_BIN, CKPT_TOOLS_DIR, PYTHONPATH)."""
import json
import os
import shutil
import sys
import tempfile
import unittest

import torch

import ckpt
import ckpt.plans

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tp_cases  # noqa: E402
from test_ckpt import Daemon  # noqa: E402


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and torch.equal(
        a.contiguous().view(torch.uint8) if a.numel() else a, b.contiguous().view(torch.uint8) if b.numel() else b)


class PlanFamiliesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        tp_cases.write(cls.tmp.name)
        cls.daemon = Daemon(cls.tmp.name)
        cls.daemon.start()
        cls.client = ckpt.connect(cls.daemon.socket)
        for family in tp_cases.FAMILIES:
            d = os.path.join(cls.tmp.name, family)
            cls.client.load(os.path.join(d, "model.safetensors"), family)
            cls.client.load(os.path.join(d, "expected.safetensors"), family + ".expected")
        # The same tensors from folders without a config.json: nothing for "auto" to go on.
        for family in ("llama", "falcon"):
            bare = os.path.join(cls.tmp.name, "bare-" + family)
            os.makedirs(bare)
            shutil.copy(os.path.join(cls.tmp.name, family, "model.safetensors"), bare)
            cls.client.load(os.path.join(bare, "model.safetensors"), family + ".bare")

    @classmethod
    def tearDownClass(cls):
        cls.client = None
        cls.daemon.cleanup()
        cls.tmp.cleanup()

    def config(self, family):
        with open(os.path.join(self.tmp.name, family, "config.json")) as f:
            return json.load(f)

    def cases(self, family):
        with open(os.path.join(self.tmp.name, family, "cases.json")) as f:
            return json.load(f)

    def test_every_family_both_conventions_every_rank(self):
        for family in tp_cases.FAMILIES:
            model = self.client.attach(family)
            expected = self.client.attach(family + ".expected")
            cases = self.cases(family)
            for conv, worlds in cases["conventions"].items():
                for world in worlds:
                    for rank in range(world):
                        with self.subTest(family=family, convention=conv, world=world, rank=rank):
                            prefix = f"{conv}/w{world}/r{rank}/"
                            want = {k[len(prefix):]: expected.tensor(k) for k in expected.keys() if k.startswith(prefix)}
                            got = model.state_dict(rank, world, "auto", convention=conv, config=self.config(family))
                            self.assertEqual(sorted(got), sorted(want))
                            for name, t in want.items():
                                self.assertTrue(same(got[name], t), f"{name}: {tuple(got[name].shape)} vs {tuple(t.shape)}")
                            # The family name gives the same plan as "auto" with the config.
                            by_name = model.state_dict(rank, world, family, convention=conv,
                                                       config=self.config(family), copy=True)
                            self.assertEqual(sorted(by_name), sorted(want))

    def test_config_is_a_path_a_folder_json_text_or_a_dict_everywhere(self):
        """Issue 22: state_dict(config=...) takes a config.json path (str or pathlib.Path) or
        a model folder as load_model does (one helper, ckpt.plans.config_dict); JSON text and
        dicts still work; a path that does not exist is an error naming it."""
        import pathlib
        bare = self.client.attach("llama.bare")  # no stored config.json
        cfg = self.config("llama")
        path = os.path.join(self.tmp.name, "llama", "config.json")
        want = bare.state_dict(1, 2, "auto", config=cfg)
        for given in (path, pathlib.Path(path), os.path.join(self.tmp.name, "llama"), json.dumps(cfg),
                      json.dumps(cfg).encode()):
            with self.subTest(config=given):
                got = bare.state_dict(1, 2, "auto", config=given)
                self.assertEqual(sorted(got), sorted(want))
                for name in want:
                    self.assertTrue(same(got[name], want[name]), name)
        self.assertEqual(ckpt.plans.config_dict(path), cfg)
        self.assertEqual(ckpt.plans.config_dict(pathlib.Path(path)), cfg)
        self.assertIsNone(ckpt.plans.config_dict(None))
        missing = os.path.join(self.tmp.name, "nowhere", "config.json")
        with self.assertRaisesRegex(ckpt.InvalidArgument, "cannot read the model config .*nowhere"):
            bare.state_dict(1, 2, "auto", config=missing)
        with self.assertRaisesRegex(ckpt.InvalidArgument, "config is not valid JSON"):
            bare.state_dict(1, 2, "auto", config="{model_type: llama")
        with self.assertRaisesRegex(ckpt.InvalidArgument, "cannot read the model config .*nowhere"):
            bare.state_dict(1, 2, "auto", config=pathlib.Path(missing))
        broken = os.path.join(self.tmp.name, "broken.json")
        with open(broken, "w") as f:
            f.write("{not json")
        with self.assertRaisesRegex(ckpt.InvalidArgument, "the model config .*broken.json is not valid JSON"):
            bare.resolve(1, 2, "auto", config=broken)
        with self.assertRaisesRegex(ckpt.InvalidArgument, "is a JSON list, not an object"):
            ckpt.plans.config_dict(b"[1, 2]")

    def test_options_fuse_and_expert_parallel(self):
        llama = self.client.attach("llama")
        full = llama.state_dict()
        cfg = self.config("llama")
        sd = llama.state_dict(1, 4, "auto", config=cfg, fuse_qkv=True, fuse_gate_up=True)
        p = "model.layers.0."
        q = full[p + "self_attn.q_proj.weight"][4:8]      # rank 1 of 4: head 1 (hd 4)
        k = full[p + "self_attn.k_proj.weight"][0:4]      # 2 kv heads over 4 ranks: rank 1 holds head 0
        v = full[p + "self_attn.v_proj.weight"][0:4]
        self.assertTrue(torch.equal(sd[p + "self_attn.qkv_proj.weight"], torch.cat([q, k, v])))
        self.assertNotIn(p + "self_attn.q_proj.weight", sd)
        g, u = full[p + "mlp.gate_proj.weight"][6:12], full[p + "mlp.up_proj.weight"][6:12]
        self.assertTrue(torch.equal(sd[p + "mlp.gate_up_proj.weight"], torch.cat([g, u])))

        mixtral = self.client.attach("mixtral")
        full = mixtral.state_dict()
        cfg = self.config("mixtral")
        ep = mixtral.state_dict(1, 2, "auto", config=cfg, expert_parallel=True)
        x = "model.layers.1.block_sparse_moe.experts."
        self.assertNotIn(x + "0.w1.weight", ep)            # experts 0, 1 live on rank 0
        self.assertTrue(torch.equal(ep[x + "2.w1.weight"], full[x + "2.w1.weight"]))
        self.assertTrue(torch.equal(ep[x + "3.w2.weight"], full[x + "3.w2.weight"]))
        self.assertTrue(torch.equal(ep["model.layers.1.block_sparse_moe.gate.weight"],
                                    full["model.layers.1.block_sparse_moe.gate.weight"]))  # router replicated
        fused = mixtral.state_dict(1, 2, "auto", config=cfg, expert_parallel=True, fuse_experts=True)
        gu = fused["model.layers.1.mlp.experts.gate_up_proj"]
        self.assertEqual(tuple(gu.shape), (2, 2 * tp_cases.IM, tp_cases.H))
        self.assertTrue(torch.equal(gu[0], torch.cat([full[x + "2.w1.weight"], full[x + "2.w3.weight"]])))
        tp = mixtral.state_dict(0, 2, "auto", config=cfg, fuse_experts=True)
        dn = tp["model.layers.0.mlp.experts.down_proj"]
        self.assertEqual(tuple(dn.shape), (tp_cases.E, tp_cases.H, tp_cases.IM // 2))
        self.assertTrue(torch.equal(dn[3], full["model.layers.0.block_sparse_moe.experts.3.w2.weight"][:, :4]))

    def test_resolve_is_what_both_engines_use(self):
        c = self.client.attach("qwen3_moe")
        outs = c.resolve(1, 2, "auto", convention="hf", config=self.config("qwen3_moe"))
        byname = {o.name: o for o in outs}
        gu = byname["model.layers.0.mlp.experts.gate_up_proj"]
        self.assertEqual(gu.view, (tp_cases.E, tp_cases.IM, tp_cases.H))  # 2 * IM / 2 rows per expert
        self.assertEqual(len(gu.pieces), 2 * tp_cases.E)
        self.assertEqual(gu.pieces[0]["source"], "model.layers.0.mlp.experts.0.gate_proj.weight")
        self.assertEqual(gu.pieces[1]["source"], "model.layers.0.mlp.experts.0.up_proj.weight")
        self.assertEqual(gu.pieces[0]["rank"], 1)
        plan = ckpt.plans.for_config(self.config("qwen3_moe"), "hf")
        self.assertEqual(plan.family, "qwen3_moe")
        self.assertEqual(plan.convention, "hf")
        again = plan.resolve(c._h.tensors(), 1, 2)
        self.assertEqual([o.name for o in again], [o.name for o in outs])
        self.assertIn('"family": "qwen3_moe"', plan.json)

    def test_names_selects_outputs(self):
        c = self.client.attach("llama")
        sd = c.state_dict(0, 2, "auto", config=self.config("llama"), names=["lm_head.weight"])
        self.assertEqual(list(sd), ["lm_head.weight"])
        with self.assertRaisesRegex(ckpt.NotFound, "no_such"):
            c.state_dict(0, 2, "auto", config=self.config("llama"), names=["no_such.weight"])

    # ---- bad input: a clear error naming the tensor or field, nothing returned ---------
    def test_unknown_family_and_auto_without_a_known_config(self):
        c = self.client.attach("llama")
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"unknown plan 'gpt-5'.*llama.*plan file"):
            c.state_dict(0, 2, "gpt-5")
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"model_type 'brandnew'.*not a built-in family.*llama.*"
                                                           r"plan file: \{\"rules\""):
            c.state_dict(0, 2, "auto", config={"model_type": "brandnew", "architectures": ["BrandNewForCausalLM"]})
        with self.assertRaisesRegex(ckpt.InvalidArgument, "needs the checkpoint's config.json"):
            self.client.attach("llama.bare").state_dict(0, 2, "auto")
        # With the folder's config.json stored in the segment, "auto" needs nothing more.
        self.assertEqual(c.config, self.config("llama"))
        self.assertEqual(len(c.state_dict(0, 2, "auto")), len(c.state_dict(0, 2, "auto", config=self.config("llama"))))
        # architectures pick the family when model_type is missing
        sd = c.state_dict(0, 2, "auto", config={"architectures": ["LlamaForCausalLM"], "num_attention_heads": 4,
                                                "num_key_value_heads": 2, "head_dim": 4})
        self.assertEqual(tuple(sd["model.layers.0.self_attn.q_proj.weight"].shape), (8, tp_cases.H))
        with self.assertRaisesRegex(ckpt.InvalidArgument, "unknown convention 'deepspeed'"):
            c.state_dict(0, 2, "llama", convention="deepspeed")

    def test_malformed_config_json_is_a_typed_error(self):
        # Folders whose config.json is hostile: the daemon keeps the bytes; plan="auto",
        # Checkpoint.config and load_model's config path raise ckpt errors naming the cause
        # (they raised RecursionError / UnicodeDecodeError / TypeError before).
        deep = "[" * 100000 + "]" * 100000
        cases = {
            "bad-utf8": (b'{"model_type": "llama\xff"}', "not UTF-8"),
            "deep": (('{"model_type": "llama", "num_attention_heads": ' + deep + "}").encode(), "nested too deeply"),
            "deep-doc": (deep.encode(), "nested too deeply"),
            "list": (b'["llama"]', "not an object"),
            "not-json": (b'{"model_type": "llama",', "not valid JSON"),
            "huge-int": (b'{"model_type": "llama", "num_attention_heads": ' + b"9" * 5000 + b"}", "not valid JSON"),
        }
        for tag, (raw, needle) in cases.items():
            with self.subTest(tag):
                d = os.path.join(self.tmp.name, "cfg-" + tag)
                os.makedirs(d)
                shutil.copy(os.path.join(self.tmp.name, "llama", "model.safetensors"), d)
                with open(os.path.join(d, "config.json"), "wb") as f:
                    f.write(raw)
                self.client.load(os.path.join(d, "model.safetensors"), "cfg-" + tag)
                c = self.client.attach("cfg-" + tag)
                with self.assertRaises(ckpt.Corrupt) as cm:
                    c.config
                self.assertIn(needle, str(cm.exception))
                self.assertIn("cfg-" + tag, str(cm.exception))
                with self.assertRaises(ckpt.Corrupt):
                    c.state_dict(0, 2, "auto")
                with self.assertRaises(ckpt.InvalidArgument) as cm:
                    ckpt.plans.for_config(raw)
                self.assertIn(needle, str(cm.exception))
        # Given as config=: wrong types, huge numbers and nesting are typed errors too.
        c = self.client.attach("llama")
        cfg = self.config("llama")
        nested = {}
        for _ in range(5000):
            nested = {"a": nested}
        for bad, needle in ((dict(cfg, num_attention_heads=10 ** 30), "must be a positive integer"),
                            (dict(cfg, num_attention_heads=float("inf")), "cannot be passed to the plan engine"),
                            (dict(cfg, num_attention_heads=[[[4]]]), "got an array"),
                            (dict(cfg, model_type=["llama"]), "'model_type' must be a string"),
                            (dict(cfg, extra=nested), "nested too deeply"),
                            (dict(cfg, extra=object()), "cannot be passed to the plan engine")):
            with self.assertRaises(ckpt.InvalidArgument) as cm:
                c.state_dict(0, 2, "auto", config=bad)
            self.assertIn(needle, str(cm.exception))
        self.assertEqual(len(c.state_dict(0, 2, "auto")), len(c.state_dict(0, 2, "auto", config=cfg)))  # serving

    def test_a_family_plan_that_matches_nothing_is_an_error_not_a_replica(self):
        c = self.client.attach("gpt2")
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"the llama plan needs .*q_proj.*another family.*built-in "
                                                          r"families: .*gpt2"):
            c.state_dict(0, 2, "llama")
        with self.assertRaisesRegex(ckpt.InvalidArgument, "none of its rules matches any tensor"):
            c.state_dict(0, 2, {r"^nothing\.like\.this$": ckpt.column()})

    def test_config_that_disagrees_with_the_tensors(self):
        c = self.client.attach("llama")
        cfg = self.config("llama")
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"model\.layers\.0\.self_attn\.q_proj\.weight.*does not "
                                                          r"hold 3 equal heads"):
            c.state_dict(0, 1, "auto", config=dict(cfg, num_attention_heads=3, num_key_value_heads=1, head_dim=5))
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"needs 3 q_proj weights \(one per layer\).*has 2"):
            c.state_dict(0, 2, "auto", config=dict(cfg, num_hidden_layers=3))
        with self.assertRaisesRegex(ckpt.InvalidArgument, "config field 'num_attention_heads' must be a positive integer"):
            c.state_dict(0, 2, "auto", config=dict(cfg, num_attention_heads="four"))
        mixtral = self.client.attach("mixtral")
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"experts\.(gate_up|down)_proj' stacks 4 experts.*config "
                                                          r"names 5"):
            mixtral.state_dict(0, 2, "auto", convention="hf", config=dict(self.config("mixtral"), num_local_experts=5))
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"expert 3 is beyond the 3 experts"):
            mixtral.state_dict(0, 1, "auto", config=dict(self.config("mixtral"), num_local_experts=3),
                               expert_parallel=True)

    def test_tp_degree_that_does_not_divide_heads_or_experts(self):
        c = self.client.attach("llama")
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"k_proj\.weight.*2 key/value heads cannot be replicated "
                                                          r"evenly over world 3"):
            c.state_dict(0, 3, "auto", config=self.config("llama"))
        # q heads are never replicated: 4 heads over 8 ranks is an error (k/v: 2 heads, 4 copies each)
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"q_proj\.weight.*4 heads do not divide over world 8"):
            c.state_dict(0, 8, "auto", config=self.config("llama"))
        m = self.client.attach("mixtral")
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"experts\.\d\.w\d\.weight.*4 experts do not divide over "
                                                          r"world 8"):
            m.state_dict(0, 8, "auto", config=dict(self.config("mixtral"), num_attention_heads=8,
                                                   num_key_value_heads=8, head_dim=2), expert_parallel=True)
        oss = self.client.attach("gpt_oss")
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"experts\.(gate_up|down)_proj.*4 experts do not divide over world 8"):
            oss.state_dict(0, 8, "auto", config=dict(self.config("gpt_oss"), num_attention_heads=8,
                                                     num_key_value_heads=8), expert_parallel=True)

    def test_bad_plan_file_and_no_hf_plan(self):
        path = os.path.join(self.tmp.name, "bad_plan.json")
        with open(path, "w") as f:
            json.dump({"rules": [{"pattern": "q_proj(", "rule": "column"}]}, f)
        c = self.client.attach("llama")
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"bad_plan\.json.*plan rule #0.*bad regular expression "
                                                          r"/q_proj\(/"):
            c.state_dict(0, 2, path)
        with open(path, "w") as f:
            json.dump({"rules": [{"pattern": "q_proj", "rule": "diagonal"}]}, f)
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"plan rule #0.*unknown sharding rule 'diagonal'"):
            c.state_dict(0, 2, path)
        g = self.client.attach("gpt2")
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"'gpt2' has no tensor-parallel plan in transformers.*"
                                                          r"megatron"):
            g.state_dict(0, 2, "auto", convention="hf", config=self.config("gpt2"))
        with self.assertRaisesRegex(ckpt.InvalidArgument, "falcon.*needs the model's config"):
            self.client.attach("falcon.bare").state_dict(0, 2, "falcon")
        # The daemon keeps serving after all of that.
        self.assertEqual(len(c.state_dict(0, 2, "auto", config=self.config("llama"))),
                         len(c.keys()))

    def test_plans_module_is_a_thin_layer(self):
        self.assertIn("deepseek_v3", ckpt.plans.families())
        self.assertEqual(len(ckpt.plans.families()), 24)
        with open(ckpt.plans.__file__) as f:
            src = f.read()
        self.assertNotIn("import re\n", src)  # no second regex engine, no second copy of a plan
        self.assertNotIn("q_proj", src)


if __name__ == "__main__":
    unittest.main()
