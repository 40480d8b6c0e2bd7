"""The policy a gymnasium job trains and serves: an MLP over a flat observation, one logit per
discrete action, and optionally a value head. Inference is numpy (the service needs no torch to
answer ``/inference``); the trainer copies its torch weights in and out.

On disk a policy is one zip: ``policy.json`` (format, shapes, env, training config and summary)
and ``weights.npz`` (plain arrays, loaded without pickle).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "grpo-service/mlp-policy"
FORMAT_VERSION = 1
ACTIVATIONS = {"tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0)}


def init_layers(
    sizes: list[int], rng: np.random.Generator, last_scale: float = 1.0
) -> list[tuple[np.ndarray, np.ndarray]]:
    """torch.nn.Linear's default initialisation, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), in numpy;
    the last layer's weights scaled by ``last_scale`` (its bias 0 when scaled)."""
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        bound = 1.0 / np.sqrt(n_in)
        w = rng.uniform(-bound, bound, (n_in, n_out)).astype(np.float32)
        b = rng.uniform(-bound, bound, n_out).astype(np.float32)
        if i == len(sizes) - 2 and last_scale != 1.0:
            w, b = w * np.float32(last_scale), np.zeros_like(b)
        layers.append((w, b))
    return layers


class InvalidPolicyFile(ValueError):
    """A file that is not a policy zip this version can read."""


@dataclass
class MLPPolicy:
    obs_dim: int
    n_actions: int
    layers: list[tuple[np.ndarray, np.ndarray]]
    """(W [in, out], b [out]) per layer, the last one producing the logits."""
    activation: str = "tanh"
    value_layers: list[tuple[np.ndarray, np.ndarray]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def initial(
        cls,
        obs_dim: int,
        n_actions: int,
        hidden: list[int],
        value_head: bool,
        seed: int,
        meta: dict[str, Any],
    ) -> MLPPolicy:
        """A fresh policy: near-uniform action probabilities (last layer scaled by 0.01, as PPO
        implementations do), the same weights for the same seed."""
        rng = np.random.default_rng(seed)
        layers = init_layers([obs_dim, *hidden, n_actions], rng, last_scale=0.01)
        value = init_layers([obs_dim, *hidden, 1], rng) if value_head else None
        return cls(obs_dim, n_actions, layers, "tanh", value, meta)

    def _forward(self, layers: list[tuple[np.ndarray, np.ndarray]], obs: np.ndarray) -> np.ndarray:
        act = ACTIVATIONS[self.activation]
        x = obs
        for i, (w, b) in enumerate(layers):
            x = x @ w + b
            if i < len(layers) - 1:
                x = act(x)
        return x

    def check_observation(self, obs: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            obs = np.asarray(obs, dtype=np.float32)
        if obs.shape[-1:] != (self.obs_dim,) or obs.ndim > 2:
            raise ValueError(f"observation must have {self.obs_dim} values, got shape {list(obs.shape)}")
        if not np.isfinite(obs).all():
            raise ValueError("observation values must be finite 32-bit floats")
        return obs

    def logits(self, obs: np.ndarray) -> np.ndarray:
        return self._forward(self.layers, obs)

    def probs(self, obs: np.ndarray) -> np.ndarray:
        z = self.logits(obs)
        z = z - z.max(-1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(-1, keepdims=True)

    def value(self, obs: np.ndarray) -> np.ndarray | None:
        if self.value_layers is None:
            return None
        return self._forward(self.value_layers, obs)[..., 0]

    def sample(self, obs: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Sampled actions ``[B]`` and their log-probabilities for a batch of observations ``[B, obs]``."""
        p = self.probs(obs)
        u = rng.random((p.shape[0], 1))
        actions = np.minimum((np.cumsum(p, -1) < u).sum(-1), self.n_actions - 1)
        return actions, np.log(p[np.arange(p.shape[0]), actions] + 1e-30)

    # ------------------------------------------------------------------------------ zip file

    def save(self, path: Path) -> None:
        """Write atomically: a reader never sees half a file, a crash never leaves one."""
        arrays: dict[str, np.ndarray] = {}
        for prefix, layers in (("pi", self.layers), ("v", self.value_layers or [])):
            for i, (w, b) in enumerate(layers):
                arrays[f"{prefix}{i}_w"], arrays[f"{prefix}{i}_b"] = w, b
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        header = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "obs_dim": self.obs_dim,
            "n_actions": self.n_actions,
            "activation": self.activation,
            "policy_layers": len(self.layers),
            "value_layers": len(self.value_layers or []),
            "meta": self.meta,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zf:
                zf.writestr("policy.json", json.dumps(header, indent=2))
                zf.writestr("weights.npz", buf.getvalue(), compress_type=zipfile.ZIP_STORED)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: Path) -> MLPPolicy:
        try:
            with zipfile.ZipFile(path) as zf:
                header = json.loads(zf.read("policy.json"))
                with np.load(io.BytesIO(zf.read("weights.npz")), allow_pickle=False) as npz:
                    arrays = {k: npz[k] for k in npz.files}
        except (zipfile.BadZipFile, KeyError, ValueError, OSError) as exc:
            raise InvalidPolicyFile(f"{path.name}: not a policy zip ({exc})") from None
        if header.get("format") != FORMAT or header.get("format_version") != FORMAT_VERSION:
            raise InvalidPolicyFile(f"{path.name}: format {header.get('format')!r} is not {FORMAT} v1")
        try:

            def layers(prefix: str, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
                return [(arrays[f"{prefix}{i}_w"], arrays[f"{prefix}{i}_b"]) for i in range(n)]

            policy = cls(
                obs_dim=int(header["obs_dim"]),
                n_actions=int(header["n_actions"]),
                layers=layers("pi", int(header["policy_layers"])),
                activation=header["activation"],
                value_layers=layers("v", int(header["value_layers"])) or None,
                meta=header.get("meta") or {},
            )
            if policy.activation not in ACTIVATIONS:
                raise ValueError(f"activation {policy.activation!r}")
            probe = policy.probs(np.zeros((1, policy.obs_dim), np.float32))
            if probe.shape != (1, policy.n_actions):
                raise ValueError(f"logits shape {probe.shape}")
        except (KeyError, ValueError, TypeError) as exc:
            raise InvalidPolicyFile(f"{path.name}: inconsistent policy ({exc})") from None
        return policy
