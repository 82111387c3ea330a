"""ckpt.transformers.load_model where transformers is not installed (CI, Debian's torch 1.13).

transformers itself is exercised on the GPU machine by tools/gpu/check_hf_families.py.
Here, (1) the module says clearly that transformers is missing and `import ckpt` never
imports it; (2) load_model's own work (config resolution, class choice, the meta build,
filling through the real daemon, tying, strict keys, launcher defaults) runs against a
stand-in `transformers` package written below, shaped like transformers' llama (the names,
the non-persistent rotary buffer, tie_weights, _from_config, _keys_to_ignore_on_load_unexpected).
"""
import gc
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest
from unittest import mock

import torch
from torch import nn

import ckpt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_ckpt  # noqa: E402

STAND_IN = textwrap.dedent('''
    """A stand-in for transformers in ckpt's CI (not the real package)."""
    import types
    import torch
    from torch import nn

    __version__ = "0.0+ckpt-test-stand-in"
    built = []  # (class name, kwargs) per _from_config call

    class PretrainedConfig:
        model_type = ""

        def __init__(self, architectures=None, tie_word_embeddings=True, **kwargs):
            self.architectures = architectures
            self.tie_word_embeddings = tie_word_embeddings
            for k, v in kwargs.items():
                setattr(self, k, v)

        @classmethod
        def from_dict(cls, d):
            d = dict(d)
            d.pop("model_type", None)
            return cls(**d)

    class TinyConfig(PretrainedConfig):
        model_type = "tiny"

        def __init__(self, hidden_size=32, vocab_size=48, num_hidden_layers=2, **kwargs):
            super().__init__(**kwargs)
            self.hidden_size, self.vocab_size, self.num_hidden_layers = hidden_size, vocab_size, num_hidden_layers

    CONFIG_MAPPING = {"tiny": TinyConfig}

    class Rotary(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim)),
                                 persistent=False)

    class Layer(nn.Module):
        def __init__(self, h):
            super().__init__()
            self.self_attn = nn.Module()
            for p in ("q_proj", "k_proj", "v_proj"):
                setattr(self.self_attn, p, nn.Linear(h, h, bias=False))
            self.self_attn.o_proj = nn.Linear(h, h, bias=False)
            self.mlp = nn.Module()
            self.mlp.up_proj = nn.Linear(h, 2 * h, bias=False)
            self.mlp.down_proj = nn.Linear(2 * h, h, bias=False)
            self.input_layernorm = nn.LayerNorm(h)

        def forward(self, x, freq):
            a = self.self_attn
            y = self.input_layernorm(x) * freq.mean()
            x = x + a.o_proj(torch.softmax(a.q_proj(y) @ a.k_proj(y).transpose(-1, -2), -1) @ a.v_proj(y))
            return x + self.mlp.down_proj(torch.relu(self.mlp.up_proj(x)))

    class TinyModel(nn.Module):
        def __init__(self, config):
            super().__init__()
            h = config.hidden_size
            self.embed_tokens = nn.Embedding(config.vocab_size, h)
            self.layers = nn.ModuleList([Layer(h) for _ in range(config.num_hidden_layers)])
            self.norm = nn.LayerNorm(h)
            self.rotary_emb = Rotary(h)

    class TinyForCausalLM(nn.Module):
        _keys_to_ignore_on_load_unexpected = [r"\\.attn\\.masked_bias$"]

        def __init__(self, config):
            super().__init__()
            self.config = config
            self.model = TinyModel(config)
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.tie_weights()

        @classmethod
        def _from_config(cls, config, **kwargs):
            built.append((cls.__name__, dict(kwargs)))
            dtype = kwargs.pop("dtype", None)
            old = torch.get_default_dtype()
            if dtype is not None:
                torch.set_default_dtype(dtype)
            try:
                return cls(config, **kwargs)
            finally:
                torch.set_default_dtype(old)

        def tie_weights(self):
            if self.config.tie_word_embeddings:
                self.lm_head.weight = self.model.embed_tokens.weight

        def forward(self, input_ids):
            x = self.model.embed_tokens(input_ids)
            for layer in self.model.layers:
                x = layer(x, self.model.rotary_emb.inv_freq)
            return types.SimpleNamespace(logits=self.lm_head(self.model.norm(x)))

    class OtherForCausalLM(TinyForCausalLM):
        pass

    MODEL_FOR_CAUSAL_LM_MAPPING = {TinyConfig: TinyForCausalLM}
''')

CONFIG = {"model_type": "tiny", "architectures": ["TinyForCausalLM"], "hidden_size": 32, "vocab_size": 48,
          "num_hidden_layers": 2, "tie_word_embeddings": True}


class WithoutTransformersTest(unittest.TestCase):
    def test_import_ckpt_never_imports_transformers(self):
        code = ("import sys, ckpt, ckpt.transformers, ckpt.modules; "
                "assert 'transformers' not in sys.modules, 'imported transformers'")
        subprocess.run([sys.executable, "-c", code], check=True, env=os.environ.copy())

    def test_load_model_says_transformers_is_missing(self):
        if importlib.util.find_spec("transformers") is not None:
            self.skipTest("transformers is installed here")
        import ckpt.transformers
        with self.assertRaisesRegex(ckpt.Unsupported, r"needs the transformers package.*fill_module"):
            ckpt.transformers.load_model("anything")


class LoadModelStandInTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        pkg = os.path.join(cls.tmp.name, "standin", "transformers")
        os.makedirs(pkg)
        with open(os.path.join(pkg, "__init__.py"), "w") as f:
            f.write(STAND_IN)
        sys.path.insert(0, os.path.dirname(pkg))
        sys.modules.pop("transformers", None)
        import transformers
        cls.tf = transformers
        torch.manual_seed(3)
        cls.ref = transformers.TinyForCausalLM(transformers.TinyConfig(**{k: v for k, v in CONFIG.items()
                                                                          if k != "model_type"})).eval()
        sd = {k: v.clone() for k, v in cls.ref.state_dict().items() if k != "lm_head.weight"}
        cls.sd = sd
        cls.daemon = test_ckpt.Daemon(cls.tmp.name)
        cls.daemon.start()
        cls.client = ckpt.connect(cls.daemon.socket)
        cls.put("tiny", sd)
        cls.folder = os.path.join(cls.tmp.name, "folder")
        os.makedirs(cls.folder)
        with open(os.path.join(cls.folder, "config.json"), "w") as f:
            json.dump(CONFIG, f)
        cls.ids = torch.randint(0, 48, (2, 6), generator=torch.Generator().manual_seed(2))

    @classmethod
    def put(cls, name, tensors):
        path = os.path.join(cls.tmp.name, f"{name}.safetensors")
        test_ckpt.make_checkpoint.write_safetensors(path, tensors)
        cls.client.load(path, name)

    @classmethod
    def tearDownClass(cls):
        sys.modules.pop("transformers", None)
        sys.path.remove(os.path.join(cls.tmp.name, "standin"))
        cls.client = None
        gc.collect()
        cls.daemon.cleanup()
        cls.tmp.cleanup()

    def load(self, name="tiny", **kwargs):
        import ckpt.transformers
        kwargs.setdefault("config", CONFIG)
        return ckpt.transformers.load_model(name, client=self.client, **kwargs)

    def test_world_1_model_equals_the_original(self):
        model = self.load(rank=0, world=1, device="cpu")
        self.assertIsInstance(model, self.tf.TinyForCausalLM)
        self.assertFalse(model.training, "eval mode, as from_pretrained returns it")
        self.assertFalse(any(p.is_meta for p in model.parameters()))
        self.assertIs(model.lm_head.weight, model.model.embed_tokens.weight)
        for name, t in self.ref.state_dict().items():
            self.assertTrue(torch.equal(model.state_dict()[name], t), name)
        self.assertTrue(torch.equal(model.model.rotary_emb.inv_freq, self.ref.model.rotary_emb.inv_freq))
        with torch.no_grad():
            self.assertTrue(torch.equal(model(self.ids).logits, self.ref(self.ids).logits))
        self.assertEqual(model.ckpt_fill, "ckpt")
        self.assertEqual(model.ckpt_report.tied, [("model.embed_tokens.weight", "lm_head.weight")])

    def test_config_from_a_folder_and_class_choice(self):
        self.assertIsInstance(self.load(world=1, config=self.folder), self.tf.TinyForCausalLM)
        self.assertIsInstance(self.load(world=1, config=os.path.join(self.folder, "config.json")),
                              self.tf.TinyForCausalLM)
        self.assertIsInstance(self.load(world=1, model_class="OtherForCausalLM"), self.tf.OtherForCausalLM)
        unknown_arch = dict(CONFIG, architectures=["NotInThisVersion"])
        self.assertIsInstance(self.load(world=1, config=unknown_arch), self.tf.TinyForCausalLM)  # the auto mapping
        with self.assertRaisesRegex(ckpt.InvalidArgument, "no model class 'Nope'"):
            self.load(world=1, model_class="Nope")
        with self.assertRaisesRegex(ckpt.Unsupported, r"model_type 'mamba9' is not known to transformers 0\.0"):
            self.load(world=1, config=dict(CONFIG, model_type="mamba9"))
        with self.assertRaisesRegex(ckpt.InvalidArgument, "cannot read the model config"):
            self.load(world=1, config=os.path.join(self.folder, "nope.json"))

    def test_non_finite_floats_as_save_pretrained_writes_them(self):
        # transformers writes inf/nan in config.json as {"__float__": "Infinity"} (falcon_h1's
        # time_step_limit); its own reader turns them back into floats, and so must load_model.
        import ckpt.transformers
        spelled = dict(CONFIG, time_step_limit=[0.0, {"__float__": "Infinity"}],
                       nested={"low": {"__float__": "-Infinity"}, "odd": [{"__float__": "NaN"}],
                               "kept": {"__float__": "Infinity", "other": 1}})
        path = os.path.join(self.tmp.name, "special-floats.json")
        with open(path, "w") as f:
            json.dump(spelled, f)
        cfg = ckpt.transformers.model_config(None, path)
        self.assertEqual(cfg.time_step_limit, [0.0, float("inf")])
        self.assertEqual(cfg.nested["low"], float("-inf"))
        self.assertNotEqual(cfg.nested["odd"][0], cfg.nested["odd"][0])  # nan
        self.assertEqual(cfg.nested["kept"], {"__float__": "Infinity", "other": 1})  # not that spelling
        self.assertEqual(self.load(world=1, config=path).config.time_step_limit, [0.0, float("inf")])

    def test_no_stored_config_and_none_given_is_a_clear_error(self):
        c = self.client.attach("tiny")
        if getattr(c, "config", None) is not None:
            self.skipTest("this checkpoint has a stored config")
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"checkpoint 'tiny' has no config\.json.*pass config="):
            self.load(world=1, config=None)

    def test_dtype_builds_and_converts(self):
        self.tf.built.clear()
        model = self.load(world=1, dtype=torch.float64)
        self.assertEqual(model.model.layers[0].self_attn.q_proj.weight.dtype, torch.float64)
        self.assertEqual(self.tf.built[-1][1].get("dtype"), torch.float64)

    def test_strict_keys(self):
        extra = dict(self.sd)
        extra["model.layers.0.attn.masked_bias"] = torch.tensor(-1e4)  # the class ignores these
        extra["model.rotary_emb.inv_freq"] = torch.zeros(16)            # recomputed by the model
        self.put("tiny-extra", extra)
        model = self.load("tiny-extra", world=1)
        self.assertEqual(sorted(model.ckpt_report.ignored),
                         ["model.layers.0.attn.masked_bias", "model.rotary_emb.inv_freq"])
        self.assertTrue(torch.equal(model.model.rotary_emb.inv_freq, self.ref.model.rotary_emb.inv_freq))
        extra["model.layers.0.mlp.gate_proj.weight"] = torch.zeros(64, 32)
        del extra["model.norm.bias"]
        self.put("tiny-wrong", extra)
        with self.assertRaises(ckpt.InvalidArgument) as cm:
            self.load("tiny-wrong", world=1)
        self.assertIn("missing (no tensor in the checkpoint): model.norm.bias", str(cm.exception))
        self.assertIn("checkpoint 'tiny-wrong'", str(cm.exception))
        self.assertIn("unexpected (no such parameter or buffer): model.layers.0.mlp.gate_proj.weight",
                      str(cm.exception))
        # strict=False: a parameter left on meta is still an error naming it (issue 13) ...
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"left on the meta device .*: model\.norm\.bias"):
            self.load("tiny-wrong", world=1, strict=False)
        # ... unless allow_meta=True, which fills the rest and reports the hole.
        model = self.load("tiny-wrong", world=1, strict=False, allow_meta=True)
        self.assertEqual(model.ckpt_report.missing, ["model.norm.bias"])

    def test_untied_config_needs_the_head(self):
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"missing \(no tensor in the checkpoint\): lm_head\.weight"):
            self.load(world=1, config=dict(CONFIG, tie_word_embeddings=False))

    def test_launcher_defaults_and_megatron_shards(self):
        plan = {r"self_attn\.[qkv]_proj\.weight$": ckpt.column(), r"o_proj\.weight$": ckpt.row(),
                r"mlp\.up_proj\.weight$": ckpt.column(), r"mlp\.down_proj\.weight$": ckpt.row()}
        with mock.patch.dict(os.environ, {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}):
            model = self.load(convention="megatron", tp_plan=plan)
        q = model.model.layers[1].self_attn.q_proj.weight
        self.assertEqual(q.device.type, "cpu")  # no CUDA here: the CPU
        self.assertTrue(torch.equal(q, torch.chunk(self.sd["model.layers.1.self_attn.q_proj.weight"], 2)[1]))
        down = model.model.layers[0].mlp.down_proj.weight
        self.assertTrue(torch.equal(down, torch.chunk(self.sd["model.layers.0.mlp.down_proj.weight"], 2, -1)[1]))

    def test_hf_tensor_parallel_needs_torch_2_5(self):
        if hasattr(torch.distributed, "device_mesh") or torch.__version__ >= "2.5":
            self.skipTest("this torch has device meshes: covered by tools/gpu/check_hf_families.py")
        with self.assertRaisesRegex(ckpt.Unsupported, r"needs torch >= 2\.5"):
            self.load(rank=0, world=2, convention="hf")
        self.assertFalse(torch.distributed.is_initialized(), "no process group was started")

    def test_errors_of_the_load_and_of_the_build_both_surface(self):
        # The shards are fetched on a second thread while the model is built.
        plan = {r"self_attn\.q_proj\.weight$": ckpt.column()}  # 32 rows over 3 ranks
        with self.assertRaisesRegex(ckpt.InvalidArgument, "cannot split|divide"):
            self.load(rank=0, world=3, convention="megatron", tp_plan=plan)

        class Broken(self.tf.TinyForCausalLM):
            def __init__(self, config):
                raise RuntimeError("broken model class")

        with self.assertRaisesRegex(RuntimeError, "broken model class"):
            self.load(world=1, model_class=Broken)

    def test_an_attached_checkpoint_is_used_as_it_is(self):
        import ckpt.transformers
        c = self.client.attach("tiny")
        # Neither a connection nor a second attachment: the Checkpoint given is the source.
        with mock.patch.object(ckpt.Client, "attach", side_effect=AssertionError("attached again")), \
                mock.patch.object(ckpt, "connect", side_effect=AssertionError("connected")):
            model = ckpt.transformers.load_model(c, rank=0, world=1, device="cpu", config=CONFIG)
        for name, t in self.ref.state_dict().items():
            self.assertTrue(torch.equal(model.state_dict()[name], t), name)
        self.assertIs(model.lm_head.weight, model.model.embed_tokens.weight)
        with torch.no_grad():
            self.assertTrue(torch.equal(model(self.ids).logits, self.ref(self.ids).logits))
        # Still attached and usable afterwards; errors name it.
        self.assertTrue(torch.equal(c.state_dict()["model.norm.weight"], self.sd["model.norm.weight"]))
        with self.assertRaisesRegex(ckpt.InvalidArgument,
                                    r"checkpoint 'tiny'.*missing \(no tensor in the checkpoint\): lm_head\.weight"):
            ckpt.transformers.load_model(c, world=1, config=dict(CONFIG, tie_word_embeddings=False))

    def test_name_must_be_a_name_or_a_checkpoint(self):
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"name must be a checkpoint name or a ckpt\.Checkpoint, not int"):
            self.load(42, world=1)

    def test_phase_times(self):
        t = self.load(world=1).ckpt_times
        for k in ("attach", "build", "buffers", "walk", "wait", "fill", "tie", "total", "engine", "engine_start"):
            self.assertIn(k, t)
            self.assertGreaterEqual(t[k], 0.0, k)
        self.assertGreaterEqual(t["total"], t["attach"] + t["build"] + t["wait"] + t["fill"])

    def test_the_model_is_built_while_the_shards_are_copied(self):
        # Each side waits until the other has started: run one after the other, the first
        # would wait in vain (no wall-clock threshold, so a loaded machine cannot fail it).
        real = ckpt.Checkpoint.state_dict
        copy_started, build_started = threading.Event(), threading.Event()
        overlapped = []

        def slow_copy(self_, *args, **kwargs):
            copy_started.set()
            overlapped.append(("copy saw the build", build_started.wait(60)))
            return real(self_, *args, **kwargs)

        class SlowBuild(self.tf.TinyForCausalLM):
            def __init__(self, config):
                build_started.set()
                overlapped.append(("build saw the copy", copy_started.wait(60)))
                super().__init__(config)

        with mock.patch.object(ckpt.Checkpoint, "state_dict", slow_copy):
            model = self.load(world=1, model_class=SlowBuild)
        self.assertEqual(sorted(overlapped), [("build saw the copy", True), ("copy saw the build", True)])
        with torch.no_grad():
            self.assertTrue(torch.equal(model(self.ids).logits, self.ref(self.ids).logits))

    def test_model_class_is_resolved_once(self):
        calls = []

        class Counting(dict):
            def __getitem__(self_, key):
                calls.append(key)
                return dict.__getitem__(self_, key)

        config = dict(CONFIG, architectures=["NotInThisVersionEither"])
        with mock.patch.object(self.tf, "MODEL_FOR_CAUSAL_LM_MAPPING", Counting(self.tf.MODEL_FOR_CAUSAL_LM_MAPPING)):
            for _ in range(3):
                self.assertIsInstance(self.load(world=1, config=config), self.tf.TinyForCausalLM)
            # Another class name is another resolution, never the cached one.
            self.assertIsInstance(self.load(world=1, config=config, model_class="OtherForCausalLM"),
                                  self.tf.OtherForCausalLM)
        self.assertEqual(len(calls), 1)

    def test_build_threads_are_restored(self):
        from ckpt.transformers import _intra_op_threads
        n = torch.get_num_threads()
        if n == 1:
            self.skipTest("torch runs one intra-op thread here")
        with self.assertRaisesRegex(RuntimeError, "inside"):
            with _intra_op_threads(1):
                self.assertEqual(torch.get_num_threads(), 1)
                raise RuntimeError("inside")
        self.assertEqual(torch.get_num_threads(), n)
        with _intra_op_threads(None):
            self.assertEqual(torch.get_num_threads(), n)

    def test_non_persistent_buffers_move_once_and_persistent_ones_stay(self):
        from ckpt.transformers import _buffers_to
        shared = torch.arange(4.0)
        a, b, m = nn.Module(), nn.Module(), nn.Module()
        a.register_buffer("freq", shared, persistent=False)
        b.register_buffer("freq", shared, persistent=False)
        m.a, m.b = a, b
        m.register_buffer("kept", torch.ones(2))  # persistent: the checkpoint's, moved by the fill if at all
        m.register_buffer("none", None)
        self.assertEqual(_buffers_to(m, torch.device("meta")), 16)
        self.assertTrue(m.a.freq.is_meta)
        self.assertIs(m.a.freq, m.b.freq)
        self.assertFalse(m.kept.is_meta)
        self.assertIsNone(m.none)
        self.assertEqual(_buffers_to(m, torch.device("meta")), 0)

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ckpt.InvalidArgument, "convention must be"):
            self.load(world=1, convention="deepspeed")
        with self.assertRaisesRegex(ckpt.InvalidArgument, "fill must be"):
            self.load(world=1, fill="magic")
        with self.assertRaisesRegex(ckpt.InvalidArgument, "rank 2 out of range for world 2"):
            self.load(rank=2, world=2)
        with self.assertRaisesRegex(ckpt.NotFound, "no checkpoint named 'nope'"):
            self.load("nope", world=1)


if __name__ == "__main__":
    unittest.main()
