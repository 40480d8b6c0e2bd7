"""The errors of plug-ins: each is caused by the caller's input, and the service turns each into a
clear 4xx (`grpo_service/errors.py`). Plain exceptions: nothing here imports FastAPI."""

from __future__ import annotations

from pydantic import ValidationError


class PluginError(Exception):
    """Base class of errors caused by the caller's input to a plug-in."""


class InvalidAction(PluginError):
    """An action (or tool call) the environment does not understand. No step was taken."""


class InvalidConfig(PluginError):
    """A config the environment or policy rejects."""


class InvalidState(PluginError):
    """A serialized state that cannot be restored (wrong version, corrupt, foreign)."""


class EpisodeOver(PluginError):
    """A step was asked of an environment whose episode has ended; reset it first."""


class UnknownPlugin(PluginError):
    """No environment or policy is registered under that name."""


class EnvBusy(PluginError):
    """A shared resource the environment needs (e.g. a simulator process) stayed busy past its
    deadline; retrying later can succeed."""


def validation_problems(exc: ValidationError) -> str:
    """A validation error's locations and messages, never its input values (they could hold secrets)."""
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_input=False))
