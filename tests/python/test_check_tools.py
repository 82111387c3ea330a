"""tools/gpu/check_hf_families.py's own machinery in CI, where transformers is absent: its
comparison helpers, and one end-to-end run (models saved, `ckptctl load`ed into the real
ckptd, rank groups spawned, a rank group that hangs restarted without its family, the
markdown table) against a stand-in `transformers` package written below. What the tool checks
about transformers itself only the GPU machine can show."""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import torch
from torch import nn

TOOL = os.path.join(os.environ["CKPT_TOOLS_DIR"], "gpu", "check_hf_families.py")

STAND_IN = textwrap.dedent('''
    """A stand-in for transformers in ckpt's CI (not the real package)."""
    import json, os, time, types
    import torch
    from torch import nn

    __version__ = "0.0+ckpt-test-stand-in"

    class PretrainedConfig:
        model_type = ""

        def __init__(self, architectures=None, tie_word_embeddings=True, **kw):
            self.architectures, self.tie_word_embeddings = architectures, tie_word_embeddings
            for k, v in kw.items():
                setattr(self, k, v)

        @classmethod
        def from_dict(cls, d):
            d = dict(d)
            d.pop("model_type", None)
            return cls(**d)

        def to_dict(self):
            return dict(self.__dict__, model_type=self.model_type)

    class LlamaConfig(PretrainedConfig):
        model_type = "llama"

        def __init__(self, vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                     num_attention_heads=8, num_key_value_heads=4, **kw):  # sizes the tool's hf_tiny shrinks
            super().__init__(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                             num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                             num_key_value_heads=num_key_value_heads, **kw)

    class MistralConfig(LlamaConfig):
        model_type = "mistral"

    CONFIG_MAPPING = {"llama": LlamaConfig, "mistral": MistralConfig}

    class AutoConfig:
        @staticmethod
        def for_model(model_type, **kw):
            return CONFIG_MAPPING[model_type](**kw)

    class Attention(nn.Module):  # llama's projection names and shapes, a toy forward
        def __init__(self, c):
            super().__init__()
            head_dim = c.hidden_size // c.num_attention_heads
            self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * head_dim, bias=False)
            self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * head_dim, bias=False)
            self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * head_dim, bias=False)
            self.o_proj = nn.Linear(c.num_attention_heads * head_dim, c.hidden_size, bias=False)

    class Mlp(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
            self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
            self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    class Layer(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.self_attn, self.mlp = Attention(c), Mlp(c)

        def forward(self, x):
            a = self.self_attn
            kv = torch.tanh(a.k_proj(x)).sum(-1, keepdim=True) + torch.tanh(a.v_proj(x)).sum(-1, keepdim=True)
            x = x + a.o_proj(torch.tanh(a.q_proj(x)) * kv)
            return x + self.mlp.down_proj(torch.tanh(self.mlp.gate_proj(x)) * self.mlp.up_proj(x))

    class Inner(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
            self.layers = nn.ModuleList([Layer(c) for _ in range(c.num_hidden_layers)])

    class PreTrainedModel(nn.Module):  # transformers' own from_pretrained
        @classmethod
        def from_pretrained(cls, folder, tp_plan=None, device_map=None, output_loading_info=False, **kw):
            if tp_plan:
                raise NotImplementedError("the stand-in has no tensor parallelism")
            with open(os.path.join(folder, "config.json")) as f:
                d = json.load(f)
            config = CONFIG_MAPPING[d["model_type"]].from_dict(d)
            model = cls(config)
            result = model.load_state_dict(torch.load(os.path.join(folder, "pytorch_model.bin")), strict=False)
            model.tie_weights()
            missing = [k for k in result.missing_keys if k != "lm_head.weight"]  # tied
            info = {"missing_keys": set(missing), "unexpected_keys": set(result.unexpected_keys)}
            return (model, info) if output_loading_info else model

    class LlamaForCausalLM(PreTrainedModel):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.model = Inner(config)
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.tie_weights()

        tp_plan = {"model.layers.*": "colwise"}

        @classmethod
        def _from_config(cls, config, **kw):
            return cls(config)

        def tie_weights(self):
            if self.config.tie_word_embeddings:
                self.lm_head.weight = self.model.embed_tokens.weight

        def forward(self, input_ids):
            x = self.model.embed_tokens(input_ids)
            for layer in self.model.layers:
                x = torch.tanh(layer(x))
            return types.SimpleNamespace(logits=self.lm_head(x))

        def save_pretrained(self, folder):
            os.makedirs(folder, exist_ok=True)
            d = dict(self.config.__dict__, model_type=self.config.model_type, architectures=[type(self).__name__])
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(d, f)
            sd = {k: v.contiguous() for k, v in self.state_dict().items() if k != "lm_head.weight"}
            torch.save(sd, os.path.join(folder, "pytorch_model.bin"))

    class MistralForCausalLM(LlamaForCausalLM):
        @classmethod
        def from_pretrained(cls, folder, **kw):
            time.sleep(3600)  # hangs: the tool must give up on this family and go on

    MODEL_FOR_CAUSAL_LM_MAPPING = {LlamaConfig: LlamaForCausalLM, MistralConfig: MistralForCausalLM}

    class AutoModelForCausalLM:
        @staticmethod
        def from_config(config):
            return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)](config)

        @staticmethod
        def from_pretrained(folder, **kw):
            with open(os.path.join(folder, "config.json")) as f:
                config = CONFIG_MAPPING[json.load(f)["model_type"]]
            return {LlamaConfig: LlamaForCausalLM, MistralConfig: MistralForCausalLM}[config].from_pretrained(folder, **kw)
''')


def load_tool():
    import importlib.util
    spec = importlib.util.spec_from_file_location("check_hf_families", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CompareTest(unittest.TestCase):
    def test_compare_names_shapes_and_bytes(self):
        tool = load_tool()

        class Ref(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(4, 4)
                self.b = nn.Linear(4, 4, bias=False)
                self.b.weight = self.a.weight  # tied: held once by ckpt

        ref = Ref()
        ours = {"a.weight": ref.a.weight.detach().clone(), "a.bias": ref.a.bias.detach().clone()}
        self.assertEqual(tool.compare(ours, ref), [])
        ours["a.bias"][0] += 1
        self.assertEqual(tool.compare(ours, ref), ["a.bias: (4,) float32 vs transformers (4,) float32 (bytes differ)"])
        diffs = tool.compare({"a.weight": ours["a.weight"][:2], "x": torch.zeros(1)}, ref)
        self.assertEqual(diffs, ["a.weight: (2, 4) float32 vs transformers (4, 4) float32",
                                 "x: not in transformers' model", "a.bias: missing (transformers holds (4,) float32)"])
        self.assertFalse(tool.same_bytes(torch.tensor([0.0]), torch.tensor([-0.0])), "bytes, not values")
        self.assertFalse(tool.same_bytes(torch.zeros(2), torch.zeros(2, dtype=torch.float64)))


class EndToEndTest(unittest.TestCase):
    def test_a_run_writes_the_table_and_survives_a_hanging_family(self):
        with tempfile.TemporaryDirectory() as tmp:
            pkg = os.path.join(tmp, "standin", "transformers")
            os.makedirs(pkg)
            with open(os.path.join(pkg, "__init__.py"), "w") as f:
                f.write(STAND_IN)
            table = os.path.join(tmp, "table.md")
            data = os.path.join(tmp, "plans.json")  # the plan data's model types, as the generator writes them
            with open(data, "w") as f:
                json.dump({"transformers": "0.0+ckpt-test-stand-in", "families": {
                    "llama": {"model_class": "LlamaForCausalLM", "task": "causal_lm"},
                    "mistral": {"model_class": "MistralForCausalLM", "task": "causal_lm"}}}, f)
            env = dict(os.environ, PYTHONPATH=os.path.join(tmp, "standin") + os.pathsep + os.environ["PYTHONPATH"])
            # The tool's families are the data's model types and its no-plan families; llama and
            # mistral exist in the stand-in (mistral hangs), gpt2 does not.
            r = subprocess.run([sys.executable, TOOL, "--ckptd", os.environ["CKPTD_BIN"], "--out", table,
                                "--workdir", os.path.join(tmp, "work"), "--families", "llama,mistral,gpt2",
                                "--data", data, "--worlds", "1", "--logits-worlds", "1", "--no-gpu",
                                "--family-timeout", "20", "--jobs", "2", "--shards", "1"],
                               env=env, capture_output=True, text=True, timeout=240)
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            with open(table) as f:
                text = f.read()
        rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
        self.assertIn("CPU/gloo TP=1 logits", rows["family"])
        self.assertIn("| equal |", rows["llama"], "load_model through the real daemon gives the same logits")
        self.assertIn("rank group timed out during this family", rows["mistral"])
        self.assertIn("has no GPT2Config", rows["gpt2"])
        self.assertIn("loaded into ckptd as hf-llama", r.stdout)
        self.assertIn("2 model types with a transformers TP plan: 1 with every rank's tensors equal", text)


if __name__ == "__main__":
    unittest.main()
