"""One rank of test_deepspeed's ZeRO-3 / MiCS checks, run with DeepSpeed's CPU accelerator
and gloo (DS_ACCELERATOR=cpu, RANK/WORLD_SIZE/MASTER_* from the test).

    deepspeed_worker.py SOCKET WORKDIR MODE [MICS_SHARD_SIZE]

MODE "zero3", "mics", "autotp" (AutoTP inference), "hfload" (transformers' ZeRO-3 loader
against ckptd's fill) or "memory" (what building under ckpt.deepspeed.zero3_init costs):
each mode's function says what it checks. Rank 0 builds the model under zero.Init / MiCS_Init (DeepSpeed
initialises and partitions it), gathers every parameter with writes the same model built
without zero.Init from the same seed (the full tensors DeepSpeed partitioned) as a
safetensors file that the daemon loads: the checkpoint. Every rank keeps DeepSpeed's own
partition of each parameter (its ds_tensor, cut by DeepSpeed from the full tensor), builds a second model of another seed under the same Init, fills it with
ckpt.deepspeed.fill_zero3 and checks: each ds_tensor equals DeepSpeed's own partition of
the same tensor (the valid elements; the tail past numel is padding, which DeepSpeed leaves
uninitialised), and the filled partitions, all-gathered, give back the checkpoint.
Then the bad inputs: a claimed layout that is not DeepSpeed's, a parameter the checkpoint
lacks, and a DeepSpeed version ckpt.deepspeed does not know. Prints "RANK r OK" at the end."""
import gc
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import deepspeed
import ckpt
import ckpt.deepspeed as ckds

sys.path.insert(0, os.environ["CKPT_TOOLS_DIR"])
import make_checkpoint  # noqa: E402

socket, workdir, mode = sys.argv[1], sys.argv[2], sys.argv[3]
shard = int(sys.argv[4]) if len(sys.argv) > 4 else None
H, V, F = 24, 40, 56  # odd sizes for world 3 and 4: the last partition is padded


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(H, H)
        self.o = nn.Linear(H, H, bias=False)
        self.up = nn.Linear(H, F)
        self.down = nn.Linear(F, H)
        self.norm = nn.LayerNorm(H)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, H)
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.lm_head = nn.Linear(H, V, bias=False)
        self.lm_head.weight = self.embed.weight  # tied: one parameter


def ds_config():
    zero = {"stage": 3}
    if mode == "mics":
        zero["mics_shard_size"] = shard
    return {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}


def build(seed):
    torch.manual_seed(seed)
    init = deepspeed.zero.MiCS_Init if mode == "mics" else deepspeed.zero.Init
    with init(config_dict_or_path=ds_config()):
        return Tiny()


def build_for_fill():
    """The model fill_zero3 fills: built under ckpt.deepspeed.zero3_init (no broadcast)."""
    with ckds.zero3_init(ds_config(), mics=mode == "mics"):
        return Tiny()


def publish(client, name, tensors):
    """Rank 0 writes `tensors` as a safetensors file and has the daemon load it as `name`;
    every rank waits for it, then attaches."""
    if dist.get_rank() == 0:
        path = os.path.join(workdir, f"{name}.safetensors")
        make_checkpoint.write_safetensors(path, tensors)
        client.load(path, name=name)
    dist.barrier()
    return client.attach(name)


def expect(error, words, fn):
    try:
        fn()
    except error as e:
        for w in words:
            assert w in str(e), f"{w!r} not in {e!r}"
        return str(e)
    raise AssertionError(f"no {error.__name__} for {words}")


class TpBlock(nn.Module):
    """A layer AutoTP cuts: q/k/v/up column-parallel, o/down row-parallel (the injection
    policy names them), a fused qkv_proj (DeepSpeed's fused-QKV path), a norm kept whole.
    Widths not divisible into DeepSpeed's 64-element grains evenly at worlds 3 and 4."""
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(TP_H)
        self.q = nn.Linear(TP_H, TP_H)
        self.k = nn.Linear(TP_H, TP_H)
        self.v = nn.Linear(TP_H, TP_H)
        self.qkv_proj = nn.Linear(TP_H, 3 * TP_H)
        self.o = nn.Linear(TP_H, TP_H)
        self.up = nn.Linear(TP_H, TP_F)
        self.down = nn.Linear(TP_F, TP_H)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, TP_H), persistent=False)

    def forward(self, x):
        x = x + self.o(torch.relu(self.q(self.norm(x) * self.scale)))
        return x + self.down(torch.relu(self.up(self.norm(x))))


class TpModel(nn.Module):
    def __init__(self, tied=True):
        super().__init__()
        self.wte = nn.Embedding(V, TP_H)
        self.layers = nn.ModuleList([TpBlock() for _ in range(2)])
        self.lm_head = nn.Linear(TP_H, V, bias=False)
        if tied:
            self.lm_head.weight = self.wte.weight

    @property
    def device(self):  # what deepspeed.init_inference asks of a (transformers) model
        return next(self.parameters()).device

    def forward(self, ids):
        x = self.wte(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(x)


TP_H, TP_F = 320, 448  # 5 and 7 grains of 64: uneven at worlds 2, 3 and 4


def _transformers_names_for_autotp():
    """DeepSpeed 0.14.5's AutoTP imports transformers only to ask whether the layer class
    is GPT-2's (GPT2Block, whose Conv1D layers it cuts differently). Where transformers is
    not installed (Debian has no package), a module holding those two names, classes that
    no model here is, stands in for it; with transformers installed the real one is used."""
    import importlib.util
    import types
    if "transformers" in sys.modules or importlib.util.find_spec("transformers") is not None:
        return  # the real one, or the stand-in put there before
    tf = types.ModuleType("transformers")
    tf.models = types.SimpleNamespace(gpt2=types.SimpleNamespace(modeling_gpt2=types.SimpleNamespace(
        GPT2Block=type("GPT2Block", (nn.Module,), {}))))
    tf.pytorch_utils = types.SimpleNamespace(Conv1D=type("Conv1D", (nn.Module,), {}))
    sys.modules["transformers"] = tf


def autotp(rank, world, client):
    """deepspeed.init_inference (AutoTP) of a real-weight model against the same model built
    on the meta device, cut by AutoTP, filled by ckpt.deepspeed.fill_autotp from ckptd: every
    tensor equal and the logits equal; tied, and at world 2 also untied (lm_head.weight a
    tensor of its own in the checkpoint)."""
    for tied in (True, False) if world == 2 else (True, ):
        _autotp(rank, world, client, tied)


def _autotp(rank, world, client, tied):
    from ckpt.meta import parameters_on_meta
    _transformers_names_for_autotp()
    policy = {TpBlock: (".o", ".down")}
    name = f"tp-{world}-{tied}"
    torch.manual_seed(3)
    real = TpModel(tied)
    full = {n: p.detach().clone() for n, p in real.state_dict().items() if n != "lm_head.weight" or not tied}
    publish(client, name, full)
    ids = torch.randint(0, V, (2, 7), generator=torch.Generator().manual_seed(4))
    ref = deepspeed.init_inference(real, tensor_parallel={"tp_size": world}, dtype=torch.float32,
                                   replace_with_kernel_inject=False, injection_policy=policy)
    want = {n: t for n, _, _, t in ckds._ds_tensors(ref.module)}
    with torch.no_grad():
        want_logits = ref.module(ids)
    with parameters_on_meta():
        meta = TpModel(tied)
    saved = dict(meta.named_buffers())
    engine = deepspeed.init_inference(meta, tensor_parallel={"tp_size": world}, dtype=torch.float32,
                                      replace_with_kernel_inject=False, injection_policy=policy)
    ck = client.attach(name)
    layout = ckds.fill_autotp(engine.module, ck, block_classes=[TpBlock], buffers=saved,
                              tied={"lm_head.weight": "wte.weight"} if tied else None)
    got = {n: t for n, _, _, t in ckds._ds_tensors(engine.module)}  # fused-QKV biases too
    # DeepSpeed 0.14.5 cuts the output layer only when it loads a checkpoint of its own
    # (set_lm_head): without one it stays whole on every rank, here as there
    assert type(engine.module.lm_head) is type(ref.module.lm_head), (type(engine.module.lm_head), type(ref.module.lm_head))
    cut = 0
    for n, p in got.items():
        assert not p.is_meta, n
        assert want[n].shape == p.shape, (n, tuple(want[n].shape), tuple(p.shape))
        assert torch.equal(want[n], p), f"{n}: ckptd's part differs from DeepSpeed's own cut: {want[n].flatten()[:4]} {p.flatten()[:4]}"
        cut += layout[n].dim is not None or layout[n].rows is not None
    for n, b in engine.module.named_buffers():
        assert torch.equal(b, dict(ref.module.named_buffers())[n]), n
    assert world == 1 or cut > 0, layout
    with torch.no_grad():
        logits = engine.module(ids)
    assert torch.equal(logits, want_logits), float((logits - want_logits).abs().max())
    if tied:  # bad input: a parameter the checkpoint does not hold, another world size, a version
        expect(ckpt.InvalidArgument, ["lm_head.weight", "parameters the checkpoint lacks"],
               lambda: ckds.fill_autotp(engine.module, ck, block_classes=[TpBlock]))
        expect(ckpt.InvalidArgument, [f"world size {world + 1}", f"the {world} ranks AutoTP cut the model for"],
               lambda: ckds.fill_autotp(engine.module, ck, rank=0, world=world + 1, block_classes=[TpBlock],
                                        tied={"lm_head.weight": "wte.weight"}))
        real_version = deepspeed.__version__
        deepspeed.__version__ = "0.16.2"
        try:
            expect(ckpt.Unsupported, ["DeepSpeed 0.16.2", "0.14.x"],
                   lambda: ckds.fill_autotp(engine.module, ck, block_classes=[TpBlock],
                                            tied={"lm_head.weight": "wte.weight"}))
            expect(ckpt.Unsupported, ["DeepSpeed 0.16.2"], lambda: ckds.gathers_waited().__enter__())
        finally:
            deepspeed.__version__ = real_version
    ck = None  # the attachment goes with its last view
    dist.barrier()
    print(f"RANK {rank} OK (autotp, world {world}, tied {tied}, {cut} cut parameters)", flush=True)


def _gloo_all_gather_into_tensor():
    """torch 1.13's gloo has no all_gather_into_tensor (_allgather_base), which
    GatheredParameters uses: there it is the list all_gather into views of the output, as
    asynchronous as the real one. torch 2 has it; nothing is replaced there."""
    if int(torch.__version__.split(".")[0]) >= 2:
        return
    real = dist.all_gather

    def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
        n = dist.get_world_size(group)
        return real(list(output_tensor.view(-1).chunk(n)), input_tensor.view(-1), group=group, async_op=async_op)

    dist.all_gather_into_tensor = all_gather_into_tensor


class _Recorded:
    """An async collective's handle that remembers whether anybody waited for it."""
    def __init__(self, handle):
        self.handle, self.waited = handle, False

    def wait(self, *args, **kwargs):
        self.waited = True
        return self.handle.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.handle, name)


def hfload(rank, world, client):
    """transformers' ZeRO-3 loader (_load_state_dict_into_zero3_model: module by module,
    GatheredParameters(its parameters, modifier_rank=0), rank 0 loads the full state dict
    into them, DeepSpeed broadcasts and re-partitions) under zero.Init, or MiCS_Init in
    groups of `shard`, inside ckpt.deepspeed.gathers_waited(): every all-gather DeepSpeed
    launched has been waited for when the loader's body runs (0.14.5 alone waits for the
    last: the earlier ones may still write into the parameters over gloo, docs/deepspeed.md),
    and the partitions it leaves equal, element for element, those ckpt.deepspeed.fill_zero3
    copies from ckptd, and the checkpoint's own."""
    from deepspeed.comm import comm as ds_comm
    name = f"hf-{world}-{shard}"
    torch.manual_seed(5)
    full = {n: p.detach().clone() for n, p in Tiny().named_parameters()}  # the tied lm_head not saved
    ck = publish(client, name, full)
    zero = {"stage": 3}
    if shard:
        zero["mics_shard_size"] = shard
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}
    init = deepspeed.zero.MiCS_Init if shard else deepspeed.zero.Init
    torch.manual_seed(6)
    with init(config_dict_or_path=cfg):
        loaded = Tiny()
    launched = []
    real_gather = ds_comm.cdb.all_gather_function

    def recording(*args, **kwargs):
        handle = real_gather(*args, **kwargs)
        if kwargs.get("async_op") and handle is not None:
            handle = _Recorded(handle)
            launched.append(handle)
        return handle

    ds_comm.cdb.all_gather_function = recording
    coalesced = 0

    def load(module, prefix=""):
        nonlocal coalesced
        params = dict(module.named_parameters(prefix=prefix[:-1], recurse=False))
        gather = [p for n, p in params.items() if n in full]
        if gather:
            del launched[:]
            errors = []
            with deepspeed.zero.GatheredParameters(gather, modifier_rank=0):
                unwaited = sum(not h.waited for h in launched)  # asserted outside: no rank may skip the exit's collectives
                gathers = len(launched)
                if rank == 0:
                    module._load_from_state_dict(full, prefix, {}, True, [], [], errors)
            assert not unwaited, f"{prefix}: {unwaited} of {gathers} all-gathers not waited for"
            assert not errors, errors
            coalesced += gathers > 1
        for child_name, child in module._modules.items():
            if child is not None:
                load(child, prefix + child_name + ".")

    try:
        with ckds.gathers_waited():
            load(loaded)
    finally:
        ds_comm.cdb.all_gather_function = real_gather
    assert coalesced > 0, "no module gathered several parameters at once: the check checked nothing"
    with ckds.zero3_init(cfg, mics=bool(shard)):
        filled = Tiny()
    ckds.fill_zero3(filled, ck, group_size=shard)
    parts = shard or world
    other = dict(filled.named_parameters())
    for n, p in loaded.named_parameters():
        per = p.ds_tensor.numel()
        start = per * (rank % parts)
        valid = max(0, min(per, p.ds_numel - start))
        truth = full[n].reshape(-1)[start:start + valid]
        assert torch.equal(p.ds_tensor[:valid], truth), f"{n}: transformers' loader left another partition"
        assert torch.equal(other[n].ds_tensor[:valid], p.ds_tensor[:valid]), f"{n}: ckptd's fill differs"
    ck = None
    dist.barrier()
    print(f"RANK {rank} OK (hfload, world {world}, shard {shard}, {coalesced} coalesced gathers)", flush=True)


MEM_V, MEM_H = 16384, 1024  # 64 MiB in float32, 32 MiB in bfloat16


class Big(nn.Module):
    """A parameter as a transformers module under no_init_weights has it: torch.empty, no
    initialisation writing it."""
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(MEM_V, MEM_H))


def memory(rank, world):
    """What building a module costs a rank: under ckpt.deepspeed.zero3_init at most its
    partition and a little (its full tensor is allocated, never written), where plain
    zero.Init's broadcast from rank 0 writes it whole on every other rank. Peak resident
    memory (VmHWM, reset through /proc/self/clear_refs) over the resident memory before."""
    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

    def growth(make):
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        before = status("VmRSS")
        module = make()
        grown = status("VmHWM") - before
        del module
        gc.collect()
        return grown

    def config(half):
        cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
        if half:
            cfg["bf16"] = {"enabled": True}
        return cfg

    def ours(half):
        with ckds.zero3_init(config(half)):
            return Big()

    def plain():
        with deepspeed.zero.Init(config_dict_or_path=config(False)):
            return Big()

    real_version = deepspeed.__version__
    deepspeed.__version__ = "0.16.2"
    try:
        expect(ckpt.Unsupported, ["DeepSpeed 0.16.2", "0.14.x"], lambda: ckds.zero3_init(config(False)).__enter__())
    finally:
        deepspeed.__version__ = real_version
    dist.barrier()
    full = MEM_V * MEM_H * 4
    grown = {"float32": growth(lambda: ours(False)), "bfloat16": growth(lambda: ours(True))}
    grown["plain zero.Init"] = growth(plain)
    dist.barrier()
    mib = {k: round(v / 2**20, 1) for k, v in grown.items()}
    part = full / world  # this rank's partition, in float32
    assert grown["float32"] < 1.25 * part, (mib, part / 2**20)
    assert grown["bfloat16"] < 1.25 * part / 2, (mib, part / 2**20)
    if rank > 0:  # what zero3_init leaves out: rank 0's broadcast writes the whole tensor here
        assert grown["plain zero.Init"] > 0.9 * full, (mib, full / 2**20)
    print(f"RANK {rank} OK (memory, world {world}, growth MiB {mib}, full {full / 2**20:.0f} MiB)", flush=True)


def main():
    # DS_BUILD_OPS=0 and no compiler use: DeepSpeed's CPU backend would JIT-build its
    # shared-memory all-reduce op (C++) in init_distributed; marked incompatible, it is not
    # built and gloo's collectives are used (docs/deepspeed.md).
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    _gloo_all_gather_into_tensor()  # before DeepSpeed's backend picks its all-gather function
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    rank, world = dist.get_rank(), dist.get_world_size()
    if mode == "autotp":
        return autotp(rank, world, ckpt.connect(socket))
    if mode == "hfload":
        return hfload(rank, world, ckpt.connect(socket))
    if mode == "memory":
        return memory(rank, world)
    name = f"tiny-{mode}-{world}"
    ref = build(seed=1)
    own = {n: p.ds_tensor.detach().clone() for n, p in ref.named_parameters()}
    # The same model built without zero.Init from the same seed: the full tensors DeepSpeed
    # partitioned (it initialises modules as they are constructed, in the same order).
    torch.manual_seed(1)
    full = {n: p.detach().clone() for n, p in Tiny().named_parameters()}
    client = ckpt.connect(socket)
    ck = publish(client, name, full)
    group = shard if mode == "mics" else None

    model = build_for_fill()
    report = ckds.fill_zero3(model, ck, group_size=group)
    parts = shard if mode == "mics" else world
    assert report.layout == ((rank % parts), parts), report.layout
    assert sorted(report.parameters) == sorted(full), report.parameters
    for n, p in model.named_parameters():
        numel = full[n].numel()
        per = ckpt.ds_partition_size(numel, parts)
        start = per * (rank % parts)
        valid = max(0, min(per, numel - start))
        assert p.ds_tensor.numel() == per, (n, p.ds_tensor.numel(), per)
        assert torch.equal(p.ds_tensor[:valid], own[n][:valid]), f"{n}: ckptd's partition differs from DeepSpeed's"
        assert torch.equal(p.ds_tensor, ck.partition(n, rank, world, group_size=group)), n
    # Reassembled over the partition group (all_gather of the list kind: torch 1.13's gloo
    # has no all_gather_into_tensor, which GatheredParameters uses), the filled partitions
    # give back the checkpoint.
    for n, p in model.named_parameters():
        group_handle = p.comm.param_shard_group if mode == "mics" else None
        pieces = [torch.empty_like(p.ds_tensor) for _ in range(parts)]
        dist.all_gather(pieces, p.ds_tensor.contiguous(), group=group_handle)
        whole = torch.cat(pieces)[:full[n].numel()].view(full[n].shape)
        assert torch.equal(whole, full[n]), f"{n}: reassembled partitions differ from the checkpoint"

    # Bad input: a layout that is not DeepSpeed's, a parameter the checkpoint lacks, a version.
    if mode == "mics":
        expect(ckpt.InvalidArgument, ["does not match the partition layout", "embed.weight"],
               lambda: ckds.fill_zero3(model, ck))  # no group_size: the whole world claimed
    else:
        expect(ckpt.InvalidArgument, [f"world size {world + 1}", f"torch.distributed's {world}"],
               lambda: ckds.fill_zero3(model, ck, rank=0, world=world + 1))
        if world % 2 == 0 and world > 2:
            expect(ckpt.InvalidArgument, ["does not match the partition layout"],
                   lambda: ckds.fill_zero3(model, ck, group_size=2))
    before = {n: p.ds_tensor.clone() for n, p in model.named_parameters()}
    model.blocks[1].extra = nn.Linear(H, H)  # not under zero.Init, not in the checkpoint
    expect(ckpt.InvalidArgument, ["blocks.1.extra.weight", "parameters the checkpoint lacks"],
           lambda: ckds.fill_zero3(model, ck, group_size=group))
    del model.blocks[1].extra
    real = deepspeed.__version__
    deepspeed.__version__ = "0.16.2"
    try:
        expect(ckpt.Unsupported, ["DeepSpeed 0.16.2", "0.14.x"], lambda: ckds.fill_zero3(model, ck, group_size=group))
    finally:
        deepspeed.__version__ = real
    for n, p in model.named_parameters():
        assert torch.equal(p.ds_tensor, before[n]), f"{n} changed by a failed fill"
    ck = None  # the attachment goes with its last view
    dist.barrier()
    print(f"RANK {rank} OK ({mode}, world {world}, {len(full)} parameters, DeepSpeed {real})", flush=True)


if __name__ == "__main__":
    main()
