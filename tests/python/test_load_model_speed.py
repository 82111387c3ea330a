"""What load_model does to be fast (issue 16), against the real daemon, with the stand-in
transformers of test_transformers_adapter (Debian's torch 1.13, no GPU):

- the detach of a checkpoint load_model attached by name runs on a background thread
  (detach="background", the default) and the attachment stays attached, as the daemon
  counts it, until that thread has unmapped it; detach="now" detaches before returning;
  references held elsewhere (the user's Checkpoint, zero-copy views, another thread
  using it) keep the attachment alive whatever load_model does;
- destroying an attachment (the unmap) releases the GIL, so another thread runs meanwhile;
- boolean tensors a model's __init__ makes (causal masks) can be made on the target device
  (_BoolTensorsOn) while every floating-point result is still computed on the CPU: here the
  meta device stands in for a GPU (tools/gpu/bench_load_model.py --masks-check compares a
  CUDA build's buffers with a CPU build's for every family on the GPU machine).
"""
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

import torch
from torch import nn

import ckpt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_ckpt  # noqa: E402
import test_transformers_adapter as adapter  # noqa: E402

# A GPT-Neo-like attention block: its __init__ makes causal masks the way
# transformers' GPTNeoSelfAttention does, and a rotary inv_freq (float, must stay the CPU's).
MASKS = '''
class MaskedAttention(nn.Module):
    def __init__(self, n, local):
        super().__init__()
        bias = torch.tril(torch.ones((n, n), dtype=bool)).view(1, 1, n, n)
        if local:
            bias = torch.bitwise_xor(bias, torch.tril(bias, -2))
        self.register_buffer("bias", bias, persistent=False)
        self.register_buffer("full", torch.full((n,), True, dtype=torch.bool), persistent=False)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, n, 2).float() / n)), persistent=False)
        self.proj = nn.Linear(n, n, bias=False)

class MaskedForCausalLM(TinyForCausalLM):
    def __init__(self, config):
        super().__init__(config)
        self.attn = nn.ModuleList([MaskedAttention(8, i % 2 == 1) for i in range(2)])
'''


def attached(client, name):
    """How many attachments the daemon counts for `name`."""
    return {c["name"]: c["attached"] for c in client.list()}.get(name, 0)


def wait_for(predicate, seconds=10.0):
    """Polls predicate() until it is true (the daemon notices a closed lease asynchronously)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


class LoadModelDetachTest(unittest.TestCase):
    """The stand-in package, daemon and checkpoints of LoadModelStandInTest (whose own
    tests run in test_transformers_adapter)."""
    setUpClass = classmethod(adapter.LoadModelStandInTest.setUpClass.__func__)
    tearDownClass = classmethod(adapter.LoadModelStandInTest.tearDownClass.__func__)
    put = classmethod(adapter.LoadModelStandInTest.put.__func__)
    load = adapter.LoadModelStandInTest.load

    def setUp(self):
        import ckpt.transformers
        self.lm = ckpt.transformers
        self.assertTrue(self.lm.wait_detached(30))
        gc.collect()
        self.assertTrue(wait_for(lambda: attached(self.client, "tiny") == 0))

    def ckptctl_attached(self, name):
        """The ATTACHED column of `ckptctl list` for `name` (the real CLI)."""
        ckptctl = os.path.join(os.path.dirname(test_ckpt.CKPTD), "ckptctl")
        out = subprocess.run([ckptctl, "--socket", self.daemon.socket, "list", "--json"], check=True,
                             capture_output=True, text=True).stdout
        rows = json.loads(out)
        rows = rows.get("checkpoints", rows) if isinstance(rows, dict) else rows
        return {r["name"]: r["attached"] for r in rows}.get(name, 0)

    def test_background_detach_keeps_counting_until_it_ends(self):
        gate, entered = threading.Event(), threading.Event()
        real = self.lm._drop

        def held(box):
            entered.set()
            gate.wait(60)
            real(box)

        with mock.patch.object(self.lm, "_drop", held):
            model = self.load(rank=0, world=1, device="cpu")
            self.assertTrue(entered.wait(30), "the detach thread started")
            # load_model has returned, the model works, and the mapping it attached is still
            # mapped: the daemon (and ckptctl) still count it, as it truly is.
            with torch.no_grad():
                self.assertTrue(torch.equal(model(self.ids).logits, self.ref(self.ids).logits))
            gc.collect()
            self.assertEqual(attached(self.client, "tiny"), 1)
            self.assertEqual(self.ckptctl_attached("tiny"), 1)
            self.assertFalse(self.lm.wait_detached(0.05), "still detaching")
            self.assertNotIn("detach_background", model.ckpt_times)
            gate.set()
            self.assertTrue(self.lm.wait_detached(30))
        self.assertGreaterEqual(model.ckpt_times["detach_background"], 0.0)
        self.assertTrue(wait_for(lambda: attached(self.client, "tiny") == 0), "the attachment is gone")
        self.assertEqual(self.ckptctl_attached("tiny"), 0)
        # The model does not depend on the mapping.
        with torch.no_grad():
            self.assertTrue(torch.equal(model(self.ids).logits, self.ref(self.ids).logits))

    def test_the_detach_thread_drops_the_last_reference(self):
        # The unmap must run on the detach thread, never on the caller's: load_model hands
        # over its only reference (measured on the GPU machine: with a reference kept by
        # the caller until after the hand-over, the 0.13 s unmap ran inside the call).
        import weakref
        real_hand_over, real_drop = self.lm._detach_in_background, self.lm._drop
        seen = {}

        def hand_over(box, times):
            seen["referrers"] = len(gc.get_referrers(box[0]))  # the box only
            seen["ref"] = weakref.ref(box[0])
            return real_hand_over(box, times)

        def drop(box):
            seen["thread"] = threading.current_thread().name
            real_drop(box)
            seen["dead after the drop"] = seen["ref"]() is None

        with mock.patch.object(self.lm, "_detach_in_background", hand_over), \
                mock.patch.object(self.lm, "_drop", drop):
            self.load(rank=0, world=1, device="cpu")
            self.assertTrue(self.lm.wait_detached(30))
        self.assertEqual(seen["referrers"], 1)
        self.assertEqual(seen["thread"], "ckpt-detach")
        self.assertTrue(seen["dead after the drop"], "the detach thread's drop was not the last reference")

    def test_detach_now_detaches_before_returning(self):
        with mock.patch.object(self.lm, "_detach_in_background",
                               side_effect=AssertionError("detached in the background")):
            model = self.load(rank=0, world=1, device="cpu", detach="now")
        self.assertIn("detach", model.ckpt_times)
        self.assertTrue(self.lm.wait_detached(0))
        self.assertTrue(wait_for(lambda: attached(self.client, "tiny") == 0))
        with torch.no_grad():
            self.assertTrue(torch.equal(model(self.ids).logits, self.ref(self.ids).logits))

    def test_bad_detach_value(self):
        with self.assertRaisesRegex(ckpt.InvalidArgument, r"detach must be 'background' or 'now', not 'later'"):
            self.load(world=1, detach="later")
        self.assertEqual(attached(self.client, "tiny"), 0)

    def test_a_checkpoint_passed_in_is_never_detached(self):
        c = self.client.attach("tiny")
        with mock.patch.object(self.lm, "_detach_in_background", side_effect=AssertionError("detached it")):
            self.lm.load_model(c, rank=0, world=1, device="cpu", config=adapter.CONFIG)
        self.assertTrue(torch.equal(c.tensor("model.norm.weight"), self.sd["model.norm.weight"]))
        gc.collect()
        self.assertEqual(attached(self.client, "tiny"), 1)
        del c
        gc.collect()
        self.assertTrue(wait_for(lambda: attached(self.client, "tiny") == 0))

    def test_other_attachments_of_the_same_checkpoint_stay(self):
        mine = self.client.attach("tiny")
        self.load(rank=0, world=1, device="cpu")
        self.assertTrue(self.lm.wait_detached(30))
        self.assertTrue(wait_for(lambda: attached(self.client, "tiny") == 1), "load_model's own attachment went")
        self.assertTrue(torch.equal(mine.tensor("model.norm.weight"), self.sd["model.norm.weight"]))

    def test_views_keep_a_background_detached_mapping_alive(self):
        # copy=False on the CPU: the model's tensors view the mapping, so the background
        # thread's drop is not the last reference and nothing is unmapped under them.
        model = self.load(rank=0, world=1, device="cpu", copy=False)
        self.assertTrue(self.lm.wait_detached(30))
        gc.collect()
        self.assertEqual(attached(self.client, "tiny"), 1, "the views hold the mapping")
        with torch.no_grad():
            self.assertTrue(torch.equal(model(self.ids).logits, self.ref(self.ids).logits))
        del model
        gc.collect()
        self.assertTrue(wait_for(lambda: attached(self.client, "tiny") == 0))

    def test_detach_while_another_thread_uses_the_checkpoint(self):
        c = self.client.attach("tiny")
        view = c.tensor("model.layers.0.mlp.up_proj.weight")
        errors, done = [], []
        start = threading.Event()

        def use(checkpoint):
            start.wait(30)
            try:
                for _ in range(30):
                    checkpoint.verify()  # reads every byte, the GIL released
                    sd = checkpoint.state_dict(copy=True)
                    assert torch.equal(sd["model.norm.weight"], self.sd["model.norm.weight"])
                done.append(True)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        user = threading.Thread(target=use, args=(c,))
        user.start()
        # This thread's reference goes to a background detach while the other thread is
        # still verifying: its reference (and the view) keep the mapping; no crash, no
        # error, the attachment lives until the last user is gone.
        times = {}
        box, c = [c], None
        self.lm._detach_in_background(box, times)
        del box
        start.set()
        self.assertTrue(self.lm.wait_detached(30))
        self.assertIn("detach_background", times)
        user.join(60)
        self.assertFalse(user.is_alive())
        self.assertEqual(errors, [])
        self.assertEqual(done, [True])
        gc.collect()
        self.assertEqual(attached(self.client, "tiny"), 1, "the view still holds it")
        self.assertTrue(torch.equal(view, self.sd["model.layers.0.mlp.up_proj.weight"]))
        del view, user
        gc.collect()
        self.assertTrue(wait_for(lambda: attached(self.client, "tiny") == 0))

    def test_masks_stay_on_the_cpu_for_a_cpu_device(self):
        made = []
        real = self.lm.build_model

        def spy(*args, **kwargs):
            made.append(kwargs.get("masks_device"))
            return real(*args, **kwargs)

        with mock.patch.object(self.lm, "build_model", spy):
            self.load(rank=0, world=1, device="cpu")
        self.assertEqual(made, [None])

    def test_many_loads_by_name_leave_nothing_attached(self):
        models = [self.load(rank=0, world=1, device="cpu") for _ in range(8)]
        self.assertTrue(self.lm.wait_detached(30))
        self.assertTrue(wait_for(lambda: attached(self.client, "tiny") == 0))
        for m in models:
            self.assertIn("detach_background", m.ckpt_times)

    def test_the_interpreter_exit_waits_for_a_background_detach(self):
        # A process that exits right after load_model: the detach thread is not a daemon
        # thread, so the exit waits for its unmap and the lease's close (a clean detach).
        code = (
            "import sys, ckpt, ckpt.transformers as lm, threading\n"
            f"sys.path.insert(0, {os.path.join(self.tmp.name, 'standin')!r})\n"
            "import transformers\n"
            "real = lm._drop\n"
            "def slow(box):\n"
            "    import time; time.sleep(0.5); real(box); print('detached', flush=True)\n"
            "lm._drop = slow\n"
            f"m = lm.load_model('tiny', socket={self.daemon.socket!r}, rank=0, world=1, device='cpu', "
            f"config={adapter.CONFIG!r})\n"
            "print('returned', flush=True)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env=os.environ.copy())
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), ["returned", "detached"])
        self.assertTrue(wait_for(lambda: attached(self.client, "tiny") == 0))


class DetachReleasesTheGilTest(unittest.TestCase):
    """Destroying an attachment (the unmap) releases the GIL: another Python thread runs
    meanwhile. Deterministic without clocks: the switch interval is made long, so the other
    thread can only run when this one gives the GIL up by itself."""

    def _daemon_with(self, name, numel):
        """A daemon (cleaned up with the test) serving checkpoint `name`: one fp32 tensor of
        `numel` ones. Returns (daemon, client)."""
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        daemon = test_ckpt.Daemon(tmp.name)
        daemon.start()
        self.addCleanup(daemon.cleanup)
        client = ckpt.connect(daemon.socket)
        path = os.path.join(tmp.name, name + ".safetensors")
        test_ckpt.make_checkpoint.write_safetensors(path, {"w": torch.ones(numel)})
        client.load(path, name)
        os.unlink(path)
        return daemon, client

    def test_another_thread_runs_while_a_large_mapping_is_unmapped(self):
        daemon, client = self._daemon_with("big", 128 << 20)  # 512 MiB
        old_interval = sys.getswitchinterval()
        self.addCleanup(sys.setswitchinterval, old_interval)
        for attempt in range(3):
            c = client.attach("big")
            c.verify()  # every page of the mapping faulted in: its unmap takes a while
            counter, stop = [0], [False]
            gate = threading.Lock()
            gate.acquire()

            def spin():
                with gate:  # waits (GIL released) until this thread lets it go
                    pass
                while not stop[0]:
                    counter[0] += 1
                    time.sleep(0)  # gives the GIL up, then waits for it again

            other = threading.Thread(target=spin)
            sys.setswitchinterval(30.0)  # no forced switch: the other thread runs only when we block
            other.start()
            gate.release()  # it wakes and now waits for the GIL, which this thread holds
            time.sleep(0.05)  # (sleeping gives the GIL up: let it start spinning)
            before = counter[0]
            del c  # the last reference: ~Checkpoint unmaps 512 MiB and closes the lease
            during = counter[0] - before
            stop[0] = True
            other.join()
            sys.setswitchinterval(old_interval)
            if during > 0:
                break
        self.assertGreater(during, 0, "no other thread ran while the checkpoint was unmapped: the GIL was held")
        self.assertTrue(wait_for(lambda: attached(client, "big") == 0))

    def test_a_daemon_thread_detaching_while_the_interpreter_exits_does_not_abort_it(self):
        # A daemon thread that drops attachments in a loop while the main thread returns:
        # had the destructor let the GIL go there, the finalizing interpreter would end the
        # thread (pthread_exit) inside the noexcept deleter as it takes the GIL back, and
        # the process would abort ("terminate called without an active exception", -6).
        daemon, client = self._daemon_with("mid", 16 << 20)  # 64 MiB
        code = (
            "import threading, time, ckpt\n"
            f"client = ckpt.connect({daemon.socket!r})\n"
            "def loop():\n"
            "    while True:\n"
            "        c = client.attach('mid'); del c\n"
            "threading.Thread(target=loop, daemon=True).start()\n"
            "time.sleep(0.3)\n")
        for attempt in range(4):
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                                 env=os.environ.copy())
            self.assertEqual(out.returncode, 0, f"attempt {attempt}: {out.stderr[-2000:]}")
        self.assertTrue(wait_for(lambda: attached(client, "mid") == 0))


class BoolTensorsOnTest(unittest.TestCase):
    """_BoolTensorsOn with the meta device standing in for a GPU."""

    def setUp(self):
        import ckpt.transformers as lm
        if lm._BoolTensorsOn is None:
            self.skipTest("this torch has no TorchFunctionMode")
        self.lm = lm

    def test_masks_go_to_the_device_and_floats_stay_on_the_cpu(self):
        mode = self.lm._BoolTensorsOn("meta")
        with mode:
            ones = torch.ones((8, 8), dtype=bool)
            mask = torch.tril(ones).view(1, 1, 8, 8)
            local = torch.bitwise_xor(mask, torch.tril(mask, -2))
            full = torch.full((4,), True, dtype=torch.bool)
            z = torch.zeros(3, dtype=torch.bool)
            count = mask.long().sum()                     # integers from booleans: exact anywhere
            floats = torch.ones(4)                        # float factory: the CPU's
            freq = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
            given = torch.ones(2, dtype=torch.bool, device="cpu")  # a device given is kept
            rnd = torch.randint(0, 2, (4,)).bool()        # not a factory of the list: the CPU
        for t in (ones, mask, local, full, z, count):
            self.assertTrue(t.is_meta, t.shape)
        self.assertEqual((mask.dtype, local.dtype, full.dtype, count.dtype), (torch.bool,) * 3 + (torch.int64,))
        for t in (floats, freq, given, rnd):
            self.assertEqual(t.device.type, "cpu")
        self.assertTrue(torch.equal(freq, 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))))
        self.assertEqual(mode.made, 3)  # ones, full, zeros (tril, xor, view follow their input)
        self.assertEqual(mode.recomputed, 0)

    def test_a_float_computed_from_a_mask_is_computed_on_the_cpu(self):
        with self.lm._BoolTensorsOn("meta"):
            mask = torch.tril(torch.ones((6, 6), dtype=torch.bool))
        cpu_mask = torch.tril(torch.ones((6, 6), dtype=torch.bool))
        twins = {id(mask): cpu_mask}
        mode = self.lm._BoolTensorsOn("meta")
        with mock.patch.object(type(mode), "_cpu_copy", lambda self_, t: twins[id(t)]):
            with mode:
                bias = mask.float() * -1e9                                # float from the mask
                mixed = torch.where(mask, torch.zeros(6, 6), torch.full((6, 6), -5.0))  # with CPU tensors
                target = torch.zeros(6, 6)
                target.masked_fill_(mask, 3.0)                            # in place into a CPU tensor
                exp = torch.exp(mask.float())                             # a transcendental: the CPU's
        want = cpu_mask.float() * -1e9
        self.assertEqual(bias.device.type, "cpu")
        self.assertTrue(torch.equal(bias, want))
        self.assertTrue(torch.equal(mixed, torch.where(cpu_mask, torch.zeros(6, 6), torch.full((6, 6), -5.0))))
        self.assertTrue(torch.equal(target, torch.zeros(6, 6).masked_fill_(cpu_mask, 3.0)))
        self.assertTrue(torch.equal(exp, torch.exp(cpu_mask.float())))
        self.assertEqual(mode.recomputed, 4)

    def test_a_float_made_on_the_masks_device_by_name_is_made_on_the_cpu(self):
        # A model's __init__ that names its mask's device for a float it makes (a bias, a
        # frequency table): the float is the CPU's, as the docstring promises.
        mode = self.lm._BoolTensorsOn("meta")
        with mode:
            mask = torch.tril(torch.ones((4, 4), dtype=torch.bool))
            freq = torch.arange(0, 8, 2, dtype=torch.float32, device=mask.device)
            bias = torch.full((4, 4), -1e9, device=mask.device)
            fill = torch.tensor(-1e9, device=mask.device)
            steps = torch.arange(4, device=mask.device)  # integers: stay on the device
        self.assertTrue(mask.is_meta)
        self.assertTrue(steps.is_meta)
        for t in (freq, bias, fill):
            self.assertEqual(t.device.type, "cpu", t)
        self.assertTrue(torch.equal(freq, torch.arange(0, 8, 2, dtype=torch.float32)))
        self.assertTrue(torch.equal(bias, torch.full((4, 4), -1e9)))
        self.assertEqual(mode.recomputed, 3)

    def test_build_model_puts_only_boolean_buffers_on_the_masks_device(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        pkg = os.path.join(tmp.name, "transformers")
        os.makedirs(pkg)
        with open(os.path.join(pkg, "__init__.py"), "w") as f:
            f.write(adapter.STAND_IN + MASKS)
        saved = sys.modules.pop("transformers", None)
        sys.path.insert(0, tmp.name)
        try:
            import transformers
            config = dict(adapter.CONFIG, architectures=["MaskedForCausalLM"])
            on_cpu = self.lm.build_model(config)

            def cpu_copy(self_, t):
                # Here the parameters are on meta too (on a GPU they are not on the masks'
                # device): the stand-in's init reads them; no mask may come back to the CPU.
                assert t.is_floating_point(), f"a {t.dtype} tensor was copied back to the CPU"
                return torch.zeros(t.shape, dtype=t.dtype)

            with mock.patch.object(self.lm._BoolTensorsOn, "_cpu_copy", cpu_copy):
                on_dev = self.lm.build_model(config, masks_device="meta")
            plain = self.lm.build_model(config, masks_device="cpu")  # the CPU: no mode at all
        finally:
            sys.path.remove(tmp.name)
            sys.modules.pop("transformers", None)
            if saved is not None:
                sys.modules["transformers"] = saved
        self.assertIsInstance(on_dev, transformers.MaskedForCausalLM)
        cpu_buffers = dict(on_cpu.named_buffers())
        self.assertEqual(sorted(cpu_buffers), sorted(n for n, _ in on_dev.named_buffers()))
        for name, b in on_dev.named_buffers():
            if b.dtype == torch.bool:
                self.assertTrue(b.is_meta, name)
                self.assertEqual((b.shape, b.dtype), (cpu_buffers[name].shape, cpu_buffers[name].dtype), name)
            else:
                self.assertEqual(b.device.type, "cpu", name)
                self.assertTrue(torch.equal(b, cpu_buffers[name]), name)
        self.assertTrue(any(b.is_meta for _, b in on_dev.named_buffers()))
        self.assertFalse(any(b.is_meta for _, b in plain.named_buffers()))
        self.assertTrue(all(p.is_meta for p in on_dev.parameters()))


if __name__ == "__main__":
    unittest.main()
