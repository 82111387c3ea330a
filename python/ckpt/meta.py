"""Building a model without allocating its weights, to be filled from ckptd."""
import contextlib

from torch import nn


@contextlib.contextmanager
def parameters_on_meta():
    """Inside this context, module parameters are created on the meta device (no memory,
    no initialisation) while buffers stay real, so a model built here only needs its
    parameters assigned: ckpt.fill_module(model, checkpoint, rank, world, plan) (any torch), or
    model.load_state_dict(shards, strict=False, assign=True) on torch >= 2.1."""
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
