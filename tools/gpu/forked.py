"""Runs a function over items, each in a forked child process, a few at a time: one item that
crashes, is killed or hangs costs only its own result (tools/gpu/gen_hf_plans.py and
check_hf_families.py, where some model types take the process down)."""
import os
import sys
import tempfile
import time


def forked(items, fn, jobs, deadline, per_item_timeout, failed):
    """Yields (item, fn(item)) for each of `items` (in the order they end), fn run in a forked
    child per item, `jobs` at a time (a parent that has imported transformers forks for free;
    fn's result must pickle). An item whose child dies (a crash, the OOM killer) or runs past
    per_item_timeout seconds yields (item, failed(item, why)); at `deadline` (a time.time()
    value) every unfinished item does."""
    import pickle
    pending = list(items)
    running = {}  # pid -> (item, result path, start time)
    tmp = tempfile.mkdtemp(prefix="forked-")
    while pending or running:
        while pending and len(running) < jobs and time.time() < deadline:
            item = pending.pop(0)
            path = os.path.join(tmp, f"{len(pending)}.pickle")
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:  # the child: never returns
                code = 0
                try:
                    result = fn(item)
                    with open(path + ".tmp", "wb") as f:
                        pickle.dump(result, f)
                    os.replace(path + ".tmp", path)
                except BaseException:  # noqa: B036 (a child must exit, whatever happened)
                    code = 1
                sys.stdout.flush()
                os._exit(code)
            running[pid] = (item, path, time.time())
        if time.time() >= deadline:
            for pid, (item, _, _) in running.items():
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                yield item, failed(item, "the deadline passed")
            for item in pending:
                yield item, failed(item, "the deadline passed")
            return
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            for pid, (item, _, started) in list(running.items()):
                if time.time() - started > per_item_timeout:
                    os.kill(pid, 9)  # reaped by waitpid below, reported as killed
            time.sleep(0.05)
            continue
        item, path, _ = running.pop(pid)
        if os.path.exists(path):
            with open(path, "rb") as f:
                yield item, pickle.load(f)
            os.unlink(path)
        else:
            why = (f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                   else f"exit code {os.WEXITSTATUS(status)}")
            yield item, failed(item, f"its process died ({why}; signal 9: the OOM killer, or past the "
                             f"{per_item_timeout:.0f} s limit)")
