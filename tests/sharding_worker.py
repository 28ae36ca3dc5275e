"""One seeded update, in one process or in each process of an FSDP2 launch (tests/test_sharding.py).

Every process plays the same batch (the same game seed and sampling streams), so the
sharded update averages identical gradients and must equal the one-process update. The
main process writes each learner's statistics and full weights after the update.

    python tests/sharding_worker.py CONFIG.yaml OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from safetensors.torch import save_file

from cory_rl.agents.sharding import full_tensors
from cory_rl.train.config.resolve import build_config
from cory_rl.train.core.build import build_game_and_learners, make_accelerator
from cory_rl.train.core.distributed import Processes
from cory_rl.train.training.loop import play_batch


def seeded_update(config_file: str, out: Path) -> None:
    config = build_config(config_file=config_file)
    accelerator = make_accelerator(config)
    game, learners = build_game_and_learners(config, accelerator)
    for i, learner in enumerate(learners.values()):  # the same streams on every process
        learner.sampler.generator.manual_seed(100 + i)
        learner.optimisation.shuffle_generator.manual_seed(200 + i)
    game.reset(seed=11)
    play_batch(game, learners)
    before = {a: full_tensors(one.model.policy_state_dict()) for a, one in learners.items()}
    before = {a: {k: t.clone() for k, t in state.items()} for a, state in before.items()}
    stats = {agent: learner.learn() for agent, learner in learners.items()}
    weights = {a: full_tensors(one.model.policy_state_dict()) for a, one in learners.items()}
    moved = {
        a: max(float((weights[a][k] - t).abs().max()) for k, t in before[a].items()) for a in before
    }
    processes = Processes(accelerator)
    if processes.is_main:
        out.mkdir(parents=True, exist_ok=True)
        sharded = {agent: learner.sharding is not None for agent, learner in learners.items()}
        record = {"stats": stats, "sharded": sharded, "moved": moved}
        (out / "stats.json").write_text(json.dumps(record))
        for agent, state in weights.items():
            save_file(
                {k: v.contiguous() for k, v in state.items()}, str(out / f"{agent}.safetensors")
            )
    processes.wait()


if __name__ == "__main__":
    seeded_update(sys.argv[1], Path(sys.argv[2]))
