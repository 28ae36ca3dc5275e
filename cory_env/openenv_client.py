"""The client a trainer uses to play one seat of a served game (:mod:`cory_env.openenv_server`).

It is an OpenEnv ``EnvClient`` (WebSocket session, async by default; ``.sync()`` gives a
synchronous one)::

    with CoryTurnClient(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(seat="llm_1", partners={"llm_0": "embedded"}, seed=0)
        while not result.done:
            result = env.step(TurnAction(answer=my_policy(result.observation.prompt)))
        result.reward   # what the seat was paid for its last answer

A refused request raises ``RuntimeError("Server error: ...")`` with the server's reason;
the session stays open.
"""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from cory_env.openenv_server import TurnAction, TurnObservation, TurnState


class CoryTurnClient(EnvClient[TurnAction, TurnObservation, TurnState]):
    """One session with the served game: ``reset(seat=, partners=, seed=, episode=,
    reward=)``, then ``step(TurnAction(answer=...))`` until ``done``."""

    def _step_payload(self, action: TurnAction | str) -> dict[str, Any]:
        if isinstance(action, str):  # a bare answer is welcome too
            action = TurnAction(answer=action)
        return action.model_dump(exclude_none=True)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[TurnObservation]:
        fields = {**payload.get("observation", {})}
        fields["reward"], fields["done"] = payload.get("reward"), payload.get("done", False)
        return StepResult(
            observation=TurnObservation(**fields),
            reward=payload.get("reward"),
            done=bool(payload.get("done", False)),
            metadata=payload.get("metadata"),
        )

    def _parse_state(self, payload: dict[str, Any]) -> TurnState:
        return TurnState(**payload)
