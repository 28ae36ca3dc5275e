"""Exported agents load with transformers alone and compute the policy's own logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from cory_rl.train.commands.export import main
from cory_rl.train.core.build import build_game_and_learners
from cory_rl.train.core.checkpoint import find_checkpoint
from cory_rl.train.publish.export import export_run
from cory_rl.train.training.run import run_training
from tests.conftest import tiny_config

IDS = torch.tensor([[2, 3, 4, 5, 6, 7]])


def trained_policy(config, run_path, agent):
    """The run's agent, rebuilt from its checkpoint as training would resume it."""
    game, learners = build_game_and_learners(config)
    learners[agent].load(find_checkpoint(run_path) / agent)
    return learners[agent].model


def policy_logits(policy):
    mask = torch.ones_like(IDS)
    positions = torch.arange(IDS.shape[1])[None]
    with torch.no_grad():
        logits, values, _ = policy(IDS, mask, positions)
    return logits, values


@pytest.mark.parametrize("lora", [False, True])
def test_exported_agents_reload_with_transformers_alone(tiny_model_dir, tmp_path, lora):
    overrides = {"lora": True, "lora_target_modules": ["q_proj", "v_proj"]} if lora else {}
    config = tiny_config(tiny_model_dir, tmp_path / "run", iterations=2, **overrides)
    run_training(config)
    exported = export_run(tmp_path / "run", tmp_path / "out")
    assert set(exported) == {"llm_0", "llm_1"}
    for agent in ("llm_0", "llm_1"):
        policy = trained_policy(config, tmp_path / "run", agent)
        expected, values = policy_logits(policy)
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / agent).eval()
        with torch.no_grad():
            got = model(IDS).logits
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert AutoTokenizer.from_pretrained(tmp_path / "out" / agent).pad_token == "<pad>"
        head = load_file(str(tmp_path / "out" / agent / "value_head.safetensors"))
        torch.testing.assert_close(head["weight"], policy.value_head.weight.detach())
        if lora:
            assert (tmp_path / "out" / agent / "adapter_config.json").exists()
    # The policy moved away from the base: the export is not just the base model.
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        assert not torch.allclose(base(IDS).logits, expected, atol=1e-6)
    if lora:
        main([str(tmp_path / "run"), str(tmp_path / "merged"), "--merge"])
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged" / "llm_1").eval()
        assert not (tmp_path / "merged" / "llm_1" / "adapter_config.json").exists()
        with torch.no_grad():
            torch.testing.assert_close(merged(IDS).logits, expected, rtol=1e-4, atol=1e-4)


def test_an_elastic_reset_run_exports_its_online_policy(tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, tmp_path / "run", "elastic_reset", iterations=2)
    run_training(config)
    assert set(export_run(tmp_path / "run", tmp_path / "out")) == {"llm_0"}
    game, learners = build_game_and_learners(config)
    learners["llm_0"].load(find_checkpoint(tmp_path / "run") / "llm_0")
    expected, _ = policy_logits(learners["llm_0"].agent.model)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "llm_0").eval()
    with torch.no_grad():
        torch.testing.assert_close(model(IDS).logits, expected, rtol=1e-5, atol=1e-5)


def test_export_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path), str(tmp_path / "out")])
    assert "not a run folder" in capsys.readouterr().err


def test_each_export_carries_a_model_card_the_hub_reads(tiny_model_dir, tmp_path):
    """README.md with the Hub's metadata header: base model, library, tags; the body says
    the seat, the roles played, the settings, the held-out evaluation and how to load."""
    from huggingface_hub import ModelCard

    config = tiny_config(
        tiny_model_dir, tmp_path / "run", iterations=3, eval_every=2, eval_queries=3, eval_samples=1
    )
    run_training(config)
    export_run(tmp_path / "run", tmp_path / "out")
    for agent in ("llm_0", "llm_1"):
        card = ModelCard.load(tmp_path / "out" / agent / "README.md")
        meta = card.data.to_dict()
        assert meta["base_model"] == tiny_model_dir and meta["library_name"] == "transformers"
        assert {"cory", "reinforcement-learning", "ppo"} <= set(meta["tags"])
        text = " ".join(card.text.split())  # the prose is wrapped
        assert f"Seat `{agent}` of a 2-agent text game trained with `cory`" in text
        # role_exchange_period 1 over 3 iterations: llm_0 is pioneer twice, llm_1 once.
        played = (
            "pioneer for 2 iterations, observer for 1 iteration"
            if agent == "llm_0"
            else ("observer for 2 iterations, pioneer for 1 iteration")
        )
        assert played in text, text
        assert "after 3 updates" in text and "| this agent | pioneer |" in text
        assert "| base model | pioneer |" in text and "| `lam` | `1.0` |" in text
        assert "value_head.safetensors" in text and "from_pretrained" in text


def test_a_card_without_an_evaluation_says_so(tiny_model_dir, tmp_path):
    from huggingface_hub import ModelCard

    run_training(tiny_config(tiny_model_dir, tmp_path / "run", "ppo", iterations=2))
    export_run(tmp_path / "run", tmp_path / "out")
    card = ModelCard.load(tmp_path / "out" / "llm_0" / "README.md")
    text = " ".join(card.text.split())
    assert "pioneer for 2 iterations" in text and "roles exchange" not in text
    assert "was not evaluated on held-out queries" in text


# ---------------------------------------------------------------- --push_to_hub


class FakeHub:
    """What ``export.py --push_to_hub`` asks of ``huggingface_hub.HfApi``, recorded."""

    def __init__(self):
        self.calls = []

    def create_repo(self, repo, **kwargs):
        self.calls.append(("create_repo", repo, kwargs))

    def upload_folder(self, **kwargs):
        files = sorted(p.name for p in Path(kwargs["folder_path"]).iterdir())
        self.calls.append(("upload_folder", kwargs["repo_id"], files))


def test_push_to_hub_uploads_each_agent_with_its_card(tiny_model_dir, tmp_path, monkeypatch):
    from cory_rl.train.publish import hub

    run_training(tiny_config(tiny_model_dir, tmp_path / "run", iterations=1))
    fake = FakeHub()
    monkeypatch.setattr(hub, "check_hub", lambda: fake)
    main([str(tmp_path / "run"), str(tmp_path / "out"), "--push_to_hub", "you/cory", "--private"])
    creates = [c for c in fake.calls if c[0] == "create_repo"]
    uploads = {c[1]: c[2] for c in fake.calls if c[0] == "upload_folder"}
    assert [(c[1], c[2]["private"]) for c in creates] == [
        ("you/cory-llm_0", True),
        ("you/cory-llm_1", True),
    ]
    assert set(uploads) == {"you/cory-llm_0", "you/cory-llm_1"}
    assert {"README.md", "config.json", "value_head.safetensors"} <= set(uploads["you/cory-llm_0"])
    assert hub.repo_ids("you/one", ["llm_0"]) == {"llm_0": "you/one"}


def test_push_to_hub_is_refused_before_anything_is_written(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    import huggingface_hub

    from cory_rl.train.publish import hub

    run_training(tiny_config(tiny_model_dir, tmp_path / "run", iterations=1))
    out = tmp_path / "out"
    push = [str(tmp_path / "run"), str(out), "--push_to_hub"]
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SystemExit):
        main([*push, "you/cory"])
    assert "HF_HUB_OFFLINE=1" in capsys.readouterr().err and not out.exists()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(SystemExit):
        main([*push, "you/cory"])
    assert "no Hugging Face token; set HF_TOKEN" in capsys.readouterr().err and not out.exists()
    with pytest.raises(SystemExit):
        main([*push, "cory"])
    assert "OWNER/NAME" in capsys.readouterr().err and not out.exists()
    with pytest.raises(SystemExit):
        main([str(tmp_path / "run"), str(out), "--private"])
    assert "--private applies to --push_to_hub" in capsys.readouterr().err

    class Unreachable:
        def whoami(self):
            raise ConnectionError("Failed to resolve 'huggingface.co'\nmore detail")

    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_x")
    with pytest.raises(hub.SettingError, match="does not answer for this token .Failed to resolve"):
        hub.check_hub(Unreachable())
