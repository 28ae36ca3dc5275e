"""Publishing exported agents on the Hugging Face Hub (``export.py --push_to_hub REPO``).

Everything the upload needs is checked before anything is exported: the hub is not
switched off (``HF_HUB_OFFLINE``), a token exists (``HF_TOKEN`` or ``hf auth login``) and
the hub answers for it. One agent goes to ``REPO``; several go to ``REPO-<agent>`` (a
model repository loads one model from its root). Each folder is uploaded as exported,
with its model card as the repository's README.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cory_env.checks import SettingError


def repo_ids(repo: str, agents: list[str]) -> dict[str, str]:
    """The repository each agent is pushed to."""
    if "/" not in repo or repo.count("/") > 1 or repo.startswith("/") or repo.endswith("/"):
        raise SettingError(
            f"--push_to_hub {repo!r}: give a repository id as OWNER/NAME (e.g. you/cory-imdb)"
        )
    if len(agents) == 1:
        return {agents[0]: repo}
    return {agent: f"{repo}-{agent}" for agent in agents}


def check_hub(api: Any = None) -> Any:
    """The ``HfApi`` to push with, once it is known to work here; else one line saying
    what to set. Called before any model loads or any file is written."""
    from huggingface_hub import HfApi, constants, get_token

    if constants.HF_HUB_OFFLINE:
        raise SettingError(
            "--push_to_hub: the hub is switched off here (HF_HUB_OFFLINE=1); export without "
            "--push_to_hub and upload the folders from a machine with a hub"
        )
    if get_token() is None:
        raise SettingError(
            "--push_to_hub: no Hugging Face token; set HF_TOKEN or run `hf auth login`"
        )
    api = api or HfApi()
    try:
        api.whoami()
    except Exception as err:  # offline, a bad token, a proxy: say which, in one line
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SettingError(
            f"--push_to_hub: the hub does not answer for this token ({reason[:160]}); check "
            "the network and HF_TOKEN, or export without --push_to_hub"
        ) from None
    return api


def push_folders(
    api: Any, folders: dict[str, Path], repos: dict[str, str], private: bool
) -> dict[str, str]:
    """Create each repository (kept if it exists) and upload the agent's folder to it."""
    urls = {}
    for agent, folder in folders.items():
        repo = repos[agent]
        api.create_repo(repo, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(
            repo_id=repo,
            folder_path=str(folder),
            repo_type="model",
            commit_message=f"{agent}, exported by cory",
        )
        urls[agent] = f"https://huggingface.co/{repo}"
        print(f"{agent} -> {urls[agent]}")
    return urls
