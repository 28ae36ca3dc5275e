"""How the KL to the reference enters an update: the forms of the penalty, and what each
puts in the rewards and in the loss.

The objective is E[R - beta * KL], with KL = sum_t KL(pi(.|s_t) || pi_ref(.|s_t)) over an
answer's states. Its gradient has two parts (Tang and Munos 2025, arXiv 2506.09477):

- the *credit*: each token's log-prob gradient times the KL of the states after it (what
  it causes), which a per-token reward carries through the returns;
- the *direct* part: each state's KL differentiated with respect to that state's own
  distribution, which no reward can carry, since a reward that depends on the state alone
  gives its token nothing in expectation.

A form names what is measured per token (for the report and the KL controller), what goes
into the token's reward (times -beta) and what goes into the loss (times beta,
differentiated). The exact forms give the gradient of E[R - beta * KL] in expectation:

- ``full`` (the default): the exact per-state KL over the vocabulary in the token's reward
  (credit to the tokens before it) and, differentiated, in the loss (the direct part);
- ``k1``: log pi(y_t) - log pi_ref(y_t) of the sampled token in its reward (TRL's PPO
  default; its direct part, E[grad log pi] = 0, vanishes in expectation);
- ``k3``: Schulman's k3 in the reward and, differentiated, in the loss.

The fidelity forms are kept to reproduce others' code, under names that say what they do;
their gradients are biased (figures: docs/learners.md, ``python -m bench.kl_gradient``):

- ``full_in_reward``: the per-state KL in the reward only: the official CORY code and TRL
  0.7's ``kl_penalty: full``. The last state's KL is never charged;
- ``k3_in_reward``, ``abs_in_reward``, ``mse_in_reward``: a sampled estimate in the reward
  only (TRL 0.7's ``abs`` and ``mse``);
- ``k3_in_loss``: k3 differentiated as a loss, nothing in the reward: GRPO's KL term (TRL's
  GRPOTrainer), the direct part of the reverse KL(pi_ref || pi), not of KL(pi || pi_ref).

Nothing here touches a model: tensors are (B, T) over response tokens, or (B, T, V) full
log-probs, as in ``agents/ppo_math.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cory_rl.agents import ppo_math as pm


@dataclass(frozen=True)
class PenaltyForm:
    """One way of putting the KL penalty into an update."""

    measure: str
    """What is measured per token: ``full`` (the exact per-state KL) or a sampled estimator
    of ``agents/ppo_math.py``'s ``kl_sampled`` (``k1``, ``k3``, ``abs``, ``mse``)."""
    in_reward: bool
    """Whether the measured value enters the token's reward (times -beta)."""
    in_loss: str | None
    """What enters the loss, differentiated (times beta): ``full`` (each state's exact KL
    under the current policy), ``k3`` (the sampled k3 under the current policy) or None."""
    exact: bool
    """Whether the gradient is that of E[R - beta * KL] in expectation."""
    source: str
    """Where the form comes from, for the help and the docs."""


FORMS: dict[str, PenaltyForm] = {
    "full": PenaltyForm("full", True, "full", True, "exact: Tang and Munos 2025"),
    "k1": PenaltyForm("k1", True, None, True, "exact: TRL's PPO default"),
    "k3": PenaltyForm("k3", True, "k3", True, "exact: k3 in the reward and in the loss"),
    "full_in_reward": PenaltyForm(
        "full", True, None, False, "fidelity: the official CORY code, TRL 0.7's 'full'"
    ),
    "k3_in_reward": PenaltyForm("k3", True, None, False, "fidelity: k3 in the reward only"),
    "abs_in_reward": PenaltyForm("abs", True, None, False, "fidelity: TRL 0.7's 'abs'"),
    "mse_in_reward": PenaltyForm("mse", True, None, False, "fidelity: TRL 0.7's 'mse'"),
    "k3_in_loss": PenaltyForm("k3", False, "k3", False, "fidelity: GRPO's KL term (TRL)"),
}
"""Every form by name; ``kl_penalty`` picks one."""

EXACT = tuple(name for name, form in FORMS.items() if form.exact)
FIDELITY = tuple(name for name, form in FORMS.items() if not form.exact)

OLD_ESTIMATORS = {
    "full": "full_in_reward",
    "k1": "k1",
    "k3": "k3_in_reward",
    "abs": "abs_in_reward",
    "mse": "mse_in_reward",
}
"""What the setting ``kl_estimator`` (before ``kl_penalty``) did, as a form: a saved
config that names it runs as it ran."""


def form(name: str) -> PenaltyForm:
    """The form called ``name``; an unknown name raises ``ValueError`` listing the forms."""
    if name not in FORMS:
        raise ValueError(f"unknown KL penalty {name!r}; choose one of {list(FORMS)}")
    return FORMS[name]


def measured(
    name: str,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    full_logprobs: torch.Tensor | None = None,
    ref_full_logprobs: torch.Tensor | None = None,
) -> torch.Tensor:
    """The KL measured per token (B, T) as form ``name`` measures it: from the full (B, T, V)
    log-probs of the acting policy and the reference, or from the sampled tokens'."""
    kind = form(name).measure
    if kind == "full":
        if full_logprobs is None or ref_full_logprobs is None:
            raise ValueError(f"the KL penalty {name!r} needs the full log-probs of both models")
        return pm.kl_per_token(full_logprobs, ref_full_logprobs)
    return pm.kl_sampled(logprobs, ref_logprobs, kind)


def reward_part(name: str, kl: torch.Tensor) -> torch.Tensor:
    """What enters each token's reward, before -beta: the measured ``kl`` or zeros."""
    return kl if form(name).in_reward else torch.zeros_like(kl)


def loss_part(
    name: str,
    logits: torch.Tensor | None,
    logprobs: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    ref_full_logprobs: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """What enters the loss per token (B, T), before beta, with its gradient: each state's
    exact KL from the current ``logits`` (B, T, V) and the reference's full log-probs, or
    the sampled k3 from the current ``logprobs`` of the tokens; None for a form without one.
    The KL is always the model's own distribution's (``logits`` at temperature 1)."""
    kind = form(name).in_loss
    if kind is None:
        return None
    if kind == "k3":
        if logprobs is None or ref_logprobs is None:
            raise ValueError(f"the KL penalty {name!r} needs the tokens' log-probs of both models")
        return pm.kl_sampled(logprobs, ref_logprobs, "k3")
    if logits is None or ref_full_logprobs is None:
        raise ValueError(
            f"the KL penalty {name!r} needs the logits and the reference's full log-probs"
        )
    logp = torch.log_softmax(logits.float(), dim=-1)
    return pm.kl_per_token(logp, ref_full_logprobs.to(logp.device))


def needs_full_logprobs(name: str) -> bool:
    """Whether acting must record the full log-probs (the exact per-state KL)."""
    return form(name).measure == "full"


def needs_reference_full_logprobs(name: str) -> bool:
    """Whether the update needs the reference's full log-probs (the exact KL in the loss)."""
    return form(name).in_loss == "full"


def loss_weight(name: str, beta: float, advantage_scale: torch.Tensor | float) -> torch.Tensor:
    """The weight of the loss part: beta times what the advantages were scaled by (an
    exact form, so that the direct part keeps its size beside the credit, whose rewards
    the whitening rescaled), or beta alone (a fidelity form, as its source weighs it)."""
    scale = advantage_scale if form(name).exact else 1.0
    return beta * torch.as_tensor(scale, dtype=torch.float32)
