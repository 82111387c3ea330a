"""Building a model without allocating its weights, to be filled from ckptd."""
import contextlib

from torch import nn


@contextlib.contextmanager
def parameters_on_meta():
    """Inside this context, module parameters are created on the meta device (no memory,
    no initialisation) while buffers stay real, so a model built here only needs its
    parameters assigned: ckpt.fill_module(model, checkpoint, rank, world, plan) (any torch;
    it raises naming any parameter it would leave on meta). Do not use
    model.load_state_dict(shards) here: it copies into the meta parameters, which keeps
    them on meta without an error (its assign=True needs torch >= 2.1); if you do, call
    ckpt.meta.check_filled(model) afterwards."""
    register = nn.Module.register_parameter

    def register_on_meta(module, name, param):
        # A parameter already on meta is registered as it is, so re-registering one under
        # a second name (tie_weights) keeps the two names tied to one Parameter.
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def meta_tensors(module: nn.Module):
    """Names of `module`'s parameters and buffers still on the meta device (no data)."""
    names = [n for n, p in module.named_parameters() if p.device.type == "meta"]
    return names + [n for n, b in module.named_buffers() if b.device.type == "meta"]


def check_filled(module: nn.Module) -> None:
    """Raises ckpt.InvalidArgument naming every parameter and buffer of `module` still on
    the meta device (for instance after load_state_dict without assign=True on a model
    built under parameters_on_meta(), which leaves them there silently)."""
    left = meta_tensors(module)
    if left:
        from . import InvalidArgument
        shown = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
        raise InvalidArgument(f"{type(module).__name__} has {len(left)} tensor(s) still on the meta device "
                              f"(never filled): {shown}. Fill them with ckpt.fill_module(model, checkpoint, ...).")
