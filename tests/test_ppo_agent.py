"""The PPO learner on a tiny Llama: acting bookkeeping, KL, learning, LoRA, save/load."""

from __future__ import annotations

import functools
import gc
import weakref

import numpy as np
import pytest
import torch

import cory_env
from cory_rl.agents.policy import build_policies
from cory_rl.agents.ppo import PPOAgent, PPOConfig
from cory_rl.agents.rollout import response_logits
from cory_rl.train.training.loop import play_batch
from tests.conftest import make_tiny_gpt2, make_tiny_lm


def target_task(tokenizer, word: str = "great", budget: int = 4):
    """Reward = share of response words equal to ``word``: a signal a tiny model can learn."""

    def reward(queries, responses):
        return [r.split().count(word) / budget for r in responses]

    return cory_env.custom_task(
        ["the movie was", "this film is", "i love the", "a very"],
        reward,
        prompt_fn=lambda role, q, earlier: q.text if role == 0 else f"{earlier[-1]} and {q.text}",
        max_new_tokens=budget,
        context_length=24,
    )


def make_agents(tokenizer, lm, n_agents, config, lora=None):
    policies, reference = build_policies(lm, n_agents, lora)
    return {
        f"llm_{i}": PPOAgent(p, reference, config, tokenizer.pad_token_id, seed=i)
        for i, p in enumerate(policies)
    }


@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_recorded_logprobs_and_values_match_a_full_forward(tiny_tokenizer, architecture):
    """The KV-cached acting pass must agree with the batched training forward (ratio = 1)."""
    game = cory_env.batched_game(
        target_task(tiny_tokenizer), batch_size=6, n_agents=1, tokenizer=tiny_tokenizer
    )
    make = make_tiny_lm if architecture == "llama" else make_tiny_gpt2
    agents = make_agents(tiny_tokenizer, make(len(tiny_tokenizer)), 1, PPOConfig())
    game.reset(seed=3)
    play_batch(game, agents)
    agent = agents["llm_0"]
    ep = agent.rollout
    ids, mask, pos = ep.sequences()
    T = ep.tokens.shape[1]
    with torch.no_grad():
        logits, values, _ = agent.model(ids, mask, pos, keep=T + 1)
    logprobs = torch.log_softmax(response_logits(logits, T), -1)
    token_lp = logprobs.gather(-1, ep.tokens[..., None]).squeeze(-1)
    m = ep.mask.bool()
    assert m.sum() > 0 and (ep.prompt_mask == 0).any(), "test needs padded prompts"
    torch.testing.assert_close(token_lp[m], ep.logprobs[m], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(values[:, :-1][m], ep.values[m], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logprobs[m], ep.full_logprobs[m], atol=1e-4, rtol=1e-4)


def test_kl_is_zero_before_training_and_positive_after(tiny_tokenizer, tiny_lm):
    cfg = PPOConfig(learning_rate=5e-3, mini_batch_size=8)
    game = cory_env.batched_game(
        target_task(tiny_tokenizer), batch_size=8, n_agents=1, tokenizer=tiny_tokenizer
    )
    agent = make_agents(tiny_tokenizer, tiny_lm, 1, cfg)["llm_0"]
    game.reset(seed=0)
    play_batch(game, {"llm_0": agent})
    assert agent.reference_kl(agent.rollout).abs().max() < 1e-5
    stats = agent.learn()
    assert abs(stats["objective/kl"]) < 1e-4
    game.reset()
    play_batch(game, {"llm_0": agent})
    assert agent.reference_kl(agent.rollout).sum() > 1e-3


def test_sampled_kl_estimator_runs_without_full_logprobs(tiny_tokenizer, tiny_lm):
    cfg = PPOConfig(kl_penalty="k3", mini_batch_size=4)
    game = cory_env.batched_game(
        target_task(tiny_tokenizer), batch_size=4, n_agents=1, tokenizer=tiny_tokenizer
    )
    agent = make_agents(tiny_tokenizer, tiny_lm, 1, cfg)["llm_0"]
    game.reset(seed=0)
    play_batch(game, {"llm_0": agent})
    assert agent.rollout.full_logprobs is None
    assert np.isfinite(agent.learn()["objective/kl"])


def _train(game, agents, iterations):
    scores = []
    for it in range(iterations):
        game.reset(seed=0 if it == 0 else None)
        play_batch(game, agents)
        for agent in agents.values():
            agent.learn()
        scores.append(np.mean([s.mean() for s in game.scores.values()]))
    return scores


@pytest.mark.parametrize("n_agents", [1, 2])
def test_reward_rises_for_ppo_and_cory(tiny_tokenizer, tiny_lm, n_agents):
    """Rewarded for the word 'great', the agents learn to say it (one-agent PPO and CORY)."""
    cfg = PPOConfig(learning_rate=3e-3, mini_batch_size=16, init_kl_coef=0.01, adaptive_kl=False)
    game = cory_env.batched_game(
        target_task(tiny_tokenizer),
        batch_size=32,
        n_agents=n_agents,
        tokenizer=tiny_tokenizer,
        role_exchange_period=3,
    )
    agents = make_agents(tiny_tokenizer, tiny_lm, n_agents, cfg)
    scores = _train(game, agents, 25)
    assert np.mean(scores[:3]) < 0.15
    assert np.mean(scores[-3:]) > 0.6, scores


def test_lora_agents_share_one_base_and_reference(tiny_tokenizer, tiny_lm):
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    cfg = PPOConfig(learning_rate=1e-2, mini_batch_size=8)
    game = cory_env.batched_game(
        target_task(tiny_tokenizer), batch_size=8, n_agents=2, tokenizer=tiny_tokenizer
    )
    agents = make_agents(tiny_tokenizer, tiny_lm, 2, cfg, lora=lora)
    a0, a1 = agents["llm_0"], agents["llm_1"]
    assert a0.model.lm is a1.model.lm is a0.reference.lm
    before = {k: v.clone() for k, v in a1.model.policy_state_dict().items()}
    base_before = tiny_lm.get_input_embeddings().weight.clone()
    game.reset(seed=0)
    play_batch(game, agents)
    a0.learn()
    a1.rollout = None
    after = a1.model.policy_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "llm_1's adapter moved"
    assert torch.equal(tiny_lm.get_input_embeddings().weight, base_before)
    game.reset()
    play_batch(game, agents)
    assert a0.reference_kl(a0.rollout).sum() > 0  # its adapter moved away from the base
    assert a1.reference_kl(a1.rollout).abs().max() < 1e-5  # untouched adapter = reference


def test_save_and_load_restore_the_agent(tiny_tokenizer, tiny_lm, tmp_path):
    cfg = PPOConfig(learning_rate=1e-2, mini_batch_size=8)
    game = cory_env.batched_game(
        target_task(tiny_tokenizer), batch_size=8, n_agents=1, tokenizer=tiny_tokenizer
    )
    agent = make_agents(tiny_tokenizer, tiny_lm, 1, cfg)["llm_0"]
    game.reset(seed=0)
    play_batch(game, {"llm_0": agent})
    agent.learn()
    agent.save(tmp_path / "a")
    obs = game.observe("llm_0")
    obs["num_generated"][:] = 0
    fresh = make_agents(tiny_tokenizer, tiny_lm, 1, cfg)["llm_0"]
    fresh.load(tmp_path / "a")
    assert fresh.shaping.kl_ctl.value == agent.shaping.kl_ctl.value
    assert fresh.shaping.score_moments.count == agent.shaping.score_moments.count
    np.testing.assert_array_equal(fresh.act(obs), agent.act(obs))


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="kl_penalty"):
        PPOConfig(kl_penalty="bogus").validate()
    with pytest.raises(ValueError, match="multiple of gradient_accumulation_steps"):
        PPOConfig(mini_batch_size=6, gradient_accumulation_steps=4).validate()


def test_each_lora_agent_optimises_exactly_its_adapter_and_value_head(tiny_tokenizer, tiny_lm):
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    agents = make_agents(tiny_tokenizer, tiny_lm, 2, PPOConfig(), lora=lora)
    names = {id(p): n for n, p in agents["llm_0"].model.lm.named_parameters()}
    held = {}
    for i, (agent_name, agent) in enumerate(agents.items()):
        params = [p for group in agent.optimizer.param_groups for p in group["params"]]
        ids = {id(p) for p in params}
        expected_lm = {k for k, n in names.items() if "lora_" in n and f".agent_{i}." in n}
        head = {id(p) for p in agent.model.value_head.parameters()}
        assert len(expected_lm) == 2 * 2 * 2  # 2 layers x (q, v) x (A, B)
        assert ids == expected_lm | head, agent_name
        held[agent_name] = ids
    assert held["llm_0"].isdisjoint(held["llm_1"])


def test_seen_tokens_and_repetition_penalty_by_hand():
    from cory_rl.agents.sampling import SamplingDistribution, seen_before_each

    prompt = torch.tensor([[0, 2, 3]])  # 0 is padding (mask 0)
    prompt_mask = torch.tensor([[0, 1, 1]])
    tokens = torch.tensor([[4, 2, 1]])
    ids, real = seen_before_each(prompt, prompt_mask, tokens)

    def seen_set(t):
        return set(ids[0, t][real[0, t]].tolist())

    # before t=0: {2, 3}; before t=1: {2, 3, 4}; before t=2: {2, 3, 4} (2 again)
    assert [seen_set(t) for t in range(3)] == [{2, 3}, {2, 3, 4}, {2, 3, 4}]
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 0.5]])
    out = SamplingDistribution(repetition_penalty=2.0).logits(logits, (ids[:, 1], real[:, 1]))
    # seen tokens 2, 3, 4: positive logits halve, negative double; 0 and 1 untouched
    torch.testing.assert_close(out, torch.tensor([[2.0, -2.0, 1.0, -4.0, 0.25]]))


@pytest.mark.parametrize("penalty", [1.1, 1.3, 0.8])
def test_repetition_penalty_matches_the_dense_rule_bit_for_bit(penalty):
    """Seen ids with repeats and ignored slots give the same logits and gradient, to the
    bit, as transformers' rule applied through a dense (N, T, V) mask."""
    from cory_rl.agents.sampling import SamplingDistribution, seen_before_each

    g = torch.Generator().manual_seed(0)
    N, P, T, V = 3, 5, 6, 11  # a small vocabulary: many repeats
    prompt = torch.randint(0, V, (N, P), generator=g)
    prompt_mask = torch.ones(N, P, dtype=torch.long)
    prompt_mask[0, :2] = 0
    tokens = torch.randint(0, V, (N, T), generator=g)
    logits = torch.randn(N, T, V, generator=g, requires_grad=True)
    weights = torch.randn(N, T, V, generator=g)

    dense = torch.zeros(N, T, V, dtype=torch.bool)
    for n in range(N):
        for t in range(T):
            context = prompt[n][prompt_mask[n].bool()].tolist() + tokens[n, :t].tolist()
            dense[n, t, context] = True
    x = logits.detach().clone().requires_grad_(True)
    expected = torch.where(dense, torch.where(x < 0, x * penalty, x / penalty), x)
    (expected * weights).sum().backward()

    out = SamplingDistribution(repetition_penalty=penalty).logits(
        logits, seen_before_each(prompt, prompt_mask, tokens)
    )
    (out * weights).sum().backward()
    assert torch.equal(out, expected)
    assert torch.equal(logits.grad, x.grad)


@pytest.mark.parametrize(
    "sampling",
    [{"repetition_penalty": 1.3}, {"repetition_penalty": 1.1, "temperature": 0.7, "top_k": 5}],
)
def test_ratio_compares_the_distribution_tokens_were_drawn_from(tiny_tokenizer, tiny_lm, sampling):
    """With a penalty or warpers, the first PPO ratio is exactly 1 (same distribution)."""
    cfg = PPOConfig(mini_batch_size=8, ppo_epochs=1, **sampling)
    game = cory_env.batched_game(
        target_task(tiny_tokenizer), batch_size=8, n_agents=1, tokenizer=tiny_tokenizer
    )
    agent = make_agents(tiny_tokenizer, tiny_lm, 1, cfg)["llm_0"]
    game.reset(seed=0)
    play_batch(game, {"llm_0": agent})
    ro = agent.rollout
    m = ro.mask.bool()
    assert not torch.allclose(ro.sample_logprobs[m], ro.logprobs[m]), "sampling had no effect"
    stats = agent.learn()  # one mini-batch, one epoch: every ratio is taken before a step
    assert stats["ppo/ratio"] == pytest.approx(1.0, abs=1e-5)
    assert stats["ppo/approx_kl"] < 1e-9


@pytest.mark.parametrize("threshold", [10.0, None])
def test_a_micro_batch_with_a_spiking_ratio_is_skipped(tiny_tokenizer, tiny_lm, threshold):
    cfg = PPOConfig(mini_batch_size=8, ppo_epochs=1, learning_rate=1e-2, ratio_threshold=threshold)
    game = cory_env.batched_game(
        target_task(tiny_tokenizer), batch_size=8, n_agents=1, tokenizer=tiny_tokenizer
    )
    agent = make_agents(tiny_tokenizer, tiny_lm, 1, cfg)["llm_0"]
    game.reset(seed=0)
    play_batch(game, {"llm_0": agent})
    agent.rollout.sample_logprobs -= 5.0 * agent.rollout.mask  # ratio e^5 ~ 148 > 10
    before = [p.detach().clone() for p in agent.model.trainable_parameters()]
    stats = agent.learn()
    after = agent.model.trainable_parameters()
    moved = any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    if threshold is None:
        assert moved and stats["ppo/skipped_fraction"] == 0.0
    else:
        assert not moved and stats["ppo/skipped_fraction"] == 1.0


def test_chunked_forwards_give_the_micro_batch_update_exactly(tiny_tokenizer):
    """forward_batch_size is memory and speed only: same parameters and statistics."""
    import copy

    game = cory_env.batched_game(
        target_task(tiny_tokenizer), batch_size=8, n_agents=1, tokenizer=tiny_tokenizer
    )
    results = []
    for rows in (8, 3):
        cfg = PPOConfig(
            mini_batch_size=8, ppo_epochs=2, learning_rate=1e-2, forward_batch_size=rows
        )
        agent = make_agents(tiny_tokenizer, make_tiny_lm(len(tiny_tokenizer)), 1, cfg)["llm_0"]
        game.reset(seed=0)
        play_batch(game, {"llm_0": agent})
        ro = agent.rollout  # rows of different lengths, so token and row weights differ
        ro.mask[::2, 1:] = 0
        ro.logprobs *= ro.mask
        ro.sample_logprobs *= ro.mask
        ro.values *= ro.mask
        stats = agent.learn()
        params = copy.deepcopy([p.detach() for p in agent.model.trainable_parameters()])
        results.append((stats, params))
    (stats_a, params_a), (stats_b, params_b) = results
    # Adam turns a rounding-level gradient difference on a near-zero entry into up to
    # lr-sized steps, so parameters are compared at 1e-4 (a real change moves many by ~1e-2).
    for a, b in zip(params_a, params_b, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
    for key in ("ppo/loss_policy", "ppo/loss_value", "ppo/entropy", "ppo/clipfrac"):
        assert stats_a[key] == pytest.approx(stats_b[key], rel=1e-5, abs=1e-7), key


def test_a_tied_embedding_gets_the_dense_gradient_from_sparse_rows(tiny_tokenizer):
    """Tied weights: the embedding's gradient comes as rows, yet .grad is dense and equal
    to the all-dense computation (and Adam's fused step takes it); untied: unchanged."""
    import copy

    from transformers import LlamaConfig, LlamaForCausalLM

    from cory_rl.agents.policy import PolicyWithValue

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tiny_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    lm = LlamaForCausalLM(config).eval()
    policy = PolicyWithValue(copy.deepcopy(lm))
    assert policy.lm.get_input_embeddings().sparse
    dense = PolicyWithValue(copy.deepcopy(lm))
    dense.lm.get_input_embeddings().sparse = False
    dense.value_head.load_state_dict(policy.value_head.state_dict())
    ids = torch.tensor([[3, 3, 5, 7, 3], [9, 3, 2, 2, 4]])  # repeated tokens
    mask = torch.ones_like(ids)
    pos = mask.cumsum(-1) - 1
    for model in (policy, dense):
        for _ in range(2):  # two accumulated backward passes, as chunks of a micro-batch
            logits, values, _ = model(ids, mask, pos, keep=3)
            (torch.log_softmax(logits, -1)[..., 4].sum() + values.sum()).backward()
    weight = policy.lm.get_input_embeddings().weight
    assert weight.grad.layout == torch.strided
    torch.testing.assert_close(weight.grad, dense.lm.get_input_embeddings().weight.grad)
    torch.optim.Adam(policy.parameters(), lr=1e-3, fused=True).step()

    untied = PolicyWithValue(
        LlamaForCausalLM(LlamaConfig(**{**config.to_dict(), "tie_word_embeddings": False}))
    )
    assert not untied.lm.get_input_embeddings().sparse


def _layer_calls(lm) -> list[int]:
    """A counter of how often the layers' MLPs start (a recomputed layer runs them again;
    a pre-hook, as the replay stops once it has what the backward needs)."""
    calls = [0]
    for layer in lm.model.layers:
        layer.mlp.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_activation_checkpointing_recomputes_layers_for_the_same_update(tiny_tokenizer):
    """Recomputed layers: each runs again in the backward, never while acting or in the
    reference pass, and the update (parameters, statistics) is the one without it."""
    import copy

    game = cory_env.batched_game(
        target_task(tiny_tokenizer), batch_size=8, n_agents=1, tokenizer=tiny_tokenizer
    )
    results = []
    for recompute in (False, True):
        cfg = PPOConfig(mini_batch_size=8, ppo_epochs=2, learning_rate=1e-2, forward_batch_size=4)
        policies, reference = build_policies(
            make_tiny_lm(len(tiny_tokenizer)), 1, activation_checkpointing=recompute
        )
        agent = PPOAgent(policies[0], reference, cfg, tiny_tokenizer.pad_token_id)
        calls = _layer_calls(agent.model.lm)
        game.reset(seed=0)
        play_batch(game, {"llm_0": agent})
        acting_calls = calls[0]
        stats = agent.learn()
        # 2 epochs x 2 chunks, 2 layers: one forward each, plus one replay with recompute.
        assert calls[0] - acting_calls == 2 * 2 * 2 * (2 if recompute else 1)
        results.append(
            (acting_calls, stats, [p.detach().clone() for p in policies[0].parameters()])
        )
        assert not isinstance(reference.lm.model.layers[0].forward, functools.partial)
    (acting_a, stats_a, params_a), (acting_b, stats_b, params_b) = results
    assert acting_a == acting_b  # no grad while acting: nothing recomputed
    for a, b in zip(params_a, params_b, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    for key in ("ppo/loss_policy", "ppo/loss_value", "ppo/entropy", "objective/kl"):
        assert stats_a[key] == pytest.approx(stats_b[key], rel=1e-6, abs=1e-8), key
    assert copy.deepcopy(agent.model) is not None  # a wrapped policy still copies (export)


def test_activation_checkpointing_wraps_a_shared_lora_base_once(tiny_tokenizer, tiny_lm):
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    policies, _ = build_policies(tiny_lm, 2, lora, activation_checkpointing=True)
    for layer in tiny_lm.model.layers:  # wrapped once, though both agents' policies asked
        assert isinstance(layer.forward, functools.partial)
        assert not isinstance(layer.forward.args[0], functools.partial)
    calls = _layer_calls(tiny_lm)
    ids = torch.tensor([[3, 4, 5, 6]])
    mask, pos = torch.ones_like(ids), torch.arange(4)[None]
    logits, values, _ = policies[1](ids, mask, pos, keep=2)
    assert calls[0] == 2
    (logits.sum() + values.sum()).backward()
    assert calls[0] == 4  # each layer replayed once in the backward
    assert any(p.grad is not None for p in policies[1].trainable_parameters())


def test_activation_checkpointing_refuses_a_model_without_checkpointable_layers():
    from cory_rl.agents.speedups import recompute_activations

    with pytest.raises(ValueError, match="activation_checkpointing"):
        recompute_activations(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def gradients_held_at_each_step(params: list[torch.nn.Parameter]) -> list[int]:
    """A list that gets, each time one of ``params`` completes its gradient (after the
    agent's own hook, registered first), how many of them hold a gradient then."""
    held: list[int] = []

    def count_held(_):
        held.append(sum(q.grad is not None for q in params))

    for p in params:
        p.register_post_accumulate_grad_hook(count_held)
    return held


def test_a_one_chunk_mini_batch_steps_each_parameter_inside_the_backward(tiny_tokenizer):
    """With nothing to accumulate, Adam steps each parameter as its gradient completes and
    frees it: the same update as the plain step, without ever holding every gradient."""
    game = cory_env.batched_game(
        target_task(tiny_tokenizer), batch_size=8, n_agents=1, tokenizer=tiny_tokenizer
    )
    results = []
    for clip in (None, 1e9):  # a clip that never clips forces the plain step
        cfg = PPOConfig(mini_batch_size=4, ppo_epochs=2, learning_rate=1e-2, max_grad_norm=clip)
        agent = make_agents(tiny_tokenizer, make_tiny_lm(len(tiny_tokenizer)), 1, cfg)["llm_0"]
        assert agent.optimisation.steps_in_backward(cfg) == (clip is None)
        params = agent.model.trainable_parameters()
        held = gradients_held_at_each_step(params)
        game.reset(seed=0)
        play_batch(game, {"llm_0": agent})
        stats = agent.learn()
        assert len(held) == 2 * 2 * len(params)  # every parameter, every backward
        assert max(held) <= (1 if clip is None else len(params))
        state = agent.optimizer.state_dict()["state"]
        assert len(state) == len(params) and all(int(s["step"]) == 4 for s in state.values())
        results.append((stats, [p.detach().clone() for p in params]))
    (stats_a, params_a), (stats_b, params_b) = results
    for a, b in zip(params_a, params_b, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    for key in ("ppo/loss_policy", "ppo/loss_value", "ppo/entropy"):
        assert stats_a[key] == pytest.approx(stats_b[key], rel=1e-6, abs=1e-8), key


def test_an_agent_s_optimiser_goes_with_it_while_a_weight_lives_on(tiny_tokenizer):
    """A weight held elsewhere (here a view of it) must not keep the agent's optimiser and
    Adam's moments alive: a sweep trains run after run in one process."""
    game = cory_env.batched_game(
        target_task(tiny_tokenizer), batch_size=8, n_agents=1, tokenizer=tiny_tokenizer
    )
    cfg = PPOConfig(mini_batch_size=4, ppo_epochs=1)
    agent = make_agents(tiny_tokenizer, make_tiny_lm(len(tiny_tokenizer)), 1, cfg)["llm_0"]
    assert agent.optimisation.steps_in_backward(cfg)
    game.reset(seed=0)
    play_batch(game, {"llm_0": agent})
    agent.learn()
    optimizer = weakref.ref(agent.optimisation.step_in_backward.torch_optimizer)
    assert optimizer().state  # Adam's moments exist
    weight_view = agent.model.trainable_parameters()[0].view(-1)
    del agent, game
    gc.collect()
    assert optimizer() is None
    assert weight_view.numel() > 0


@pytest.mark.parametrize("name", ["reinforce", "rloo", "grpo"])
def test_critic_free_learners_step_inside_the_backward_too(tiny_tokenizer, name):
    """The one update (agents/update.py) serves every learner: a one-chunk mini-batch of a
    critic-free learner steps in the backward too, for the plain step's parameters."""
    from cory_rl.agents.group import GRPOAgent, GRPOConfig, RLOOAgent, RLOOConfig
    from cory_rl.agents.reinforce import ReinforceAgent, ReinforceConfig

    cls, config = {
        "reinforce": (ReinforceAgent, ReinforceConfig),
        "rloo": (RLOOAgent, RLOOConfig),
        "grpo": (GRPOAgent, GRPOConfig),
    }[name]
    extra = {} if cls is ReinforceAgent else {"group_size": 2}
    game = cory_env.batched_game(
        target_task(tiny_tokenizer),
        batch_size=8,
        n_agents=1,
        tokenizer=tiny_tokenizer,
        group_size=2,
    )
    params_after = []
    for clip in (None, 1e9):
        cfg = config(mini_batch_size=4, learning_rate=1e-2, max_grad_norm=clip)
        [policy], reference = build_policies(make_tiny_lm(len(tiny_tokenizer)), 1)
        agent = cls(policy, reference, cfg, tiny_tokenizer.pad_token_id, seed=0, **extra)
        assert agent.optimisation.steps_in_backward(cfg) == (clip is None)
        params = agent.model.trainable_parameters()
        held = gradients_held_at_each_step(params)
        game.reset(seed=0)
        play_batch(game, {"llm_0": agent})
        agent.learn()
        # Stepping in the backward frees each gradient at once; the plain step holds them all.
        assert held and max(held) == (0 if clip is None else len(params))
        params_after.append([p.detach().clone() for p in params])
    for a, b in zip(*params_after, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_fused_lora_layers_compute_peft_s_sum_and_gradients(tiny_tokenizer, monkeypatch):
    """One addmm per adapted layer gives peft's output and adapter gradients; the
    reference (adapters disabled) still takes peft's own path, unchanged."""
    import copy

    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora.layer import Linear as LoraLinear

    from cory_rl.agents.speedups import fuse_lora_sums

    lora = LoraConfig(r=3, lora_alpha=7, target_modules="all-linear", lora_dropout=0.0)
    base = make_tiny_lm(len(tiny_tokenizer))
    models = []
    for fuse in (False, True):
        torch.manual_seed(1)
        lm = get_peft_model(copy.deepcopy(base), lora, adapter_name="agent")
        for name, p in lm.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)  # peft starts B at zero: make the sum matter
        if fuse:
            assert fuse_lora_sums(lm) == 2 * 7  # every linear of both layers
        models.append(lm)
    peft_calls = [0]
    original = LoraLinear.forward

    def counted(*args, **kwargs):
        peft_calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(LoraLinear, "forward", counted)
    ids = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 3, 4, 2]])
    outputs = []
    for lm in models:
        peft_calls[0] = 0
        logits = lm(input_ids=ids).logits
        logits.square().mean().backward()
        grads = [p.grad for n, p in lm.named_parameters() if "lora_" in n]
        with lm.disable_adapter(), torch.no_grad():
            reference = lm(input_ids=ids).logits
        outputs.append((logits.detach(), grads, reference, peft_calls[0]))
    (logits_a, grads_a, ref_a, calls_a), (logits_b, grads_b, ref_b, calls_b) = outputs
    assert calls_a == 2 * 14 and calls_b == 14  # fused: peft's path only for the reference
    torch.testing.assert_close(logits_b, logits_a, rtol=1e-5, atol=1e-6)
    assert not torch.equal(logits_a, ref_a)  # the adapters do change the output
    assert torch.equal(ref_b, ref_a)
    assert len(grads_a) == len(grads_b) == 28
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
