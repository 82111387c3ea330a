"""Imported first by the tools' scripts that need PyTorch. Their shebang,
`#!/usr/bin/env python3`, runs the first python3 on PATH, which may have no torch (a
pyenv or a bare venv before Debian's /usr/bin/python3 with python3-torch): then this
re-runs the script, same arguments, under a Python that has it: $CKPT_TORCH_PYTHON, else
/usr/bin/python3, else /usr/local/bin/python3. It does nothing when torch is importable,
or when a tool module is imported by something else (only a script run directly is
re-run); it exits naming the interpreter when none has torch."""
import importlib.util
import os
import sys


def _reexec_if_no_torch():
    main = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.path.dirname(main) != os.path.dirname(os.path.abspath(__file__)):
        return  # imported as a module, not the script being run
    if importlib.util.find_spec("torch") is not None:
        return
    if not os.environ.get("CKPT_TORCH_REEXEC"):
        for exe in (os.environ.get("CKPT_TORCH_PYTHON"), "/usr/bin/python3", "/usr/local/bin/python3"):
            if exe and os.access(exe, os.X_OK) and os.path.abspath(exe) != os.path.abspath(sys.executable):
                os.environ["CKPT_TORCH_REEXEC"] = "1"  # once: the next one must have torch itself
                os.execv(exe, [exe, main] + sys.argv[1:])
    sys.exit(f"{os.path.basename(main)} needs PyTorch, and {sys.executable} has no torch: run it with a Python "
             "that has (or set CKPT_TORCH_PYTHON)")


_reexec_if_no_torch()
