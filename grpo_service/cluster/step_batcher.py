"""`StepBatcher`: a front's steps to one host, sent together: ``POST /env/step``, and the OpenEnv
step frames of the front's WebSockets (their link requests, `STEP_LINK`). A batch goes over the
host's step link (`grpo_service.cluster.step_link`), or as one actor call without one.

A Ray actor call costs about 0.8 ms of CPU between the two processes (measured on this
project's 2-vCPU machine: ~0.4 ms in the caller, ~0.4 ms in the actor), several times what one
Crafter step costs. Per-step clients (an OpenEnv or AgentGym client, a trainer stepping its own
envs) send many small requests at once, so the front gathers the steps that arrive for one host
within the same event-loop turn and sends them as one batch: by 8, a step's share of an actor
call is ~0.1 ms, and over a step link less again.

Only env steps are gathered: they are short and alike, so none waits long on another in its
batch. A rollout, a reset that generates a world, or a policy step waiting on the LLM would hold
up the batch's other answers, and goes alone (`Cluster.call` of `Host.request`). Under load the
batches grow by themselves: the busier the front, the more steps arrive in one turn.
"""

from __future__ import annotations

import asyncio

from grpo_service.api.asgi import Answer, RequestArgs
from grpo_service.cluster.cluster import Cluster, HostRef
from grpo_service.cluster.step_link import LinkBroken, LinkUnavailable
from grpo_service.errors import HostUnavailable
from grpo_service.protocols.openenv.links import STEP_LINK


def batched(method: str, path: str, body: bytes) -> bool:
    """Whether a request to one host is a step, sent with the others of its event-loop turn."""
    return method == "POST" and (path == "/env/step" or (session_op(path) and body.startswith(STEP_LINK)))


def session_op(path: str) -> bool:
    """Whether a request is an operation of an OpenEnv socket's session (a link request): short,
    so it goes over the host's step link even alone (`StepBatcher.single`)."""
    return path.startswith("/openenv/") and path.endswith("/link")


class StepBatcher:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._gathering: dict[str, list[tuple[RequestArgs, asyncio.Future[Answer]]]] = {}
        self._calls: set[asyncio.Task[None]] = set()

    async def request(self, host: HostRef, args: RequestArgs) -> Answer:
        """``args`` answered by ``host``, in one call with the other steps sent to it this turn."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Answer] = loop.create_future()
        batch = self._gathering.get(host.tag)
        if batch is None:
            # Runs after the request handlers already scheduled in this turn: they join the batch.
            batch = self._gathering[host.tag] = []
            loop.call_soon(self._send, host)
        batch.append((args, answer))
        return await answer

    async def single(self, host: HostRef, args: RequestArgs) -> Answer:
        """``args`` answered by ``host`` on its own (over its step link if it has one)."""
        (answer,) = await self._answers(host, [args])
        return answer

    def _send(self, host: HostRef) -> None:
        batch = self._gathering.pop(host.tag)
        call = asyncio.ensure_future(self._call(host, batch))
        self._calls.add(call)  # a task only weakly referenced by the loop could be collected
        call.add_done_callback(self._calls.discard)

    async def _call(self, host: HostRef, batch: list[tuple[RequestArgs, asyncio.Future[Answer]]]) -> None:
        try:
            answers = await self._answers(host, [args for args, _ in batch])
        except Exception as exc:  # the host's failure (410/503/504) is every request's
            for _, answer in batch:
                if not answer.done():
                    answer.set_exception(exc)
            return
        except BaseException:  # the front is shutting down
            for _, answer in batch:
                answer.cancel()
            raise
        for (_, answer), result in zip(batch, answers, strict=True):
            if not answer.done():  # its client may have gone
                answer.set_result(result)

    async def _answers(self, host: HostRef, batch: list[RequestArgs]) -> list[Answer]:
        """Over the host's step link if it has one, else (or when it cannot be reached that way)
        as one actor call, which also tells a host that died (410) from one that does not answer."""
        link = host.link
        if link is not None:
            try:
                return await asyncio.wait_for(link.send(batch), self.cluster.settings.host_timeout_s)
            except LinkUnavailable:  # by actor call (`StepLink` says why, once per failed connect)
                pass
            except LinkBroken as exc:
                raise HostUnavailable(f"{exc}; retry later") from None
            except TimeoutError:
                late = f"{host.describe()} did not answer in time"
                raise HostUnavailable(late, code="host_timeout") from None
        if len(batch) == 1:
            return [await self.cluster.call(host, "request", *batch[0])]
        return list(await self.cluster.call(host, "requests", batch))
