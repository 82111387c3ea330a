#!/usr/bin/env python3
"""Writes transformers' tensor-parallel plans, for every model type that has one, as data.

For each model type of the installed transformers (its CONFIG_MAPPING), a tiny model of the
class its Auto mappings give (causal LM, else image-text-to-text, ...; tools/gpu/hf_tiny.py) is
built, and what transformers itself says about sharding it is recorded:
  - the model's full plan (`model.tp_plan`: base_model_tp_plan under base_model_prefix, the
    head classes' `_tp_plan`, sub-models' plans under their attribute names), once with
    untied and once with tied word embeddings (transformers adds an embedding rule when tied);
  - `base_model_prefix`, the text sub-config's key for composite models (VLMs);
  - the checkpoint conversions transformers applies at load (renames, fused MoE experts:
    `get_model_conversion_mapping`), as source/target patterns and operations.
Writes --out (src/plan/hf_tp_plans.json, embedded in the library by CMake) and --examples
(each family's tiny checkpoint, as save_pretrained writes it: config and tensor names,
dtypes, shapes; for tests/python/test_hf_plans.py). Needs transformers: run on the GPU
machine (tools/gpu/run_checks.sh's python3).

  python3 tools/gpu/gen_hf_plans.py --out src/plan/hf_tp_plans.json \\
      --examples tests/python/data/hf_family_examples.json [--types llama,qwen2] [--update]

--update keeps the other model types of the existing --out and --examples (written by the
same transformers version) and replaces only those of --types: their rows of
`carried_from_earlier_run` (types a cut run did not reach, kept from an earlier one) go, unless
this run could not describe a type the file has (its entry then stays, carried).
"""
import argparse
import datetime
import json
import os
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import forked  # noqa: E402
import hf_tiny  # noqa: E402

FORMAT = 1


def _load_hf_plans():
    """python/ckpt/hf_plans.py by path: it needs neither ckpt's extension nor a build."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "ckpt", "hf_plans.py")
    spec = importlib.util.spec_from_file_location("ckpt_hf_plans", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hf_plans = _load_hf_plans()


def first_line(e):
    return hf_tiny.first_lines(e, 300)


def safetensors_header(folder):
    tensors = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(folder, name), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for key, meta in header.items():
            if key != "__metadata__":
                tensors.append([key, meta["dtype"], meta["shape"]])
    return sorted(tensors)


def example_of(model_cls, config):
    """The tiny model's checkpoint as save_pretrained writes it (config, tensors) and the
    model's own parameter names and shapes (what transformers loads it into), its tied names
    (groups of one tensor), and transformers' own rename of each checkpoint key
    (hf_plans.loader_renames)."""
    import torch
    torch.manual_seed(0)
    real = hf_tiny.tiny_model(model_cls, config)
    model_tensors = sorted([n, list(t.shape)] for n, t in real.state_dict().items())
    shared = {}  # tied parameters: one tensor under several names, which the checkpoint holds once
    for n, t in real.state_dict().items():
        if t.numel() > 0:  # empty tensors share no storage, whatever their data_ptr
            shared.setdefault((t.data_ptr(), tuple(t.shape), t.dtype), []).append(n)
    tied = sorted(sorted(names) for names in shared.values() if len(names) > 1)
    with tempfile.TemporaryDirectory() as folder:
        real.save_pretrained(folder)
        with open(os.path.join(folder, "config.json")) as f:
            saved_config = json.load(f)
        tensors = safetensors_header(folder)
    example = {"config": saved_config, "tensors": tensors, "model_tensors": model_tensors}
    if tied:
        example["tied"] = tied
    try:
        example["renamed"] = hf_plans.loader_renames(real, [t[0] for t in tensors])
    except Exception as e:
        example["renamed_error"] = first_line(e)
    return example


def describe(model_type):
    """(entry for the plan file, example for the tests)."""
    import transformers
    task, model_cls = hf_plans.model_class(model_type)
    entry = {"config_class": transformers.CONFIG_MAPPING[model_type].__name__}
    if model_cls is None:
        entry["error"] = "no Auto model class"
        return entry, None
    default = transformers.AutoConfig.for_model(model_type)
    text_key = hf_plans._text_config_key(default)
    try:
        config = hf_tiny.tiny_config(model_type)
        untied = hf_tiny.tiny_config(model_type, text_key, tie_word_embeddings=False)
        tied = hf_tiny.tiny_config(model_type, text_key, tie_word_embeddings=True)
        tiny = True
    except Exception as e:  # the class's defaults, on the meta device only (no example)
        entry["tiny_error"] = first_line(e)
        config = untied = default
        tied, tiny = None, False
    try:
        entry.update(hf_plans.entry_of_model(model_cls, untied, task, tied_config=tied))
        text = default.get_text_config() if hasattr(default, "get_text_config") else default
        entry["tie_default"] = bool(getattr(text, "tie_word_embeddings", False))  # what a config without it means
        if not tiny:  # the plan of the class's defaults: tied or not as they are
            entry["tp_plan_is_for_tie"] = entry["tie_default"]
    except Exception as e:
        entry["error"] = f"building the model: {first_line(e)}"
        return entry, None
    if not entry["tp_plan"] or not tiny:
        return entry, None
    try:
        return entry, example_of(model_cls, config)
    except Exception as e:
        entry["save_error"] = first_line(e)
        return entry, None


def has_plan_class(config_cls, model_cls):
    """False only where transformers surely declares no plan for this model type: neither its
    config class nor its model class has one, and it has no sub-configs (whose class, often
    AutoConfig, is known only once built). Building nothing."""
    if getattr(config_cls, "base_model_tp_plan", None) or getattr(model_cls, "_tp_plan", None):
        return True
    return bool(getattr(config_cls, "sub_configs", None))


def earlier(args, transformers_version):
    """(families, examples, skipped, carried) of the existing --out and --examples for --update;
    refused when another transformers version wrote them (one file, one version)."""
    with open(args.out) as f:
        doc = json.load(f)
    if doc.get("transformers") != transformers_version:
        sys.exit(f"--update: {args.out} is of transformers {doc.get('transformers')}, this is {transformers_version}")
    examples = {}
    if args.examples and os.path.exists(args.examples):
        with open(args.examples) as f:
            examples = json.load(f).get("families", {})
    return doc["families"], examples, doc.get("without_plan", {}), doc.get("carried_from_earlier_run", [])


def write(args, families, examples, skipped, versions, carried=()):
    """Writes --out and --examples (again after every few model types: a cut run keeps them)."""
    transformers_version, torch_version = versions
    doc = {"format": FORMAT, "transformers": transformers_version, "torch": torch_version,
           "generated": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}",
           "generated_by": "tools/gpu/gen_hf_plans.py", "families": dict(sorted(families.items())),
           "without_plan": dict(sorted(skipped.items()))}
    if carried:
        doc["carried_from_earlier_run"] = sorted(carried)
    with open(args.out + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(args.out + ".tmp", args.out)
    if args.examples:
        with open(args.examples + ".tmp", "w") as f:
            json.dump({"transformers": transformers_version, "families": examples}, f, separators=(",", ":"),
                      sort_keys=True)
            f.write("\n")
        os.replace(args.examples + ".tmp", args.examples)


def one(mt):
    """(model type, entry, example) in a worker process; never raises."""
    import transformers
    _, model_cls = hf_plans.model_class(mt)
    if not has_plan_class(transformers.CONFIG_MAPPING[mt], model_cls):
        return mt, {"error": "no tensor-parallel plan"}, None
    try:
        entry, example = describe(mt)
    except Exception as e:
        entry, example = {"error": first_line(e)}, None
    return mt, entry, example


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--examples")
    ap.add_argument("--types", default="", help="comma-separated model types (default: all)")
    ap.add_argument("--update", action="store_true", help="replace only --types in the existing files")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--deadline", type=float, default=0, help="seconds: write what is done by then and stop")
    ap.add_argument("--type-timeout", type=float, default=120, help="seconds one model type may take")
    args = ap.parse_args()
    import torch
    import transformers
    t0 = time.time()
    versions = (transformers.__version__, torch.__version__.split("+")[0])
    types = [t for t in args.types.split(",") if t] or sorted(transformers.CONFIG_MAPPING.keys())
    families, examples, skipped, carried = {}, {}, {}, []
    if args.update:
        families, examples, skipped, carried = earlier(args, versions[0])
    deadline = t0 + args.deadline if args.deadline else float("inf")
    def failed(mt, why):
        return mt, {"error": f"not described: {why}"}, None
    runs = forked.forked(types, one, args.jobs, deadline, args.type_timeout, failed)
    for done, (_, (mt, entry, example)) in enumerate(runs):
        if args.update and mt in families and not entry.get("tp_plan"):
            # described before, not now (its tiny model no longer builds): the earlier entry stays
            print(f"{mt}: kept from the earlier run ({entry.get('error')})", flush=True)
            carried = sorted(set(carried) | {mt})
            continue
        for table in (families, examples, skipped):
            table.pop(mt, None)
        carried = [t for t in carried if t != mt]
        if entry.get("tp_plan"):
            families[mt] = entry
            if example:
                examples[mt] = example
        else:
            skipped[mt] = entry.get("error") or "no tensor-parallel plan"
        problems = "; ".join(f"{k}: {entry[k]}" for k in ("error", "tiny_error", "save_error",
                                                          "conversions_error") if entry.get(k))
        print(f"{mt}: {'plan' if entry.get('tp_plan') else 'skip'} {entry.get('model_class', '')} "
              f"{len(entry.get('tp_plan') or {})} rules" + (f" ({problems})" if problems else ""), flush=True)
        if done % 25 == 24:  # a cut run keeps what it has
            write(args, families, examples, skipped, versions, carried)
    write(args, families, examples, skipped, versions, carried)
    print(f"{len(families)} model types with a plan, {len(examples)} examples, {len(skipped)} without; "
          f"transformers {transformers.__version__}; {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
