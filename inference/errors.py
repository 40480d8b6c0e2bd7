"""Errors of the inference client. Messages never contain the API key."""

from __future__ import annotations

from typing import Any, Literal, get_args

InferenceErrorKind = Literal[
    "timeout",
    "rate_limited",
    "server_error",
    "connection_error",
    "bad_request",
    "auth_error",
    "malformed_response",
]
ERROR_KINDS: tuple[str, ...] = get_args(InferenceErrorKind)
RETRYABLE_KINDS: frozenset[str] = frozenset({"timeout", "rate_limited", "server_error", "connection_error"})


class InferenceError(Exception):
    """A chat completion that failed for good (after any retries)."""

    def __init__(
        self,
        kind: InferenceErrorKind,
        detail: str,
        attempts: int = 1,
        *,
        status_code: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        if kind not in ERROR_KINDS:
            raise ValueError(f"unknown inference error kind {kind!r}")
        self.kind: InferenceErrorKind = kind
        self.detail = detail
        self.attempts = attempts
        self.status_code = status_code
        self.retry_after_s = retry_after_s
        # Only the kind goes into ``args``: the client redacts ``detail`` and sets ``attempts``
        # after construction, and ``repr``/``str`` must show those final values.
        super().__init__(kind)

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE_KINDS

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        fields = (self.kind, self.detail, self.attempts, self.status_code, self.retry_after_s)
        return _restore, (type(self), *fields)

    def __str__(self) -> str:
        status = f" (HTTP {self.status_code})" if self.status_code else ""
        plural = "s" if self.attempts != 1 else ""
        return f"inference {self.kind}{status} after {self.attempts} attempt{plural}: {self.detail}"


class TokenMismatchError(InferenceError):
    """The server returned token ids and logprobs of different lengths (a server defect)."""

    def __init__(self, detail: str, attempts: int = 1) -> None:
        super().__init__("malformed_response", detail, attempts)


def _restore(
    cls: type[InferenceError],
    kind: InferenceErrorKind,
    detail: str,
    attempts: int,
    status_code: int | None,
    retry_after_s: float | None,
) -> InferenceError:
    error = cls.__new__(cls)
    InferenceError.__init__(
        error, kind, detail, attempts, status_code=status_code, retry_after_s=retry_after_s
    )
    return error
