"""AgentGym's 40 BabyAI levels and its task numbering: task ``data_idx`` plays level
``LEVELS[data_idx % 40]`` (AgentGym's ``all_levels[data_idx % 40 + 1]``) reset with seed ``data_idx // 40``.
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any

log = logging.getLogger(__name__)

LEVELS: tuple[str, ...] = (
    "BabyAI-GoToRedBallGrey-v0",
    "BabyAI-GoToRedBall-v0",
    "BabyAI-GoToRedBallNoDists-v0",
    "BabyAI-GoToObjS6-v0",
    "BabyAI-GoToLocalS8N7-v0",
    "BabyAI-GoToObjMazeS7-v0",
    "BabyAI-GoToImpUnlock-v0",
    "BabyAI-GoToSeqS5R2-v0",
    "BabyAI-GoToRedBlueBall-v0",
    "BabyAI-GoToDoor-v0",
    "BabyAI-GoToObjDoor-v0",
    "BabyAI-Open-v0",
    "BabyAI-OpenRedDoor-v0",
    "BabyAI-OpenDoorLoc-v0",
    "BabyAI-OpenRedBlueDoorsDebug-v0",
    "BabyAI-OpenDoorsOrderN4Debug-v0",
    "BabyAI-Pickup-v0",
    "BabyAI-UnblockPickup-v0",
    "BabyAI-PickupLoc-v0",
    "BabyAI-PickupDistDebug-v0",
    "BabyAI-PickupAbove-v0",
    "BabyAI-PutNextLocalS6N4-v0",
    "BabyAI-PutNextS7N4Carrying-v0",
    "BabyAI-Unlock-v0",
    "BabyAI-UnlockLocalDist-v0",
    "BabyAI-KeyInBox-v0",
    "BabyAI-UnlockPickupDist-v0",
    "BabyAI-BlockedUnlockPickup-v0",
    "BabyAI-UnlockToUnlock-v0",
    "BabyAI-ActionObjDoor-v0",
    "BabyAI-FindObjS7-v0",
    "BabyAI-KeyCorridorS6R3-v0",
    "BabyAI-OneRoomS20-v0",
    "BabyAI-MoveTwoAcrossS8N9-v0",
    "BabyAI-SynthS5R2-v0",
    "BabyAI-SynthLoc-v0",
    "BabyAI-SynthSeq-v0",
    "BabyAI-MiniBossLevel-v0",
    "BabyAI-BossLevel-v0",
    "BabyAI-BossLevelNoUnlock-v0",
)

# minigrid 3 retired one of AgentGym's level versions; v1 is the same level with a fixed generator.
RENAMED = {"BabyAI-GoToObjS6-v0": "BabyAI-GoToObjS6-v1"}


def level_of(data_idx: int) -> tuple[str, int]:
    """(level name as AgentGym writes it, reset seed) of task ``data_idx``."""
    return LEVELS[data_idx % len(LEVELS)], data_idx // len(LEVELS)


def make(level: str) -> Any:
    """A fresh gymnasium env of ``level`` (wrapped as ``gymnasium.make`` wraps it, as AgentGym does)."""
    return _gymnasium().make(RENAMED.get(level, level))


@functools.cache
def _gymnasium() -> Any:
    """gymnasium with minigrid's levels registered, imported on first use (about 1 s: the
    service's start and its worker processes do not pay it unless BabyAI is played)."""
    import gymnasium

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import minigrid  # noqa: F401  (registers the BabyAI levels with gymnasium)
        import minigrid.envs.babyai.core.roomgrid_level as roomgrid_level

    # Level generation prints each rejected sample ("Sampling rejected: ..."): to our log instead.
    roomgrid_level.print = lambda *args, **_: log.debug(" ".join(map(str, args)))  # type: ignore[attr-defined]
    return gymnasium
