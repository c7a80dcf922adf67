"""The errors a ``vla-accel`` command reports in one line (``<command>: error: ...``, exit status 2)
instead of a traceback: the problems a user can fix or has to know about, as opposed to a bug.

- ValueError: a bad setting or flag value, or a checkpoint, bag, data set, URDF or parameter file
  that is missing, truncated or of the wrong kind (the package's ConfigError, CheckpointError,
  BagError and DatasetError are ValueErrors, and so is a node's refusal to start);
- OSError: a file that cannot be read or written;
- :class:`RunFailed`: a run that could not finish (a node process that exited or never came up, a
  replay past its time limit); the message names the log to read.
"""

from __future__ import annotations


class RunFailed(RuntimeError):
    """A run could not finish: a node process exited or never came up, or a time limit passed."""


USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, RunFailed)


class SettingError(ValueError):
    """A problem the user fixes with a setting, named in the message by its node parameter
    (``unnorm_key``, ``image_topics``), as the node shows it; a command shows each of ``settings``
    as its flag instead (``vla_accel_ros/cli.py``: ``--unnorm-key``, ``--cameras``)."""

    def __init__(self, message: str, *settings: str) -> None:
        super().__init__(message)
        self.settings = settings

