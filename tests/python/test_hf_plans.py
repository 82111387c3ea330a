"""transformers' plans as data (issue 25), without transformers: the plan engine over the
embedded data file against a Python reference of transformers' split rules.

tests/python/data/hf_family_examples.json holds, for model types of the data, a tiny model as
transformers' save_pretrained wrote it (config.json, checkpoint tensor names and shapes) and
the names and shapes of the model's own parameters (tools/gpu/gen_hf_plans.py, GPU machine).
For each: at world 1 the "hf" outputs are the model's parameters (renames and expert fusions
applied), at worlds 2 and 4 each output's pieces split as transformers' style for its name
says (the reference: STYLE_SPLITS below, from integrations/tensor_parallel.py). Plus the
data's own shape and the bad inputs."""
import json
import os
import re
import unittest

import ckpt
import ckpt.plans

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "data", "hf_family_examples.json")

# transformers' style -> (dim of a >= 2-d parameter, dim of a 1-d "bias", dim of another 1-d
# parameter); None: whole on every rank.
STYLE_SPLITS = {
    "colwise": (-2, -1, -1), "colwise_gather_output": (-2, -1, -1),
    "rowwise": (-1, None, -1), "rowwise_split_input": (-1, None, -1),
    "packed_colwise": (-2, -1, -1), "packed_rowwise": (-1, None, None),
    "embedding_rowwise": (0, -1, None), "embedding_colwise": (1, None, None),
    "grouped_gemm": (0, 0, 0),
}


def generic(name):
    """transformers 5's replace_layer_number_by_wildcard: ".N." and a final ".N" become "*"."""
    return re.sub(r"\.\d+(?=\.|$)", ".*", name)


def style_of(plan, name):
    """transformers' lookup: the parameter's generic name, else its module's."""
    g = generic(name)
    if g in plan:
        return plan[g]
    return plan.get(g.rsplit(".", 1)[0]) if "." in g else None


def expected_dim(style, name, ndim):
    """The dim transformers splits `name` along (normalized), or None for whole."""
    if style not in STYLE_SPLITS:
        return None
    weight, bias, other = STYLE_SPLITS[style]
    d = weight if ndim >= 2 else (bias if name.endswith("bias") else other)
    return None if d is None else d % ndim


# Model types whose checkpoints, as transformers' save_pretrained writes them, the interpreter
# does not map to the model's names; each fails loudly (see test_known_gaps_fail_loudly):
KNOWN_GAPS = {
    # transformers 5.17's loader renames its own saved names to names its model lacks
    # ("model.language_model.model.x" -> "model.model.language_model.model.x": the prefix is
    # added before the language_model rename, which then no longer matches); ckptd follows
    # it, so no rule matches: refused, where from_pretrained leaves the weights at random.
    "shieldgemma2": "the shieldgemma2 plan: none of its rules matches",
}


def tie_of(config, entry):
    """transformers' tie for the plan's tie rule: the text config's tie_word_embeddings
    (composite models), else the config's, else the model type's default."""
    text = config.get(entry.get("text_config") or "", None)
    for c in (text if isinstance(text, dict) else {}, config):
        if isinstance(c.get("tie_word_embeddings"), bool):
            return c["tie_word_embeddings"]
    return entry.get("tie_default", False)


def tied_aliases(ex, filled=()):
    """The model's tied names that its checkpoint holds once: of each of the example's tied
    groups, the names besides one `filled` (an output); without the groups (an earlier
    generator), the output embedding where the checkpoint has none."""
    if "tied" in ex:
        return {n for group in ex["tied"] if set(group) & set(filled) for n in group if n not in filled}
    names = {n for n, _ in ex["model_tensors"]}
    return {n for n in names if n.endswith("lm_head.weight")} if not any(
        t[0].endswith("lm_head.weight") for t in ex["tensors"]) else set()


def out_shape(o, shapes):
    """An output's shape at world 1 from its pieces (whole tensors or rows of them, as a
    Chunk conversion's parts and a Concatenate's sources are), or its view."""
    if o.view:
        return list(o.view)
    if len(o.pieces) == 1 and o.pieces[0]["row_count"] < 0:
        return list(shapes[o.pieces[0]["source"]])  # a whole tensor (a scalar too)
    rows = [p["row_count"] if p["row_count"] >= 0 else shapes[p["source"]][0] for p in o.pieces]
    return [sum(rows)] + list(shapes[o.pieces[0]["source"]][1:])


def interleaved_parts(entry):
    """transformers' Interleave + Chunk conversions of an entry: (source pattern, targets)."""
    return [(c["source_patterns"][0], c["target_patterns"]) for c in entry.get("conversions", [])
            if c.get("kind") == "WeightConverter" and [o["op"] for o in c.get("operations", [])] == ["Interleave", "Chunk"]]


def chunk_parts(entry):
    """transformers' Chunk(dim 0) conversions of an entry, alone or before a PermuteForRope:
    (source pattern, target patterns)."""
    return [(c["source_patterns"][0], c["target_patterns"]) for c in entry.get("conversions", [])
            if c.get("kind") == "WeightConverter" and c.get("operations", [None])[0] == {"op": "Chunk", "dim": 0}
            and all(o["op"] == "PermuteForRope" for o in c["operations"][1:])]


def example_plan(mt, ex):
    """For an example: (its data entry, transformers' plan keys for its tie, its tensors, their
    shapes by name, ckpt's "hf" plan of its config)."""
    entry = json.loads(ckpt.plans.TpPlan.hf_entry(mt))
    tie = tie_of(ex["config"], entry)
    plan_keys = entry.get("tp_plan_tied") if tie and entry.get("tp_plan_tied") else entry["tp_plan"]
    tensors = [{"name": n, "dtype": dt, "shape": s} for n, dt, s in ex["tensors"]]
    shapes = {t["name"]: t["shape"] for t in tensors}
    return entry, plan_keys, tensors, shapes, ckpt.plans.for_config(ex["config"], "hf")


def rope_conversions(entry):
    """transformers' Chunk(dim 0) + PermuteForRope conversions of an entry: (source pattern,
    target patterns, the permuted targets' layer names, sub-config key)."""
    out = []
    for c in entry.get("conversions", []):
        ops = c.get("operations", [])
        if c.get("kind") == "WeightConverter" and [o["op"] for o in ops] == ["Chunk", "PermuteForRope"]:
            out.append((c["source_patterns"][0], c["target_patterns"], ops[1]["permute_layer_names"],
                        ops[1].get("subconfig_key")))
    return out


def rope_rows(rows, heads):
    """The source row of each row of a PermuteForRope'd part, as transformers' _apply makes
    them: view(heads, rows // heads // 2, 2, ...).transpose(1, 2).reshape(rows, ...)."""
    import torch
    return torch.arange(rows).view(heads, rows // heads // 2, 2).transpose(1, 2).reshape(rows).tolist()


def load_examples():
    with open(EXAMPLES) as f:
        return json.load(f)


class HfPlanDataTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.examples = load_examples()["families"]
        cls.types = ckpt.plans.hf_model_types()

    def test_the_data_covers_many_model_types_and_names_its_transformers(self):
        self.assertGreaterEqual(len(self.types), 150)
        self.assertRegex(ckpt.plans.hf_plans_version(), r"^5\.\d+")
        for mt in ("llama", "qwen3_moe", "mixtral", "deepseek_v3", "gemma3", "llava", "qwen2_5_vl", "gpt_oss"):
            self.assertIn(mt, self.types)
        self.assertEqual(load_examples()["transformers"], ckpt.plans.hf_plans_version())

    def test_every_entry_gives_a_plan_whose_styles_the_engine_knows(self):
        for mt in self.types:
            with self.subTest(model_type=mt):
                entry = json.loads(ckpt.plans.TpPlan.hf_entry(mt))
                plan = ckpt.plans.builtin(mt, "hf", config={"model_type": mt})
                self.assertEqual(plan.convention, "hf")
                self.assertTrue(entry["tp_plan"])

    def test_world_1_outputs_are_the_models_own_parameters(self):
        self.assertGreaterEqual(len(self.examples), 30)
        for mt, ex in sorted(self.examples.items()):
            if mt in KNOWN_GAPS:
                continue
            with self.subTest(model_type=mt):
                tensors = [{"name": n, "dtype": dt, "shape": s} for n, dt, s in ex["tensors"]]
                plan = ckpt.plans.for_config(ex["config"], "hf")
                outs = plan.resolve(tensors, 0, 1)
                model = {n: s for n, s in ex["model_tensors"]}
                shapes = {t["name"]: t["shape"] for t in tensors}
                for o in outs:
                    self.assertIn(o.name, model, f"{o.name}: not a parameter of transformers' model")
                    if not o.view:
                        self.assertEqual(out_shape(o, shapes), model[o.name], o.name)

    def test_worlds_2_and_4_split_as_transformers_styles_say(self):
        for mt, ex in sorted(self.examples.items()):
            if mt in KNOWN_GAPS:
                continue
            _, plan_keys, tensors, shapes, plan = example_plan(mt, ex)
            for world in (2, 4):
                for rank in range(world):
                    with self.subTest(model_type=mt, world=world, rank=rank):
                        try:
                            outs = plan.resolve(tensors, rank, world)
                        except ckpt.InvalidArgument as e:  # tiny shapes a world does not divide: said clearly
                            self.assertRegex(str(e), r"tensor '|world")
                            continue
                        for o in outs:
                            if len(o.pieces) != 1 or o.view or o.pieces[0]["source"] != o.name:
                                continue  # fused or renamed: covered by the fusion tests of test_plans.py
                            p, ndim = o.pieces[0], len(shapes[o.name])
                            style = style_of(plan_keys, o.name)
                            want = expected_dim(style, o.name, ndim) if ndim else None
                            got = None if p["kind"] == "replicate" else p["dim"] % max(ndim, 1)
                            self.assertEqual(got, want, f"{o.name} ({style}): split dim {got}, transformers {want}")
                            if got is not None and style in ("packed_colwise", "packed_rowwise"):
                                # _StridedShard(split_factor=2) of a weight, Shard(-1) of a vector
                                self.assertEqual(p["chunks"], 2 if ndim > 1 else 1, o.name)

    def test_chunked_parts_are_split_as_their_own_styles(self):
        """A Chunk(dim 0) conversion's part k is rows [k R/n, (k+1) R/n) of its source, split
        (or not) as transformers' style for the part's own name says."""
        checked = 0
        for mt, ex in sorted(self.examples.items()):
            if mt in KNOWN_GAPS:
                continue
            entry, plan_keys, tensors, shapes, plan = example_plan(mt, ex)
            if not chunk_parts(entry):
                continue
            for world in (2, 4):
                for rank in range(world):
                    with self.subTest(model_type=mt, world=world, rank=rank):
                        for o in plan.resolve(tensors, rank, world):
                            p = o.pieces[0]
                            n = [len(t) for s, t in chunk_parts(entry) if p["source"].endswith(s)]
                            if len(o.pieces) != 1 or p["row_count"] < 0 or not n:
                                continue  # not a part
                            n = n[0]
                            rows = shapes[p["source"]][0] // n
                            self.assertEqual((p["row_begin"] % rows, p["row_count"]), (0, rows), o.name)
                            ndim = len(shapes[p["source"]])
                            style = style_of(plan_keys, o.name)
                            want = expected_dim(style, o.name, ndim)
                            got = None if p["kind"] == "replicate" else p["dim"] % ndim
                            self.assertEqual(got, want, f"{o.name} ({style}): split dim {got}, transformers {want}")
                            if got is not None:
                                self.assertEqual((p["rank"], p["world"]), (rank, world), o.name)
                            checked += 1
        self.assertGreater(checked, 0)

    def test_rope_permuted_parts_take_the_rows_transformers_permutes(self):
        """A Chunk + PermuteForRope conversion's permuted part (kimi_k25's and step3p7's vision
        q/k) holds, row by row, the rows of its source that transformers' permutation puts
        there, at every world (the vision towers are replicated)."""
        checked = 0
        for mt, ex in sorted(self.examples.items()):
            entry, _, tensors, shapes, plan = example_plan(mt, ex)
            for source, targets, layers, sub in rope_conversions(entry):
                heads = (ex["config"].get(sub) or ex["config"]).get("num_attention_heads", 1)
                for world in (1, 2, 4):
                    for o in plan.resolve(tensors, world - 1, world):
                        src = o.pieces[0]["source"]
                        if not re.search(source, src) or not any(t in o.name for t in targets):
                            continue
                        k = next(i for i, t in enumerate(targets) if t in o.name)
                        part = shapes[src][0] // len(targets)
                        got = [p["row_begin"] + i * p["row_step"] for p in o.pieces for i in range(p["row_count"])]
                        permuted = any(l in targets[k] for l in layers)
                        want = [k * part + r for r in (rope_rows(part, heads) if permuted else range(part))]
                        with self.subTest(model_type=mt, output=o.name, world=world):
                            self.assertEqual(got, want)
                            self.assertEqual({p["kind"] for p in o.pieces}, {"replicate"})
                        checked += 1
        self.assertGreater(checked, 0)

    def test_known_gaps_fail_loudly_where_they_fail(self):
        for mt, why in KNOWN_GAPS.items():
            with self.subTest(model_type=mt):
                ex = self.examples[mt]
                tensors = [{"name": n, "dtype": dt, "shape": s} for n, dt, s in ex["tensors"]]
                with self.assertRaisesRegex(ckpt.InvalidArgument, why):
                    ckpt.plans.for_config(ex["config"], "hf").resolve(tensors, 0, 2)

    def test_every_name_is_renamed_as_transformers_loader_renames_it(self):
        """Each output's name is what transformers' own rename_source_key (legacy, scoped and
        prefix renamings, then the first converter) makes of each of its pieces' checkpoint
        names: the examples record that map from the GPU machine's transformers."""
        checked = 0
        for mt, ex in sorted(self.examples.items()):
            if mt in KNOWN_GAPS or "renamed" not in ex:
                continue
            checked += 1
            with self.subTest(model_type=mt):
                tensors = [{"name": n, "dtype": dt, "shape": s} for n, dt, s in ex["tensors"]]
                shapes = {t["name"]: t["shape"] for t in tensors}
                outs = ckpt.plans.for_config(ex["config"], "hf").resolve(tensors, 0, 1)
                model = {n for n, _ in ex["model_tensors"]}
                chunks = chunk_parts(json.loads(ckpt.plans.TpPlan.hf_entry(mt)))
                interleaved = interleaved_parts(json.loads(ckpt.plans.TpPlan.hf_entry(mt)))
                expert_splits = [(c["source_patterns"], c["target_patterns"])
                                 for c in json.loads(ckpt.plans.TpPlan.hf_entry(mt)).get("conversions", [])
                                 if [o["op"] for o in c.get("operations", [])] == ["ErnieFuseAndSplitTextVisionExperts"]]
                for o in outs:
                    for p in o.pieces:
                        want = ex["renamed"][p["source"]]
                        if want not in model and want.split(".", 1)[-1] in model:
                            want = want.split(".", 1)[-1]  # transformers strips the base-model prefix
                        split_by_rows = [t for _, t in interleaved if t[0] in want]
                        if p["row_step"] == 2 and split_by_rows:
                            # an Interleave + Chunk's part k: rows k, k + 2, ... of each matrix
                            want = want.replace(split_by_rows[0][0], split_by_rows[0][p["row_begin"] % 2])
                        elif p["row_count"] >= 0 and chunks:
                            # a Chunk's part k: the name of part 0 (what the record holds) with
                            # target 0 replaced by target k (transformers' Chunk.convert)
                            for _, targets in chunks:
                                if targets[0] in want:
                                    k = p["row_begin"] * len(targets) // shapes[p["source"]][0]
                                    want = want.replace(targets[0], targets[k])
                                    break
                        for _, targets in expert_splits:
                            # rename_source_key names every expert by the first target; the
                            # split operation then moves the later groups to the others
                            if targets[0] in want and o.name in [want.replace(targets[0], t) for t in targets]:
                                want = o.name
                        self.assertEqual(o.name, want, f"{p['source']}: ckptd {o.name}, transformers {want}")
                filled = {o.name for o in outs}
                self.assertEqual(sorted(model - filled - tied_aliases(ex, filled)), [],
                                 "model parameters no output fills")
        self.assertGreaterEqual(checked, 100)

    def test_scoped_renames_apply_under_their_sub_model_only(self):
        # A sub-model's renaming (transformers sets scope_prefix/base_model_prefix on it):
        # under "model.language_model." or "language_model." only, the prefix kept.
        entry = {"tp_plan": {"model.language_model.layers.*.mlp.up_proj": "colwise"},
                 "conversions": [{"kind": "WeightRenaming", "source_patterns": ["^blocks\\."],
                                  "target_patterns": ["layers."], "scope_prefix": "language_model",
                                  "base_model_prefix": "model"}]}
        plan = ckpt.plans.TpPlan.from_hf_entry("toy", json.dumps(entry), "", "a test")
        names = ["model.language_model.blocks.0.mlp.up_proj.weight", "language_model.blocks.1.mlp.up_proj.weight",
                 "vision.blocks.0.mlp.up_proj.weight"]
        outs = plan.resolve([{"name": n, "dtype": "F32", "shape": [8, 4]} for n in names], 0, 2)
        self.assertEqual(sorted(o.name for o in outs), ["language_model.layers.1.mlp.up_proj.weight",
                                                        "model.language_model.layers.0.mlp.up_proj.weight",
                                                        "vision.blocks.0.mlp.up_proj.weight"])
        # the first occurrence of the matched text is replaced, once (str.replace(..., 1))
        entry = {"tp_plan": {}, "conversions": [{"kind": "WeightRenaming", "source_patterns": ["x\\.y$"],
                                                 "target_patterns": ["z"]}]}
        plan = ckpt.plans.TpPlan.from_hf_entry("toy", json.dumps(entry), "", "a test")
        outs = plan.resolve([{"name": "x.y.x.y", "dtype": "F32", "shape": [2]}], 0, 1)
        self.assertEqual([o.name for o in outs], ["z.x.y"])

    def test_a_group_rename_takes_one_branch_and_only_where_its_first_source_is(self):
        # transformers' GroupWeightRename (kimi_k25): fc0 -> fc1 and fc1 -> fc2 in one pass, not
        # chained; a checkpoint without fc0 is already in the new names and stays as it is.
        entry = {"tp_plan": {}, "conversions": [{"kind": "GroupWeightRename",
                                                 "source_patterns": ["blocks.(\\d+).fc0", "blocks.(\\d+).fc1"],
                                                 "target_patterns": ["blocks.\\1.fc1", "blocks.\\1.fc2"]}]}
        plan = ckpt.plans.TpPlan.from_hf_entry("toy", json.dumps(entry), "", "a test")
        old = plan.resolve([{"name": n, "dtype": "F32", "shape": [2]} for n in ("blocks.0.fc0", "blocks.0.fc1")], 0, 1)
        self.assertEqual(sorted(o.name for o in old), ["blocks.0.fc1", "blocks.0.fc2"])
        new = plan.resolve([{"name": n, "dtype": "F32", "shape": [2]} for n in ("blocks.0.fc1", "blocks.0.fc2")], 0, 1)
        self.assertEqual(sorted(o.name for o in new), ["blocks.0.fc1", "blocks.0.fc2"])

    def test_bad_renames_in_a_plan_file_are_errors(self):
        base = {"convention": "hf", "rules": [{"pattern": "^w$", "rule": "column"}]}
        for renames, why in (([{"search": "(", "to": "x"}], r"rename #0"),
                             ([{"search": "a", "to": "${2}"}], r"group 2"),
                             ([{"search": "a", "to": "b", "scope": 3}], r"a rename is"),
                             ([{"search": "a", "to": "b", "base_prefix": "model"}], r"a rename is"),
                             ([{"search": "a", "to": "b", "extra": 1}], r"a rename is"),
                             ([{"search": ["a", "b"], "to": ["c"]}], r"a rename is"),
                             ([{"search": ["a"], "to": "c"}], r"a rename is"),
                             ([{"search": [], "to": []}], r"a rename is"),
                             ([{"search": ["a", 3], "to": ["c", "d"]}], r"a rename is"),
                             ([{"search": ["a"], "to": [None]}], r"a rename is"),
                             ([{"search": 3, "to": "b"}], r"a rename is"),
                             ([{"search": "a", "to": "b", "if_any": "("}], r"if_any")):
            with self.subTest(renames=renames):
                with self.assertRaisesRegex(ckpt.InvalidArgument, why):
                    ckpt.plans.TpPlan.from_json(json.dumps(dict(base, renames=renames)))

    def test_bad_inputs_name_the_model_type_and_the_rule(self):
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"not a built-in family nor a model type of transformers"):
            ckpt.plans.for_config({"model_type": "no_such_model"}, "hf")
        entry = json.loads(ckpt.plans.TpPlan.hf_entry("llama"))
        entry["tp_plan"]["model.layers.*.self_attn.q_proj"] = "colwise_fancy"
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"llama.*unknown sharding rule 'colwise_fancy'"):
            ckpt.plans.TpPlan.from_hf_entry("llama", json.dumps(entry), "", "a test")
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"apertus.*transformers' tensor-parallel plan only.*hf"):
            ckpt.plans.builtin("apertus", "megatron")
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"megatron"):
            ckpt.plans.builtin("llama", "hf", fuse_qkv=True)

    def test_an_unsupported_conversion_refuses_naming_the_model_type(self):
        entry = {"tp_plan": {"model.layers.*.mlp.w": "colwise"},
                 "conversions": [{"kind": "WeightConverter", "source_patterns": ["mlp.w_in"],
                                  "target_patterns": ["mlp.w"], "operations": [{"op": "Chunk", "dim": 0}]}]}
        plan = ckpt.plans.TpPlan.from_hf_entry("toy", json.dumps(entry), "", "a test")
        tensors = [{"name": "model.layers.0.mlp.w_in", "dtype": "F32", "shape": [8, 4]}]
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"model.layers.0.mlp.w_in.*model type 'toy'.*Chunk"):
            plan.resolve(tensors, 0, 2)

    def test_chunk_and_concatenate_conversions(self):
        # Chunk(dim 0): the parts named as transformers names them (the source's text replaced
        # by each target), each split by its own style; Concatenate(dim 0): one fused output in
        # the sources' order, whole where the plan gives the target no style.
        entry = {"tp_plan": {"model.layers.*.mlp.gate_proj": "colwise", "model.layers.*.mlp.up_proj": "colwise"},
                 "conversions": [
                     {"kind": "WeightConverter", "source_patterns": ["mlp.gate_up_proj.weight"],
                      "target_patterns": ["mlp.gate_proj.weight", "mlp.up_proj.weight"],
                      "operations": [{"op": "Chunk", "dim": 0}]},
                     {"kind": "WeightConverter", "source_patterns": ["attn.q_conv.weight", "attn\\.k_conv.weight"],
                      "target_patterns": ["attn.conv.weight"], "operations": [{"op": "Concatenate", "dim": 0}]}]}
        plan = ckpt.plans.TpPlan.from_hf_entry("toy", json.dumps(entry), "", "a test")
        tensors = [{"name": n, "dtype": "F32", "shape": s} for n, s in (
            ("model.layers.0.mlp.gate_up_proj.weight", [8, 4]), ("model.layers.0.attn.k_conv.weight", [6, 1, 2]),
            ("model.layers.0.attn.q_conv.weight", [6, 1, 2]))]
        outs = {o.name: o for o in plan.resolve(tensors, 1, 2)}
        self.assertEqual(sorted(outs), ["model.layers.0.attn.conv.weight", "model.layers.0.mlp.gate_proj.weight",
                                        "model.layers.0.mlp.up_proj.weight"])
        for name, begin in (("gate_proj", 0), ("up_proj", 4)):
            p = outs[f"model.layers.0.mlp.{name}.weight"].pieces
            self.assertEqual([(x["source"], x["row_begin"], x["row_count"], x["kind"], x["dim"], x["rank"]) for x in p],
                             [("model.layers.0.mlp.gate_up_proj.weight", begin, 4, "split", -2, 1)])
        conv = outs["model.layers.0.attn.conv.weight"].pieces
        self.assertEqual([(x["source"], x["kind"]) for x in conv], [("model.layers.0.attn.q_conv.weight", "replicate"),
                                                                    ("model.layers.0.attn.k_conv.weight", "replicate")])
        # a missing source of the concatenation: named, not a short tensor
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"attn.conv.weight' fuses 1 tensors.*needs 2"):
            plan.resolve(tensors[:2], 0, 2)
        # a part that does not divide: named with the rule
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"gate_up_proj.weight.*does not cut into 2 equal parts"):
            plan.resolve([dict(tensors[0], shape=[7, 4])], 0, 2)
        # a target the plan splits colwise: each source split along its rows, the rank's part of
        # each in the sources' order (transformers' shard of each source, and what the module's
        # forward splits its fused output into)
        # (2-d sources: colwise splits dim -2, as transformers' Shard(ndim - 2))
        entry["tp_plan"]["model.layers.*.attn.conv"] = "colwise"
        split = ckpt.plans.TpPlan.from_hf_entry("toy", json.dumps(entry), "", "a test")
        flat = [dict(t, shape=[6, 2]) if "conv" in t["name"] else t for t in tensors]
        for rank in (0, 1):
            conv = {o.name: o for o in split.resolve(flat, rank, 2)}["model.layers.0.attn.conv.weight"]
            self.assertEqual([(x["source"].split(".")[-2], x["kind"], x["dim"] % 2, x["rank"], x["world"])
                              for x in conv.pieces], [("q_conv", "split", 0, rank, 2), ("k_conv", "split", 0, rank, 2)])
        # grouped_gemm (whole experts) of a dim-0 concatenation: refused, naming the style
        entry["tp_plan"]["model.layers.*.attn.conv"] = "grouped_gemm"
        experts = ckpt.plans.TpPlan.from_hf_entry("toy", json.dumps(entry), "", "a test")
        with self.assertRaisesRegex(ckpt.InvalidArgument,
                                    r"attn.k_conv.weight.*model type 'toy'.*concatenates 2 tensors into "
                                    r"'model.layers.\*.attn.conv' and splits the result grouped_gemm"):
            experts.resolve(flat, 0, 2)

    def test_stacked_experts_concatenated_along_dim_1(self):
        """step3p7's Concatenate(dim 1) of its stacked moe.gate_proj / moe.up_proj [E, I, H] into
        mlp.experts.gate_up_proj [E, 2I, H], packed_colwise: on each rank, per expert, its
        chunk of gate's rows then of up's (layer 1 of the example, as transformers' save_pretrained
        wrote it)."""
        ex = self.examples["step3p7"]
        E, I, H = 4, 32, 64
        tensors = [{"name": n, "dtype": dt, "shape": s} for n, dt, s in ex["tensors"]]
        self.assertIn({"name": "model.layers.1.moe.gate_proj.weight", "dtype": "F32", "shape": [E, I, H]}, tensors)
        plan = ckpt.plans.for_config(ex["config"], "hf")
        for world in (1, 2, 4):
            for rank in range(world):
                outs = {o.name: o for o in plan.resolve(tensors, rank, world)}
                gu = outs["model.language_model.layers.1.mlp.experts.gate_up_proj"]
                self.assertEqual(list(gu.view), [E, 2 * I // world, H])
                self.assertEqual([(p["source"].split(".")[-2], p["row_begin"], p["row_count"]) for p in gu.pieces],
                                 [(s, e, 1) for e in range(E) for s in ("gate_proj", "up_proj")])
                down = outs["model.language_model.layers.1.mlp.experts.down_proj"].pieces
                if world > 1:  # gate and up each split along their rows (dim 1), down along dim 2
                    self.assertEqual({(p["kind"], p["dim"] % 3, p["rank"], p["world"]) for p in gu.pieces},
                                     {("split", 1, rank, world)})
                    self.assertEqual([(p["kind"], p["dim"] % 3) for p in down], [("split", 2)])
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"gate_up_proj' fuses 1 tensors"):
            plan.resolve([t for t in tensors if "up_proj.weight" not in t["name"] or "gate" in t["name"]], 0, 2)

    def test_experts_stored_transposed_are_transposed_as_transformers_check_dims_does(self):
        """qwen3_vl_moe's Transpose(1, 2, check_dims): experts saved in the model's layout
        ([E, 2I, H], [E, H, I]: the example) are taken as they are; those of its hub
        checkpoints ([E, H, 2I], [E, I, H]) are transposed into it; any other shape is named."""
        ex = self.examples["qwen3_vl_moe"]
        E, I, H = 4, 16, 64
        for layout, transposed in (("model", False), ("hub", True)):
            gu, down = ([E, 2 * I, H], [E, H, I]) if layout == "model" else ([E, H, 2 * I], [E, I, H])
            tensors = [{"name": n, "dtype": dt, "shape": s} for n, dt, s in ex["tensors"] if "mlp.experts" not in n] + [
                {"name": "model.language_model.layers.0.mlp.experts.gate_up_proj", "dtype": "F32", "shape": gu},
                {"name": "model.language_model.layers.0.mlp.experts.down_proj", "dtype": "F32", "shape": down}]
            plan = ckpt.plans.for_config(ex["config"], "hf")
            for world in (1, 2, 4):
                with self.subTest(layout=layout, world=world):
                    outs = {o.name: o for o in plan.resolve(tensors, world - 1, world)}
                    for name in ("gate_up_proj", "down_proj"):
                        o = outs["model.language_model.layers.0.mlp.experts." + name]
                        self.assertEqual(o.transpose, transposed, name)
                        self.assertEqual([p["kind"] for p in o.pieces], ["replicate"])
            with self.assertRaisesRegex(ckpt.InvalidArgument, r"experts.gate_up_proj'.*neither as it is nor transposed"):
                bad = [dict(t, shape=[E, 2 * I, 2 * I]) if t["name"].endswith("gate_up_proj") else t for t in tensors]
                plan.resolve(bad, 0, 1)

    def test_renames_apply_before_the_plan(self):
        entry = {"tp_plan": {"lm_head": "colwise_gather_output"},
                 "conversions": [{"kind": "WeightRenaming", "source_patterns": ["^embed_out\\."],
                                  "target_patterns": ["lm_head."]}]}
        plan = ckpt.plans.TpPlan.from_hf_entry("toy", json.dumps(entry), "", "a test")
        outs = plan.resolve([{"name": "embed_out.weight", "dtype": "F32", "shape": [8, 4]}], 1, 2)
        self.assertEqual([o.name for o in outs], ["lm_head.weight"])
        self.assertEqual((outs[0].pieces[0]["kind"], outs[0].pieces[0]["dim"] % 2), ("split", 0))

    def test_kept_names_are_not_renamed(self):
        """transformers' loader keeps a key that is the model's own where its renames would make
        it one the model lacks (deepseek_v4: "\\.norm\\." -> ".kv_norm." would rename the final
        norm too): the data's kept_names, layer numbers as '*', are left as they are."""
        entry = {"tp_plan": {"model.layers.*.attn.q": "colwise"},
                 "conversions": [{"kind": "WeightRenaming", "source_patterns": ["\\.norm\\."],
                                  "target_patterns": [".kv_norm."]}],
                 "kept_names": ["model.norm.weight", "model.layers.*.ln.norm.bias"]}
        plan = ckpt.plans.TpPlan.from_hf_entry("toy", json.dumps(entry), "", "a test")
        names = ["model.norm.weight", "model.layers.0.attn.norm.weight", "model.layers.3.ln.norm.bias",
                 "model.layers.3.ln.norm.weight", "x.model.norm.weight", "model.layers.0.attn.q.weight"]
        outs = plan.resolve([{"name": n, "dtype": "F32", "shape": [4]} for n in names], 0, 1)
        self.assertEqual(sorted(o.name for o in outs),
                         sorted(["model.norm.weight", "model.layers.0.attn.kv_norm.weight", "model.layers.0.attn.q.weight",
                                 "model.layers.3.ln.norm.bias", "model.layers.3.ln.kv_norm.weight",
                                 "x.model.kv_norm.weight"]))
        self.assertIn('"not_renamed"', plan.json)
        for bad in ("model.norm.weight", [3]):  # an entry's kept_names: a list of names
            with self.subTest(kept_names=bad), self.assertRaisesRegex(ckpt.InvalidArgument, r"toy.*kept_names"):
                ckpt.plans.TpPlan.from_hf_entry("toy", json.dumps(dict(entry, kept_names=bad)), "", "a test")
        # a plan file's not_renamed must be a list of patterns
        for bad in ('"model.norm.weight"', '[1]', '["("]'):
            with self.subTest(not_renamed=bad), self.assertRaisesRegex(ckpt.InvalidArgument, r"not_renamed"):
                ckpt.plans.TpPlan.from_json('{"not_renamed": %s}' % bad)

    def test_a_transpose_ckptd_cannot_decide_is_refused_where_the_tensor_is(self):
        """Transpose with check_dims needs the config's hidden_size, and keeps the tensor's
        own name: otherwise a matching tensor (anywhere in a name) is refused, naming why."""
        def entry(target):
            return {"tp_plan": {"model.layers.*.mlp.experts.down_proj": "rowwise"},
                    "conversions": [{"kind": "WeightConverter", "source_patterns": ["mlp.experts.down_proj"],
                                     "target_patterns": [target],
                                     "operations": [{"op": "Transpose", "dim0": 1, "dim1": 2, "check_dims": True}]}]}
        tensors = [{"name": "model.layers.0.mlp.experts.down_proj", "dtype": "F32", "shape": [2, 8, 4]}]
        for target, config, why in (("mlp.experts.down_proj", "", r"needs the hidden_size"),
                                    ("mlp.experts.down_w", '{"hidden_size": 4}', r"under another name")):
            plan = ckpt.plans.TpPlan.from_hf_entry("toy", json.dumps(entry(target)), config, "a test")
            with self.subTest(why=why), self.assertRaisesRegex(
                    ckpt.InvalidArgument, r"experts.down_proj'.*model type 'toy'.*transposes this tensor.*" + why):
                plan.resolve(tensors, 0, 2)
        ok = ckpt.plans.TpPlan.from_hf_entry("toy", json.dumps(entry("mlp.experts.down_proj")), '{"hidden_size": 4}',
                                             "a test")
        self.assertTrue(ok.resolve(tensors, 0, 1)[0].transpose)  # [E, 8, 4]: dim 1 is not the hidden size

    def test_interleaved_rows_and_what_they_refuse(self):
        """transformers' Interleave(dim) (inkling): the rows of each matrix taken apart, row 2j to
        j and 2j + 1 to half + j, as stepped pieces (a stacked tensor's flat rows); a split of
        the rows takes whole pairs; what ckptd cannot do is named."""
        entry = {"tp_plan": {"model.layers.*.mlp.experts.gate_up_proj": "colwise",
                             "model.layers.*.mlp.gate_proj": "colwise", "model.layers.*.mlp.up_proj": "colwise"},
                 "conversions": [
                     {"kind": "WeightConverter", "source_patterns": ["mlp.experts.w13"],
                      "target_patterns": ["mlp.experts.gate_up_proj"], "operations": [{"op": "Interleave", "dim": 1}]},
                     {"kind": "WeightConverter", "source_patterns": ["mlp.w13.weight"],
                      "target_patterns": ["mlp.gate_proj.weight", "mlp.up_proj.weight"],
                      "operations": [{"op": "Interleave", "dim": 0}, {"op": "Chunk", "dim": 0}]}]}
        plan = ckpt.plans.TpPlan.from_hf_entry("toy", json.dumps(entry), "", "a test")
        tensors = [{"name": "model.layers.0.mlp.experts.w13", "dtype": "F32", "shape": [3, 8, 4]},
                   {"name": "model.layers.0.mlp.w13.weight", "dtype": "F32", "shape": [8, 4]}]
        outs = {o.name: o for o in plan.resolve(tensors, 1, 2)}
        gu = outs["model.layers.0.mlp.experts.gate_up_proj"]
        self.assertEqual(list(gu.view), [3, 4, 4])  # rank 1: pairs 2, 3 of each expert
        self.assertEqual([(p["row_begin"], p["row_count"], p["row_step"], p["flat_rows"]) for p in gu.pieces],
                         [(8 * e + 4 + s, 2, 2, True) for e in range(3) for s in (0, 1)])
        for name, s in (("gate_proj", 0), ("up_proj", 1)):  # part s: rows s, s + 2, ...; rank 1 its half
            p = outs[f"model.layers.0.mlp.{name}.weight"].pieces
            self.assertEqual([(x["row_begin"], x["row_count"], x["row_step"], x["flat_rows"]) for x in p],
                             [(4 + s, 2, 2, False)])
        bad = [
            # a rank's rows that cut a pair: 10 rows over 4 ranks (torch.chunk: 3 each)
            ([dict(tensors[0], shape=[3, 10, 4])], 4, r"experts.w13'.*rows \[3, 6\) of 10.*cut a pair"),
            ([dict(tensors[0], shape=[3, 7, 4])], 1, r"experts.w13'.*7 rows are not pairs"),
            ([dict(tensors[0], shape=[8, 4])], 1, r"experts.w13'.*interleaves dim 1 of this 2-d tensor"),
        ]
        for ts, world, why in bad:
            with self.subTest(why=why), self.assertRaisesRegex(ckpt.InvalidArgument, why):
                plan.resolve(ts, 0 if world == 1 else 1, world)
        # an FP8 weight's block scale beside interleaved rows
        fp8 = [{"name": "model.layers.0.mlp.experts.w13", "dtype": "F8_E4M3", "shape": [3, 256, 128]},
               {"name": "model.layers.0.mlp.experts.w13_scale_inv", "dtype": "F32", "shape": [3, 2, 1]}]
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"experts.w13' has its rows interleaved"):
            plan.resolve(fp8, 0, 2)
        # a packed split of interleaved rows, and plan-file misuse
        entry["tp_plan"]["model.layers.*.mlp.experts.gate_up_proj"] = "packed_colwise"
        packed = ckpt.plans.TpPlan.from_hf_entry("toy", json.dumps(entry), "", "a test")
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"experts.w13'.*splits interleaved rows in 2 blocks"):
            packed.resolve(tensors[:1], 0, 2)
        for rule in ({"pattern": "a", "rule": "colwise", "interleave": 1},
                     {"pattern": "(a)", "rule": "colwise", "interleave": {"dim": 0}, "fuse_into": "b", "stack": 1},
                     {"pattern": "(a)", "chunk_into": ["$1x", "$1y", "$1z"], "interleave": {"dim": 0}}):
            with self.subTest(rule=rule), self.assertRaisesRegex(ckpt.InvalidArgument, r"interleave"):
                ckpt.plans.TpPlan.from_json(json.dumps({"rules": [rule]}))

    def test_tie_rule_adds_or_drops_the_embedding_split(self):
        tensors = [{"name": "model.embed_tokens.weight", "dtype": "F32", "shape": [16, 4]},
                   {"name": "model.layers.0.self_attn.q_proj.weight", "dtype": "F32", "shape": [8, 4]}]
        for mt, tie, split in (("llama", True, True), ("llama", False, False), ("gemma", False, False),
                               ("gemma", True, True)):
            with self.subTest(model_type=mt, tie=tie):
                plan = ckpt.plans.for_config({"model_type": mt, "tie_word_embeddings": tie}, "hf")
                emb = [o for o in plan.resolve(tensors, 0, 2) if o.name == "model.embed_tokens.weight"][0]
                self.assertEqual(emb.pieces[0]["kind"] == "split", split)


if __name__ == "__main__":
    unittest.main()
