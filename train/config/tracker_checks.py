"""What each tracker of ``--report_to`` needs, checked and settled before any model loads.

A leaf beside the config (which checks ``report_to`` with it);
``cory_rl.train.training.trackers`` reports.
"""

from __future__ import annotations

import importlib.util
import netrc
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from cory_env import checks

REPORT_TO = ("tensorboard", "wandb", "mlflow", "trackio", "none")


PACKAGES = {"wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}
"""The package each tracker needs (``pip install <package>``)."""


def check_report_to(report_to: Any) -> None:
    """A list of known trackers, ``none`` alone; a tracker whose package is missing is
    refused with the package to install, before any model loads."""
    if not isinstance(report_to, list) or not report_to:
        raise checks.fail("report_to", "a list of trackers such as [tensorboard, wandb]", report_to)
    for name in report_to:
        checks.choice(name, "report_to", REPORT_TO)
    if "none" in report_to and len(report_to) > 1:
        raise checks.fail("report_to", "'none' alone or a list of trackers", report_to)
    for name in report_to:
        package = PACKAGES.get(name)
        if package is not None and importlib.util.find_spec(package) is None:
            raise checks.SettingError(
                f"report_to: {name} is not installed; pip install {package} (or drop {name})"
            )


def wandb_has_key() -> bool:
    """Whether W&B can log in without a prompt: ``WANDB_API_KEY``, or the host's entry in
    the netrc file ``wandb login`` writes (``NETRC`` or ``~/.netrc``)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def prepare_trackers(report_to: list[str], run_path: Path) -> list[str]:
    """What each tracker needs, settled before any model loads; returns the notes to print.

    W&B with no API key would stop the run after setup with wandb's traceback ("No API key
    configured"); it logs offline instead (``WANDB_MODE=offline``), into the run folder, to
    be sent later with ``wandb sync``. An explicit ``WANDB_MODE`` is left as it is."""
    notes = []
    if "wandb" in report_to and not os.environ.get("WANDB_MODE") and not wandb_has_key():
        os.environ["WANDB_MODE"] = "offline"
        notes.append(
            f"report_to wandb: no W&B API key (WANDB_API_KEY or `wandb login`), so W&B logs "
            f"offline into {Path(run_path) / 'wandb'}; send it later with `wandb sync "
            f"{Path(run_path) / 'wandb'}/offline-run-*`"
        )
    return notes
