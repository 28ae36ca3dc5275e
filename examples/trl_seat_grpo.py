"""TRL's own ``GRPOTrainer`` trains one seat of the CORY game; the other seat is a partner
inside the environment, and every completion is paid what the game pays the seat.

The game is the turn-level face of the token-level game (``cory_env.turn_game``): the
dataset holds the seat's prompts (after the partner's answer where the seat observes), and
the reward function plays each completion as the seat's answer in its recorded game, lets
the partner answer after it where the seat leads, and pays ``r_self + lam * r_other``
(CORY's collective reward at ``--lam 1``; ``--reward score``: the seat's own score).

    python examples/trl_seat_grpo.py --smoke                 # one GRPO step, seconds to a minute
    python examples/trl_seat_grpo.py --steps 50 --out runs/trl-seat
    python examples/trl_seat_grpo.py --alternate 2 --out runs/trl-alt   # two policies in turn
    python examples/trl_seat_grpo.py --partner runs/cory:llm_0 --model runs/cory:llm_1

``--model`` and ``--partner`` take a model name or folder (``embedded``: the embedded default
model) or ``RUN:llm_k``, an agent of a run of ``cory-train`` (exported into ``--out`` first).

What TRL can do here: train one policy per trainer, against partners that stay fixed during
the run; with role exchange on (the default), that one seat leads in half the prompts and
observes in the other half. What it cannot: update two policies together in one run (CORY
trains both agents in every iteration; use ``cory-train`` for that). ``--alternate N`` runs
TRL N times per seat, in turn: ``llm_0`` trains against ``llm_1``'s latest model, then
``llm_1`` against the ``llm_0`` just trained, and so on: block-coordinate training of the
two policies, each run from the other's latest saved model (each run's output folder).
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import cory_env
from cory_env.partners import fixed_partner, model_partner
from cory_env.seat_reward import SeatReward, seat_prompts


def grpo_config(args: argparse.Namespace, output_dir: Path) -> Any:
    """GRPOConfig for CPU: a completion's length is the game's token budget."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(output_dir),
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
        seed=args.seed,
        max_steps=args.steps,
        learning_rate=args.learning_rate,
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        num_generations=args.num_generations,
        max_completion_length=args.budget,
        temperature=1.0,
        beta=args.beta,
    )


def resolve_model(spec: str, scratch: Path) -> str:
    """A model name or folder as given; ``RUN:llm_k`` (a run folder of ``cory-train`` and a
    seat) is that run's agent, exported into ``scratch`` first (as ``cory-export`` does)."""
    run, sep, agent = spec.rpartition(":")
    if not (sep and run and (Path(run) / "config.yaml").is_file()):
        return spec
    from cory_rl.train.publish.export import export_run

    out = scratch / f"exported-{Path(run).resolve().name}"
    if not (out / agent).is_dir():
        exported = export_run(Path(run), out, overwrite=out.exists())
        if agent not in exported:
            raise SystemExit(f"run {run} has no agent {agent!r}; it has {sorted(exported)}")
    return str(out / agent)


def train_seat(args: argparse.Namespace, seat: str, policy: str, partner_spec: str, out: Path):
    """One TRL run: ``seat`` played by ``policy`` (a model name or folder), the other seat by
    ``partner_spec`` (a model, or ``fixed:TEXT``). Saves the trained model into ``out``."""
    from datasets import Dataset
    from trl import GRPOTrainer

    policy = resolve_model(policy, args.out)
    if not partner_spec.startswith("fixed:"):
        partner_spec = resolve_model(partner_spec, args.out)
    tokenizer = copy.deepcopy(cory_env.load_tokenizer(policy))
    tokenizer.padding_side = "left"  # TRL generates from left-padded prompts
    partner = (
        fixed_partner(partner_spec[len("fixed:") :])
        if partner_spec.startswith("fixed:")
        else model_partner(partner_spec, max_new_tokens=args.budget)
    )
    settings = {
        "n_agents": 2,
        "lam": args.lam,
        "max_new_tokens": args.budget,
        "role_exchange_period": args.role_exchange_period,
    }

    def make_game() -> cory_env.BatchedTextGame:
        return cory_env.batched_game(args.task, batch_size=1, tokenizer=tokenizer, **settings)

    n_prompts = args.steps * args.prompts_per_step
    rows = seat_prompts(make_game, seat, partner, n=n_prompts, seed=args.seed)
    reward = SeatReward(make_game, seat, partner, reward=args.reward)
    trainer = GRPOTrainer(
        model=cory_env.load_causal_lm(policy),
        reward_funcs=reward,
        args=grpo_config(args, out),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    trainer.train()
    trainer.save_model(str(out))
    tokenizer.save_pretrained(str(out))
    rewards = [
        h[f"rewards/{reward.__name__}/mean"]
        for h in trainer.state.log_history
        if f"rewards/{reward.__name__}/mean" in h
    ]
    print(f"{seat}: {args.steps} GRPO steps, mean reward per step {rewards}; saved {out}")
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="imdb")
    parser.add_argument("--seat", default="llm_1", help="the seat TRL trains (not --alternate)")
    parser.add_argument(
        "--model", default="embedded", help="the policy to train: a name, folder or RUN:llm_k"
    )
    parser.add_argument(
        "--partner",
        default="embedded",
        help="a name, folder, RUN:llm_k (a run's agent) or fixed:TEXT",
    )
    parser.add_argument("--lam", type=float, default=1.0, help="1: CORY's collective reward")
    parser.add_argument("--reward", choices=["game", "score"], default="game")
    parser.add_argument("--role_exchange_period", type=int, default=1)
    parser.add_argument("--budget", type=int, default=16, help="tokens per answer")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts_per_step", type=int, default=4)
    parser.add_argument("--num_generations", type=int, default=4)
    parser.add_argument("--learning_rate", type=float, default=1e-6)
    parser.add_argument("--beta", type=float, default=0.04, help="GRPO's KL coefficient")
    parser.add_argument("--alternate", type=int, default=0, help="N runs per seat, in turn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/trl-seat"))
    parser.add_argument("--smoke", action="store_true", help="one tiny step (a quick check)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.prompts_per_step, args.num_generations, args.budget = 1, 1, 2, 6
    return args


def main(argv: list[str] | None = None) -> list[Path]:
    args = parse(argv)
    if not args.alternate:
        return [train_seat(args, args.seat, args.model, args.partner, args.out)]
    latest = {"llm_0": args.model, "llm_1": args.partner}  # each seat's latest model
    saved = []
    for turn in range(args.alternate):
        for seat, other in (("llm_0", "llm_1"), ("llm_1", "llm_0")):
            out = args.out / f"{turn}-{seat}"
            latest[seat] = str(train_seat(args, seat, latest[seat], latest[other], out))
            saved.append(out)
    return saved


if __name__ == "__main__":
    main()
