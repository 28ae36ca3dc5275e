"""The update's speed tricks, behind one boundary: each has a guard and a plain fallback.

- :func:`make_adam`: PyTorch's fused Adam kernel (one kernel for every parameter, on CPU
  and CUDA) where this torch has it for these parameters, else the plain per-tensor Adam.
  Both compute the same update.
- :func:`fuse_lora_sums`: each plain LoRA linear layer computed in one ``addmm`` on the
  base output instead of peft's three output-sized tensors; peft's own forward for anything
  else, and for a peft without the attributes it reads.
- :func:`recompute_activations`: activation checkpointing of the decoder layers that
  transformers marks (``GradientCheckpointingLayer``), also in eval mode; a transformers
  without that class gets a clear error (the setting is off by default).
- :class:`StepInBackward`: Adam's step for each parameter inside the backward pass, as soon
  as its gradient is complete, then the gradient freed (PyTorch's "optimizer step in
  backward" recipe), so the full set of gradients, a copy of the model, is never held. It
  needs ``Tensor.register_post_accumulate_grad_hook`` (torch >= 2.1); without it the update
  steps after the backward pass as usual.

What each trick buys is measured by ``bench/bench_train.py`` (``docs/benchmarks.md``).
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

HAS_POST_ACCUMULATE_HOOK = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


def make_adam(params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Adam:
    """Adam over ``params``, fused where this torch supports it for them."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):  # an older torch, or unsupported tensors
        return torch.optim.Adam(params, lr=lr)


class StepInBackward:
    """Steps an optimiser parameter by parameter during the backward pass, when active.

    Hooks are registered once on ``params``; they do nothing outside :meth:`active`. The
    optimiser is shown a group of just the parameter being stepped, so its state and
    ``state_dict`` stay exactly those of the plain step.

    A hook reaches this object through a weak reference. A strong one would close the
    cycle parameter -> hook -> optimiser -> parameter, and the garbage collector cannot
    break a cycle through a tensor that C++ also holds (a view, a live autograd graph):
    the optimiser with all of Adam's moments then outlived its learner, run after run in
    one process (a sweep; figures in docs/benchmarks.md).
    """

    def __init__(self, optimizer: Any, params: Iterable[torch.nn.Parameter]) -> None:
        self.optimizer = optimizer  # accelerate's wrapper or a torch optimiser
        self._groups: dict[int, dict] | None = None
        if HAS_POST_ACCUMULATE_HOOK:
            step = weakref.WeakMethod(self._step)

            def hook(param: torch.Tensor) -> None:
                method = step()
                if method is not None:  # gone with its learner: nothing to step
                    method(param)

            for param in params:
                param.register_post_accumulate_grad_hook(hook)

    @property
    def torch_optimizer(self) -> torch.optim.Optimizer:
        """The optimiser inside accelerate's wrapper."""
        return getattr(self.optimizer, "optimizer", self.optimizer)

    @property
    def stepping(self) -> bool:
        """Whether the backward pass is stepping the parameters right now."""
        return self._groups is not None

    @contextlib.contextmanager
    def active(self, wanted: bool) -> Iterator[bool]:
        """Step inside the backward pass while in the block, if ``wanted`` and available;
        yields whether it does (if not, the caller steps after the backward pass)."""
        if not (wanted and HAS_POST_ACCUMULATE_HOOK):
            yield False
            return
        groups = self.torch_optimizer.param_groups
        self._groups = {id(p): g for g in groups for p in g["params"]}
        try:
            yield True
        finally:
            self._groups = None

    def _step(self, param: torch.Tensor) -> None:
        group = (self._groups or {}).get(id(param))
        if group is None:  # not inside an active update (or not a parameter it steps)
            return
        optimizer = self.torch_optimizer
        groups = optimizer.param_groups
        optimizer.param_groups = [{**group, "params": [param]}]
        try:
            optimizer.step()
        finally:
            optimizer.param_groups = groups
        param.grad = None


def recompute_activations(lm: nn.Module) -> int:
    """Make ``lm``'s decoder layers keep only their inputs for the backward pass and
    recompute the rest there (activation checkpointing); return how many were wrapped.

    The update's chunk then holds one layer's activations instead of every layer's, for
    one more forward of the body in the backward. Transformers' own switch acts only in
    training mode, and a policy stays in eval mode (its dropout off, so the PPO ratio
    compares one function); so each layer's ``forward`` is wrapped here, and it
    checkpoints only when gradients are recorded: acting and the reference pass are
    untouched.
    """
    from torch.utils.checkpoint import checkpoint

    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # transformers before the class existed
        raise ValueError(
            "activation_checkpointing needs a transformers that marks its decoder layers "
            "(transformers.modeling_layers.GradientCheckpointingLayer); upgrade transformers "
            "or train with activation_checkpointing false"
        ) from None

    def recomputed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    layers = [m for m in lm.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ValueError(
            f"activation_checkpointing: {type(lm).__name__} has no decoder layers that "
            "transformers marks as checkpointable (GradientCheckpointingLayer); train it "
            "with activation_checkpointing false"
        )
    for layer in layers:
        if not isinstance(layer.forward, functools.partial):  # a shared base: wrap once
            layer.forward = functools.partial(recomputed, layer.forward)
    return len(layers)


_LORA_ATTRIBUTES = (
    "active_adapters",
    "disable_adapters",
    "merged",
    "lora_A",
    "lora_B",
    "lora_dropout",
    "scaling",
    "base_layer",
)


def fuse_lora_sums(lm: nn.Module) -> int:
    """Compute each plain LoRA linear layer as ``base(x) + s * A(x) @ B^T`` in one ``addmm``
    on the base output; return how many layers take it.

    peft writes the adapter's output, then its scaled copy, then the sum: two more
    output-sized tensors per adapted layer, memory-bound work for little arithmetic. The
    sum is the same up to rounding (bitwise when the scale is a power of two). Anything but
    one vanilla adapter in fp32 (adapters disabled for the reference, merged weights,
    dropout, DoRA and other variants, a bias on B, mixed precision) takes peft's own
    forward, and so does every layer of a peft whose LoRA layer lacks what this reads.
    """
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:
        return 0

    def fused(layer: LoraLinear, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        active = layer.active_adapters
        name = active[0] if len(active) == 1 else None
        plain = (
            name is not None
            and not (args or kwargs or layer.disable_adapters or layer.merged)
            and name in layer.lora_A
            and name not in getattr(layer, "lora_variant", {})
            and isinstance(layer.lora_dropout[name], nn.Identity)
            and layer.lora_B[name].bias is None
        )
        if plain:
            a, b = layer.lora_A[name].weight, layer.lora_B[name].weight
            plain = x.dtype == a.dtype == b.dtype == layer.base_layer.weight.dtype
        if not plain:
            return LoraLinear.forward(layer, x, *args, **kwargs)
        result = layer.base_layer(x)
        hidden = nn.functional.linear(x, a).reshape(-1, a.shape[0])
        flat = result.reshape(-1, result.shape[-1])
        return torch.addmm(flat, hidden, b.t(), alpha=layer.scaling[name]).view(result.shape)

    layers = [m for m in lm.modules() if type(m) is LoraLinear]
    if not all(hasattr(m, a) for m in layers for a in _LORA_ATTRIBUTES):
        return 0  # a peft version this was not written for: its own forward throughout
    for layer in layers:
        layer.forward = functools.partial(fused, layer)
    return len(layers)
