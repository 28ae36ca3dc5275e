"""The errors a command prints as one line: the user's own mistakes.

A setting, a data file, a reward function or server, a checkpoint, a run folder: each
error names what was wrong and what to do (``cory_env.checks.UserError`` and the file
errors), so the commands print it alone. An error inside the library keeps its traceback.
"""

from __future__ import annotations

from cory_env.checks import UserError

USER_ERRORS: tuple[type[BaseException], ...] = (
    UserError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,  # a folder where a file of the user's should be
    PermissionError,  # a path of the user's that this user cannot read or write
)


def one_line(err: BaseException) -> str:
    """The error's message on one line (a message quoting a library's may hold several)."""
    return "error: " + " ".join(str(err).split())
