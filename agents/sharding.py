"""FSDP2 for the seats of a run: every policy, value head and frozen reference sharded over
the processes (``torch.distributed.fsdp.fully_shard``), for full fine-tuning and for LoRA
seats on one shared base.

Each model is sharded block by block (the blocks a Hugging Face model names in
``_no_split_modules``: its decoder layers), then the rest of it (embeddings, final norm,
LM head, value head) as one group, so tied weights stay in one group. A process holds its
shard of every parameter, of its gradient and of Adam's moments; a forward gathers a block's
full weights just before it runs and frees them after.

Every process must make the same sequence of collective calls. Training does (the same
batch size, epochs and mini-batches everywhere; early stopping decided on the processes'
mean), but acting does not: a turn takes as many forwards as its longest answer, which
differs between processes. So a seat gathers its weights once at the first token of its
turn (every process plays every turn) and keeps them until the turn is over
(:meth:`Sharding.gather` / :meth:`Sharding.release`): the forwards in between make no
collective call.

Checkpoints hold full tensors, as a one-process run writes them (:func:`full_tensors`,
:func:`full_optimizer_state`), so a run resumes on any number of processes and an export
reloads with transformers alone; loading gives each process its own shard back
(:func:`load_full`, :func:`sharded_optimizer_state`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn


class Sharding:
    """FSDP2 over every process of the run (a 1-D device mesh); built inside a process group."""

    def __init__(self, device: torch.device | str, reshard_after_forward: bool = True) -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if not dist.is_initialized():
            raise RuntimeError(
                "FSDP2 needs a process group: launch with accelerate launch or torchrun"
            )
        device = torch.device(device)
        self.mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        self.reshard_after_forward = reshard_after_forward
        self.num_processes = dist.get_world_size()
        self.is_main = dist.get_rank() == 0

    # ------------------------------------------------------------------ sharding
    def shard(self, module: nn.Module) -> nn.Module:
        """Shard ``module`` in place: each block, then the rest as the root group.

        Its weights are first made those of the main process (FSDP1's
        ``sync_module_states``): every process loads or initialises them, and a value head
        or adapter drawn from a different random state would otherwise be silently sharded
        from different tensors."""
        from torch.distributed.fsdp import fully_shard

        # Our forwards return views (the logits of the last positions, the values); nothing
        # changes them in place, which is what this warning is about (the sharded update
        # equals the one-process update: tests/test_sharding.py).
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
        for embedding in module.modules():  # sparse gradients have no sharded form
            if isinstance(embedding, nn.Embedding):
                embedding.sparse = False
        self.sync_from_main(module)
        for block in blocks(module):
            fully_shard(block, mesh=self.mesh, reshard_after_forward=self.reshard_after_forward)
        fully_shard(module, mesh=self.mesh, reshard_after_forward=self.reshard_after_forward)
        return module

    @staticmethod
    def sync_from_main(module: nn.Module) -> None:
        import torch.distributed as dist

        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)

    # ------------------------------------------------------------------ acting
    @staticmethod
    def gather(modules: Iterable[nn.Module]) -> None:
        """Keep the full weights of ``modules`` after their next forward (which gathers
        them, on every process at once), until :meth:`release`."""
        for module in _fsdp_modules(modules):
            module.set_reshard_after_forward(False, recurse=False)

    def release(self, modules: Iterable[nn.Module]) -> None:
        """Free the gathered weights (no communication) and shard after forwards again."""
        for module in _fsdp_modules(modules):
            module.reshard()
            module.set_reshard_after_forward(self.reshard_after_forward, recurse=False)


def _fsdp_modules(modules: Iterable[nn.Module]) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for root in modules for m in root.modules() if isinstance(m, FSDPModule)]


def blocks(module: nn.Module) -> list[nn.Module]:
    """The repeated blocks of every Hugging Face model inside ``module``: the modules whose
    class its ``_no_split_modules`` names (decoder layers), outermost only."""
    names: set[str] = set()
    for sub in module.modules():
        names.update(getattr(sub, "_no_split_modules", None) or ())
    found: list[nn.Module] = []
    inside: set[int] = set()
    for sub in module.modules():
        if id(sub) in inside:
            continue
        if type(sub).__name__ in names:
            found.append(sub)
            inside.update(id(m) for m in sub.modules())
    return found


# ---------------------------------------------------------------------- state
def is_sharded(tensor: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on the CPU (a collective when sharded: every process calls it)."""
    if is_sharded(tensor):
        tensor = tensor.full_tensor()
    return tensor.detach().cpu()


def full_tensors(state: Mapping[str, torch.Tensor], keep: bool = True) -> dict[str, torch.Tensor]:
    """Every tensor of ``state`` whole, in key order (the same on every process).
    ``keep=False``: take part in gathering them, one at a time, and keep none (a process
    that writes nothing holds no whole copy)."""
    if not keep:
        for k in state:
            full_tensor(state[k])
        return {}
    return {k: full_tensor(state[k]) for k in state}


def full_optimizer_state(state: dict[str, Any], keep: bool = True) -> dict[str, Any]:
    """An optimizer's ``state_dict()`` with its sharded moments whole: what the optimizer
    of one process over the same parameters holds (``keep`` as :func:`full_tensors`)."""
    out = dict(state)
    out["state"] = {
        index: full_tensors({k: v for k, v in sorted(moments.items()) if torch.is_tensor(v)}, keep)
        | {k: v for k, v in moments.items() if not torch.is_tensor(v)}
        for index, moments in sorted(state["state"].items())
    }
    return out


def shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``full`` cut as the sharded ``like`` is (this process's own piece; no communication)."""
    from torch.distributed.tensor import distribute_tensor

    full = full.to(device=like.device, dtype=like.dtype)
    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)


def load_full(targets: Mapping[str, torch.Tensor], full: Mapping[str, torch.Tensor]) -> None:
    """Copy whole tensors into ``targets`` (a ``state_dict()``: views of the parameters),
    each process into its own shard. Names and shapes must match, else ``ValueError``."""
    missing, unexpected = sorted(set(targets) - set(full)), sorted(set(full) - set(targets))
    if missing or unexpected:
        raise ValueError(f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, target in targets.items():
            source = full[name]
            if tuple(source.shape) != tuple(target.shape):
                raise ValueError(
                    f"{name}: shape {tuple(source.shape)} where the model has {tuple(target.shape)}"
                )
            if is_sharded(target):
                target.to_local().copy_(shard_like(source, target).to_local())
            else:
                target.copy_(source)


def sharded_optimizer_state(state: dict[str, Any], params: list[torch.Tensor]) -> dict[str, Any]:
    """A whole optimizer state (:func:`full_optimizer_state`) cut for sharded ``params``
    (in the order of the optimizer's parameter groups)."""
    out = dict(state)
    out["state"] = {}
    for index, moments in state["state"].items():
        param = params[int(index)]
        out["state"][index] = {
            k: shard_like(v, param)
            if torch.is_tensor(v) and is_sharded(param) and tuple(v.shape) == tuple(param.shape)
            else v
            for k, v in moments.items()
        }
    return out
