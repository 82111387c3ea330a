"""Building a model without allocating its weights, to be filled from ckptd."""
import contextlib

from torch import nn


@contextlib.contextmanager
def parameters_on_meta():
    """Inside this context, module parameters are created on the meta device (no memory,
    no initialisation) while buffers stay real, so a model built here only needs its
    parameters assigned: model.load_state_dict(shards, strict=False, assign=True)."""
    register = nn.Module.register_parameter

    def register_on_meta(module, name, param):
        register(module, name, param)
        if param is not None:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register
