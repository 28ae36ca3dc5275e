"""The model plumbing of an LLM learner: a causal LM with a value head, the frozen reference.

``agents/ppo.py`` keeps the algorithm; this module keeps what any LLM learner needs to
call a Hugging Face causal LM across versions, share one base between agents (LoRA), and
score sequences under the frozen reference.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from torch import nn

from cory_rl.agents.prefix import shared_prefix
from cory_rl.agents.sharding import Sharding, is_sharded
from cory_rl.agents.speedups import fuse_lora_sums, recompute_activations


def lm_forward(
    lm: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    cache: Any = None,
    use_cache: bool = False,
    keep: int = 0,
    **kwargs: Any,
) -> Any:
    """Call a HF causal LM across transformers versions (``cache`` was ``past_key_values``).

    ``keep`` > 0 computes the LM head on the last ``keep`` positions only: a prompt's
    logits are never needed, and the head is the costliest layer of a small model. They
    are named by an index tensor, not a count: a count slices the hidden states into a
    strided view, which torch multiplies through a batched matmul with the head's weight
    expanded per row, much slower than one matmul (``docs/benchmarks.md``).
    """
    inner = lm.get_base_model() if hasattr(lm, "get_base_model") else lm  # peft wrapper
    names = _forward_params(type(inner))
    if cache is not None:
        kwargs["cache" if "cache" in names else "past_key_values"] = cache
    if keep and "logits_to_keep" in names:
        length = input_ids.shape[1]
        kwargs["logits_to_keep"] = torch.arange(
            max(length - keep, 0), length, device=input_ids.device
        )
    out = lm(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=use_cache,
        **kwargs,
    )
    if keep:
        out.logits = out.logits[:, -keep:]
    return out


def with_shared_prefix(
    lm: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    keep: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
    """The rows' common prompt beginning run once (``agents/prefix.py``): the rest of each
    row's inputs and the KV cache to run them on; the inputs as they are and no cache
    where the rows share too little."""
    shared = shared_prefix(input_ids, attention_mask, position_ids, keep)
    if shared is None:
        return input_ids, attention_mask, position_ids, None
    ones = torch.ones_like(shared.ids)
    out = lm_forward(lm, shared.ids, ones, shared.positions, use_cache=True, keep=1)
    cache = _cache_of(out)
    cache.batch_repeat_interleave(input_ids.shape[0])
    return shared.rest_ids, shared.rest_attention, shared.rest_positions, cache


@functools.cache
def _forward_params(cls: type) -> frozenset[str]:
    return frozenset(inspect.signature(cls.forward).parameters)


def _cache_of(out: Any) -> Any:
    # transformers >= 5 names the field ``cache``; earlier versions ``past_key_values``.
    field = "cache" if "cache" in type(out).__dataclass_fields__ else "past_key_values"
    return getattr(out, field, None)


def tied_embeddings(lm: nn.Module) -> bool:
    """Whether the input embedding and the LM head are one weight."""
    head = lm.get_output_embeddings()
    return head is not None and lm.get_input_embeddings().weight is head.weight


class PolicyWithValue(nn.Module):
    """A causal LM with a scalar value head on its last hidden state.

    With LoRA several policies can wrap one ``PeftModel``, each with its own adapter:
    the base weights are then held once for all agents.
    """

    def __init__(self, lm: nn.Module, adapter: str | None = None) -> None:
        super().__init__()
        self.lm = lm
        self.adapter = adapter
        self.sharding: Sharding | None = None
        """Set when the pool shards this policy (``agents/sharding.py``)."""
        hidden = lm.config.get_text_config().hidden_size
        self.value_head = nn.Linear(hidden, 1)
        nn.init.normal_(self.value_head.weight, std=1.0 / np.sqrt(hidden + 1))
        nn.init.zeros_(self.value_head.bias)
        if adapter is None and tied_embeddings(lm):
            # The input embedding's gradient as the few rows a batch uses, added to the
            # tied head's dense one, instead of a second (V, d) tensor of zeros filled,
            # summed and freed every backward. The sum, and so the parameter's .grad,
            # stays dense.
            lm.get_input_embeddings().sparse = True

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: Any = None,
        use_cache: bool = False,
        keep: int = 0,
        share_prefix: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Logits and values of the last ``keep`` positions (0 = all), and the KV cache.
        ``share_prefix``: the rows' common prompt beginning runs once (a training forward of
        the last ``keep`` positions, without a cache; ``agents/prefix.py``)."""
        if self.adapter is not None and getattr(self.lm, "active_adapter", None) != self.adapter:
            # Only on a change of seat: peft's set_adapter walks every module, far too
            # slow to run once per token while acting.
            self.lm.set_adapter(self.adapter)
            if self.sharding is not None:
                # peft switches requires_grad off on the other seats' adapters; FSDP2 made
                # their gathered copies trainable once, and a seat's shards must keep
                # taking the gradients it reduces: none for an adapter a forward left out.
                for name, param in self.lm.named_parameters():
                    if "lora_" in name:
                        param.requires_grad_(True)
        if share_prefix and keep and cache is None and not use_cache:
            input_ids, attention_mask, position_ids, cache = with_shared_prefix(
                self.lm, input_ids, attention_mask, position_ids, keep
            )
        out = lm_forward(
            self.lm,
            input_ids,
            attention_mask,
            position_ids,
            cache=cache,
            use_cache=use_cache,
            keep=keep,
            output_hidden_states=True,
        )
        hidden = out.hidden_states[-1][:, -keep:]
        values = self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)
        return out.logits, values, _cache_of(out)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Exactly what this agent trains: its full LM, or (LoRA) only its own adapter,
        plus its value head. With LoRA the shared ``PeftModel`` also holds the other
        agents' adapters; they must never enter this agent's optimiser."""
        if self.adapter is None:
            return [p for p in self.parameters() if p.requires_grad]
        marker = f".{self.adapter}."
        own = [p for n, p in self.lm.named_parameters() if "lora_" in n and marker in n]
        # Not filtered by requires_grad: peft's set_adapter switches that flag on the
        # adapters as agents take turns. A learner without a critic freezes the head.
        return own + [p for p in self.value_head.parameters() if p.requires_grad]

    def sharded_modules(self) -> list[nn.Module]:
        """The sharded groups this policy's forward runs: itself (full fine-tuning), or
        the shared base and its own value head (LoRA)."""
        return [self] if self.adapter is None else [self.lm, self.value_head]

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """What this agent owns: its adapter (LoRA) or its full LM, plus the value head."""
        if self.adapter is not None:
            from peft import get_peft_model_state_dict

            lm_state = get_peft_model_state_dict(self.lm, adapter_name=self.adapter)
        else:
            lm_state = self.lm.state_dict()
        state = {f"lm.{k}": v for k, v in lm_state.items()}
        state.update({f"value_head.{k}": v for k, v in self.value_head.state_dict().items()})
        return state

    def load_policy_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        lm_state = {k[3:]: v for k, v in state.items() if k.startswith("lm.")}
        head = {k[11:]: v for k, v in state.items() if k.startswith("value_head.")}
        if self.adapter is not None:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.lm, lm_state, adapter_name=self.adapter)
        else:
            self.lm.load_state_dict(lm_state)
        self.value_head.load_state_dict(head)


class Reference:
    """The frozen reference policy, shared by every agent built from the same base.

    Either a separate frozen copy of the base, or (LoRA) the shared ``PeftModel`` with
    its adapters disabled, so no extra copy of the weights exists.
    """

    def __init__(self, lm: nn.Module, adapters_disabled: bool = False) -> None:
        self.lm = lm
        self.adapters_disabled = adapters_disabled
        if not adapters_disabled:
            lm.requires_grad_(False)
            lm.eval()

    @torch.no_grad()
    def logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        keep: int = 0,
        share_prefix: bool = False,
    ) -> torch.Tensor:
        """Logits of the last ``keep`` positions (0 = all); ``share_prefix`` as the policy's."""
        base_only = self.lm.disable_adapter() if self.adapters_disabled else nullcontext()
        with base_only:
            cache = None
            if share_prefix and keep:
                input_ids, attention_mask, position_ids, cache = with_shared_prefix(
                    self.lm, input_ids, attention_mask, position_ids, keep
                )
            out = lm_forward(
                self.lm, input_ids, attention_mask, position_ids, cache=cache, keep=keep
            )
            return out.logits


class ModelPool:
    """Each base model loaded once; the seats of one base share its frozen reference.

    Without LoRA a seat's policy is a full copy of its base and the base itself is the
    reference. With LoRA the seats of one base share its weights through one adapter
    each, and the reference is the base with adapters disabled. Seats of different
    bases (heterogeneous pairs) each get their own base and reference.

    ``references`` gives a model another reference than itself: a trained agent's folder
    seated for evaluation is measured against the base it was trained from, not against
    itself (a KL of 0). The reference must share the model's vocabulary.
    """

    def __init__(
        self,
        load: Callable[[str], nn.Module],
        lora_config: Any = None,
        activation_checkpointing: bool = False,
        references: dict[str, str] | None = None,
        sharding: Sharding | None = None,
        adapters: dict[str, list[str]] | None = None,
    ) -> None:
        self._load = load
        self.lora_config = lora_config
        self.activation_checkpointing = activation_checkpointing
        self.sharding = sharding
        self.adapters = adapters or {}
        """Sharded LoRA: every seat (adapter) of each base, added before the shared base
        is sharded, which happens once, at its first seat."""
        if sharding is not None and lora_config is not None and not self.adapters:
            raise ValueError("sharded LoRA seats need the pool to know every seat's adapter")
        self.references = {m: r for m, r in (references or {}).items() if m != r}
        if self.references and lora_config is not None:
            raise ValueError(
                "a reference other than the seat's own model needs full fine-tuning: with "
                "LoRA the reference is the shared base with its adapters disabled"
            )
        self._bases: dict[str, nn.Module] = {}
        self._references: dict[str, Reference] = {}
        self._sharded: dict[tuple[str, str], PolicyWithValue] = {}

    def _base(self, model: str) -> nn.Module:
        if model not in self._bases:
            base = self._load(model)
            base.eval()  # dropout off: the PPO ratio must compare the same function
            self._bases[model] = base
        return self._bases[model]

    def _reference(self, model: str) -> Reference:
        """The frozen reference of ``model``'s seats: its own base, or the one named."""
        name = self.references.get(model, model)
        if name not in self._references:
            lm = self._base(name)
            if name != model:
                own, theirs = vocabulary_size(self._base(model)), vocabulary_size(lm)
                if own != theirs:
                    raise ValueError(
                        f"reference {name!r} has {theirs} tokens and model {model!r} has {own}: "
                        "the KL compares their next-token distributions, so they must share a "
                        "vocabulary; name the base the model was trained from"
                    )
            self._references[name] = Reference(lm)
        return self._references[name]

    def policy(self, model: str, adapter: str) -> tuple[PolicyWithValue, Reference]:
        """A new trainable policy of ``model`` (LoRA: adapter ``adapter``) and its reference."""
        base = self._base(model)
        if self.lora_config is None:
            lm = copy.deepcopy(base).requires_grad_(True)
            if self.activation_checkpointing:
                recompute_activations(lm)
            policy = PolicyWithValue(lm)
            if self.sharding is not None:
                self.sharding.shard(policy)
                policy.sharding = self.sharding
            return policy, self._reference(model)
        if self.sharding is not None:
            return self._sharded_lora_policy(model, adapter)
        return self._lora_policy(model, adapter)

    def _lora_policy(self, model: str, adapter: str) -> tuple[PolicyWithValue, Reference]:
        base = self._base(model)
        if model not in self._references:
            self._references[model] = Reference(self._peft(base, adapter), adapters_disabled=True)
        else:
            self._references[model].lm.add_adapter(adapter, self.lora_config)
        peft_lm = self._references[model].lm
        peft_lm.eval()
        if self.activation_checkpointing:
            recompute_activations(peft_lm)
        for name, param in peft_lm.named_parameters():
            if "lora_" not in name:
                param.requires_grad_(False)
            elif f".{adapter}." in name:
                param.requires_grad_(True)
        return PolicyWithValue(peft_lm, adapter=adapter), self._references[model]

    def _peft(self, base: nn.Module, adapter: str) -> nn.Module:
        """``base`` with a first LoRA adapter (the other seats' are added to it)."""
        from peft import get_peft_model

        peft_lm = get_peft_model(base, self.lora_config, adapter_name=adapter)
        fuse_lora_sums(peft_lm)
        return peft_lm

    def _sharded_lora_policy(self, model: str, adapter: str) -> tuple[PolicyWithValue, Reference]:
        """A seat of a base whose every seat is made at its first one, as one process makes
        them (the same random draws, in seat order), before the shared base is sharded
        once; each seat's value head is a sharded group of its own. Every adapter stays
        trainable (FSDP2 fixes that flag at its first gather); each seat's optimiser
        takes only its own."""
        if (model, adapter) not in self._sharded:
            planned = self.adapters.get(model, [])
            if adapter not in planned:
                raise ValueError(f"seat {adapter!r} of {model!r} is not among {planned}")
            made = [self._lora_policy(model, name)[0] for name in planned]
            peft_lm = self._references[model].lm
            for name, param in peft_lm.named_parameters():
                param.requires_grad_("lora_" in name)
            self.sharding.shard(peft_lm)
            for policy in made:
                self.sharding.shard(policy.value_head)
                policy.sharding = self.sharding
                self._sharded[(model, policy.adapter)] = policy
        return self._sharded[(model, adapter)], self._references[model]

    def shard_references(self) -> None:
        """Shard the frozen references of full fine-tuning, once every seat has copied its
        base (a sharded base cannot be copied); LoRA's is the shared base, already sharded."""
        if self.sharding is None:
            return
        for reference in self._references.values():
            weight = next(reference.lm.parameters())
            if not reference.adapters_disabled and not is_sharded(weight):
                self.sharding.shard(reference.lm)


def vocabulary_size(lm: nn.Module) -> int:
    """Rows of the model's output layer: the next-token distribution it defines."""
    return int(lm.get_output_embeddings().weight.shape[0])


def build_policies(
    base_lm: nn.Module,
    n_agents: int,
    lora_config: Any = None,
    activation_checkpointing: bool = False,
) -> tuple[list[PolicyWithValue], Reference]:
    """``n_agents`` trainable policies and one shared frozen reference from one base model."""
    pool = ModelPool(lambda _: base_lm, lora_config, activation_checkpointing)
    pairs = [pool.policy("base", f"agent_{i}") for i in range(n_agents)]
    return [policy for policy, _ in pairs], pairs[0][1]
