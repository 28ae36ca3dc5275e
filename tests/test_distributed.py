"""Data-parallel training under ``accelerate launch``: 2 CPU processes (gloo), tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cory_rl.train.core.distributed import PROCESS_SEED_STRIDE
from cory_rl.train.training.run import run_training
from tests.conftest import read_jsonl, tiny_config

ROOT = Path(__file__).resolve().parents[1]

# Trains through the real path on every process, then writes a fingerprint of every
# agent's parameters per process, so the test can compare processes.
WORKER = """
import hashlib, json, sys
from pathlib import Path
from cory_rl.train.config.resolve import build_config
from cory_rl.train.commands.train_flags import parse_args
from cory_rl.train.core.distributed import Processes
from cory_rl.train.training.loop import train
from cory_rl.train.core.build import build_game_and_learners, make_accelerator

config_file, out, resume = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "resume"
if resume:
    config, _ = parse_args(["--resume", str(Path(config_file).parent), "--iterations", "3"])
else:
    config = build_config(config_file=config_file)
accelerator = make_accelerator(config)
processes = Processes(accelerator)
game, learners = build_game_and_learners(config, accelerator)
train(config, learners, game, Path(config.run_dir), resume, processes)
prints = {}
for agent, learner in learners.items():
    digest = hashlib.sha256()
    for name, tensor in sorted(learner.model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().cpu().numpy().tobytes())
    prints[agent] = digest.hexdigest()
(out / f"params_{processes.index}.json").write_text(json.dumps(prints))
"""


def launch(config_file: Path, out: Path, mode: str) -> None:
    script = out / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    config = ROOT / "train" / "configs" / "multi_cpu.yaml"  # the config the README ships
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(config),
        str(script),
        str(config_file),
        str(out),
        mode,
    ]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.slow
def test_two_processes_train_one_model_on_both_processes_games(tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, tmp_path / "run", iterations=2, checkpoint_every=1)
    config_file = tmp_path / "config.yaml"
    config.save(config_file)
    launch(config_file, tmp_path, "train")
    first = [json.loads((tmp_path / f"params_{p}.json").read_text()) for p in (0, 1)]
    assert first[0] == first[1], "the processes' parameters differ after training"
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [0, 1] and rows[0]["games"] == 2 * config.batch_size
    # Iteration 0 comes before any update: process p played exactly the games of a one-process
    # run seeded seed + p * stride, so the logged mean must be the mean of those two runs.
    singles = []
    for p in (0, 1):
        seed = config.seed + p * PROCESS_SEED_STRIDE
        single = tiny_config(tiny_model_dir, tmp_path / f"single{p}", iterations=1, seed=seed)
        singles.append(read_jsonl(run_training(single).path / "metrics.jsonl")[0])
    for key in ("llm_0/score", "llm_1/score"):
        expected = (singles[0][key] + singles[1][key]) / 2
        assert rows[0][key] == pytest.approx(expected, abs=1e-9), key
    assert singles[0]["llm_0/score"] != singles[1]["llm_0/score"], "processes played one game"
    # Only the main process wrote; --resume continues on both processes.
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["iterations"] == 2
    launch(tmp_path / "run" / "config.yaml", tmp_path, "resume")
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    after = [json.loads((tmp_path / f"params_{p}.json").read_text()) for p in (0, 1)]
    assert after[0] == after[1] and after[0] != first[0]


@pytest.mark.slow
def test_a_model_with_tied_embeddings_trains_data_parallel(tmp_path):
    """The embedded model ties its embedding to the LM head, whose gradient one process
    takes as sparse rows; DDP reduces dense gradients only, so under DDP it stays dense."""
    from tests.conftest import make_tiny_lm, make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer()
    lm = make_tiny_lm(len(tokenizer))
    lm.config.tie_word_embeddings = True
    lm.tie_weights()
    assert lm.get_input_embeddings().weight is lm.get_output_embeddings().weight
    lm.save_pretrained(tmp_path / "tied")
    tokenizer.save_pretrained(tmp_path / "tied")
    config = tiny_config(str(tmp_path / "tied"), tmp_path / "run", iterations=1)
    config_file = tmp_path / "config.yaml"
    config.save(config_file)
    launch(config_file, tmp_path, "train")
    first = [json.loads((tmp_path / f"params_{p}.json").read_text()) for p in (0, 1)]
    assert first[0] == first[1]
