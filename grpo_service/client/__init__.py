"""What a trainer imports to drive the task app from another process: the typed client
(`TaskAppClient`, `AsyncTaskAppClient`), Modal's sticky sessions, the evaluation loop, and TRL's
environment (`grpo_service.client.trl_env`). Nothing here imports the server: only the wire
types of `grpo_service.models`.

    from grpo_service.client import TaskAppClient
"""

from grpo_service.client.task_app import AsyncTaskAppClient, ServiceCallError, TaskAppClient

__all__ = ["AsyncTaskAppClient", "ServiceCallError", "TaskAppClient"]
