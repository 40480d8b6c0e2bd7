"""Modal's sticky sessions for the deployed task app (``main.py``'s ``TaskAppSessions`` Server).

A trainer that keeps live envs, policies or runs opens a session: every request carrying its
token reaches the container holding them, and that container is not scaled down while the
session lives. Self-contained rollouts (``/rollout/group``, ``/rollouts``) need no session:
send them to the ``fastapi_app`` URL, which any container answers.

    from grpo_service.client.task_app import TaskAppClient
    from grpo_service.client.modal_sessions import ModalSession

    with ModalSession.start() as session, TaskAppClient(session.url, api_key=KEY, session=session) as app:
        env = app.create_env(env_name="crafter", seed=3)
        ...                                            # every call lands on the session's container
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Self

APP_NAME = "grpo-service"
SERVER_NAME = "TaskAppSessions"
HEADER = "Modal-Authorization"
DEFAULT_IDLE_TIMEOUT_S = 600


@dataclass
class ModalSession:
    """A started session: the Server's URL and the session's token (``Modal-Authorization``)."""

    url: str
    token: str
    session_id: str = ""
    server: Any = field(default=None, repr=False)  # the `modal.Server` that started it

    @property
    def headers(self) -> dict[str, str]:
        return {HEADER: f"Bearer {self.token}"}

    @classmethod
    def start(
        cls,
        app_name: str = APP_NAME,
        server_name: str = SERVER_NAME,
        idle_timeout_s: int = DEFAULT_IDLE_TIMEOUT_S,
    ) -> Self:
        """Start a session on the deployed Server (Modal's client: needs ``modal token new``)."""
        import modal

        server = modal.Server.from_name(app_name, server_name)
        url = server.get_url()
        if not url:
            raise RuntimeError(f"the Modal Server {app_name}/{server_name} has no URL: is it deployed?")
        credentials = server.sessions.start(idle_timeout=idle_timeout_s)
        return cls(url.rstrip("/"), credentials.token, credentials.session_id, server)

    def end(self) -> None:
        """Terminate the session (its container may scale down; its live objects go with it)."""
        if self.server is not None:
            self.server.sessions.terminate(self.token)
            self.server = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()
