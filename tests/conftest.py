"""Shared fixtures: a real task-app server and a vLLM-shaped fake, both on 127.0.0.1."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from grpo_service import Settings, create_app
from tools.fake_server import FakeConfig, FakeInferenceServer
from tools.server_thread import ServerThread

MODEL = "fake-qwen3"


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "state_dir": tmp_path / "state",
        "snapshot_secret": "test-secret-" + "x" * 32,
        "default_model": MODEL,
        "reaper_interval_s": 3600.0,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)


@pytest.fixture(scope="session")
def fake_llm() -> Iterator[FakeInferenceServer]:
    """One fake inference server for the session; tests that change its config restore it."""
    with FakeInferenceServer(FakeConfig(model=MODEL)) as server:
        yield server


@pytest.fixture(scope="module")
def module_fake() -> Iterator[FakeInferenceServer]:
    """A fake inference server of the default config, for one test module."""
    with FakeInferenceServer(FakeConfig()) as server:
        yield server


@pytest.fixture
def fake(module_fake: FakeInferenceServer) -> FakeInferenceServer:
    """The module's fake, back at its default config with zeroed counters (tests may change both)."""
    module_fake.set_config(FakeConfig())
    module_fake.state.reset_stats()
    return module_fake


# ------------------------------------------------------------- served through Ray

# Embedded, and through a local Ray cluster; the Ray half is outside the inner loop (`slow`).
SERVINGS = (pytest.param("embedded"), pytest.param("ray", marks=pytest.mark.slow))


PROJECT_PACKAGES = ("grpo_service", "envs", "storage", "inference", "training", "tools")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "through_ray: run the module's server tests embedded and through Ray")
    if sys.dont_write_bytecode:
        if "PYTEST_XDIST_WORKER" not in os.environ:
            compile_project()
        # pytest caches the test modules it rewrote (their asserts) only where bytecode may be written.
        sys.dont_write_bytecode = False


def compile_project() -> None:
    """Compile the project's modules once, before the workers start. Where the environment
    forbids writing bytecode (``PYTHONDONTWRITEBYTECODE``, as this machine kind sets it), every
    process the suite starts (servers, Ray workers, the bench's children) would otherwise compile
    them from source again; a process still reads compiled files it did not write."""
    import compileall

    root = Path(__file__).resolve().parent.parent
    for package in PROJECT_PACKAGES:
        compileall.compile_dir(root / package, quiet=1, workers=0)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module marked ``through_ray`` runs every test that starts a server twice: embedded,
    and with the front of a local Ray cluster of two hosts (one cluster for the session). The
    Ray half is ``slow``: the inner loop (``pytest -m "not slow"``) serves embedded only."""
    if metafunc.definition.get_closest_marker("through_ray") and "serving" in metafunc.fixturenames:
        metafunc.parametrize("serving", SERVINGS, indirect=True)


# Whole modules outside the inner loop: each starts a real vLLM, a browser, a Ray cluster of its
# own, or soaks the server for tens of seconds. They run in the whole suite (and in CI).
SLOW_MODULES = frozenset(
    {
        "test_vllm_service.py",  # real vLLM (CPU build) in its own venv
        "test_vllm_parity.py",
        "test_viewer_browser.py",  # Chromium
        "test_docs_page.py",
        "test_ray.py",  # Ray clusters of several nodes
        "test_openenv_ray.py",
        "test_hardening_fuzz.py",  # schemathesis over every route
        "test_hardening_leaks.py",
        "test_hardening_load.py",
        "test_hardening_crash.py",
        "test_bench.py",  # the benchmark's own smoke runs
        "test_bench_train.py",
        "test_trl.py",  # TRL's GRPOTrainer training against the task app
    }
)
RAY_MODULES = frozenset({"test_ray.py", "test_openenv_ray.py"})
VLLM_MODULES = frozenset({"test_vllm_parity.py", "test_vllm_service.py", "test_trl_async.py"})


# The suite runs on two pytest-xdist workers. Tests of a local Ray cluster share one worker: each
# worker would start its own, and ``ray_address="auto"`` finds a cluster by machine-wide files.
# So do the tests of the one real vLLM (it takes a minute to start). The groups are told from the
# test ids by `SuiteScheduling` (xdist's own ``loadgroup`` marks them on an id pytest 9.2 no
# longer reads).
RAY_NAME = re.compile(r"(^|[_\[-])ray($|[_\]-])")


def xdist_group(nodeid: str) -> str | None:
    path, _, name = nodeid.partition("::")
    module = path.rsplit("/", 1)[-1]
    if module in RAY_MODULES or RAY_NAME.search(name):
        return "ray"
    if module in VLLM_MODULES:
        return "vllm"
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class SuiteScheduling(LoadScopeScheduling):
        """xdist's load scheduling with the Ray and vLLM groups each kept on one worker, sent
        before the single tests (a scope's size sets its place in the queue)."""

        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or nodeid

    return SuiteScheduling(config, log)


@pytest.hookimpl(tryfirst=True)  # marked slow before ``-m`` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        # A test that starts what a group shares must be told to be in it by its id.
        fixtures = getattr(item, "fixturenames", ())
        if "real_vllm" in fixtures and xdist_group(item.nodeid) != "vllm":
            raise pytest.UsageError(f"{item.nodeid} uses the real vLLM: list its module in VLLM_MODULES")
        served = getattr(getattr(item, "callspec", None), "params", {}).get("serving")
        if ("ray_local" in fixtures or served == "ray") and xdist_group(item.nodeid) != "ray":
            raise pytest.UsageError(f"{item.nodeid} uses the Ray cluster: name it `ray` or list its module")


@pytest.fixture
def serving(request: pytest.FixtureRequest) -> str:
    """How test servers are served: ``embedded`` unless the module is marked ``through_ray``."""
    mode = getattr(request, "param", "embedded")
    if mode == "ray":
        request.getfixturevalue("ray_local")
    return mode


# Under xdist a group's tests run one after another on one worker (`SuiteScheduling`), and what
# they share is stopped as the worker leaves the group rather than at the session's end: an idle
# Ray cluster takes about 7 % of a core (its prestarted workers, raylet and GCS), an idle vLLM
# about 2 %, through the rest of that worker's tests.
_GROUP_STOPS: dict[str, list[Callable[[], None]]] = {}
_ENDED_GROUPS: set[str] = set()


def stop_with_the_group(group: str, stop: Callable[[], None]) -> Callable[[], None]:
    """``stop``, to be run once: as the worker leaves ``group`` (under xdist), else by its fixture."""
    stopped = False

    def once() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            stop()

    _GROUP_STOPS.setdefault(group, []).append(once)
    return once


def pytest_runtest_setup(item: pytest.Item) -> None:
    group = xdist_group(item.nodeid)
    if group in _ENDED_GROUPS:
        pytest.fail(f"{item.nodeid}: the {group} group's tests ran before it on this worker", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    try:
        return (yield)  # the test's own fixtures first (a module's Ray front before the cluster)
    finally:
        group = xdist_group(item.nodeid)
        leaving = nextitem is None or xdist_group(nextitem.nodeid) != group
        if group is not None and leaving and "PYTEST_XDIST_WORKER" in os.environ:
            _ENDED_GROUPS.add(group)
            for stop in reversed(_GROUP_STOPS.pop(group, [])):
                stop()


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    """One local Ray cluster for the Ray group's tests, this process its driver, started as a
    front starts one (its workers at the front's priority)."""
    import tempfile

    ray = pytest.importorskip("ray")
    from grpo_service.cluster.cluster import start_local_cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths fit in 107 bytes
    start_local_cluster(2, object_store_bytes=100_000_000, _temp_dir=temp)

    def shut_down() -> None:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)

    stop = stop_with_the_group("ray", shut_down)
    try:
        yield
    finally:
        stop()


def served_settings(tmp_path: Path, serving: str, **overrides: Any) -> Settings:
    """Test settings; through Ray, a front of two hosts in a namespace of its own."""
    if serving == "ray":
        import secrets

        ray = {"ray_address": "auto", "ray_hosts": 2, "ray_host_cpus": 0.0}
        overrides = {**ray, "ray_namespace": f"test-{secrets.token_hex(4)}", **overrides}
    return make_settings(tmp_path, **overrides)


@pytest.fixture
def start_server(tmp_path: Path, serving: str) -> Iterator[Callable[..., ServerThread]]:
    """Factory: start a task-app server with settings overrides; all are stopped at teardown."""
    servers: list[ServerThread] = []

    def start(**overrides: Any) -> ServerThread:
        settings = served_settings(tmp_path, serving, **overrides)
        server = ServerThread(create_app(settings), name="task-app").start(timeout_s=60)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def server(start_server: Callable[..., ServerThread], fake_llm: FakeInferenceServer) -> ServerThread:
    return start_server(vllm_base_url=fake_llm.base_url)


@pytest.fixture
def client(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        yield c


# ------------------------------------------------------------- `grpo-service serve` subprocesses


REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_env_file(tmp_path: Path, llm_url: str) -> Path:
    env_file = tmp_path / "service.env"
    env_file.write_text(
        f"VLLM_BASE_URL={llm_url}\nDEFAULT_MODEL={MODEL}\nSTATE_DIR={tmp_path / 'state'}\n"
        f"SNAPSHOT_SECRET={'s' * 40}\nREAPER_INTERVAL_S=3600\n"
    )
    return env_file


class Served:
    def __init__(self, proc: subprocess.Popen[bytes], base_url: str, log: Path) -> None:
        self.proc, self.base_url, self.log = proc, base_url, log


@pytest.fixture
def serve(tmp_path: Path, fake_llm: FakeInferenceServer) -> Iterator[Callable[..., Served]]:
    """Start ``python -m grpo_service.cli serve ARGS`` in ``tmp_path``; wait until it answers."""
    started: list[Served] = []

    def start(*args: str, wait_s: float = 30.0) -> Served:
        port = free_port()
        log = tmp_path / f"serve-{port}.log"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("TRACE_DB", None)
        cmd = [sys.executable, "-m", "grpo_service.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--env-file", str(write_env_file(tmp_path, fake_llm.base_url)), *args]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        served = Served(proc, f"http://127.0.0.1:{port}", log)
        started.append(served)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited with {proc.returncode}:\n{log.read_text()}")
            try:
                if httpx.get(served.base_url + "/health", timeout=1).status_code == 200:
                    return served
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"serve did not start:\n{log.read_text()}")

    yield start
    for served in started:
        if served.proc.poll() is None:
            os.killpg(served.proc.pid, signal.SIGKILL)
            served.proc.wait(10)


# ------------------------------------------------------------- trace DBs for the viewer


@pytest.fixture(scope="session")
def real_trace_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace DB of real rollouts (a GRPO group, LLM rollouts, a policy error), recorded once."""
    from tests.viewer_data import record_real_db

    root = tmp_path_factory.mktemp("viewer")
    record_real_db(root / "task_app_traces_real.db", root / "state")
    return root / "task_app_traces_real.db"


# ------------------------------------------------------------- the real vLLM server


_early_vllm: Future[Any] | None = None  # the real vLLM, starting since collection (`real_vllm`)


def _start_real_vllm(root: Path) -> Any:
    from tests.vllm_helpers import RealVLLM, make_vllm_checkpoint, start_vllm, vllm_python

    vllm_python()  # skip (or fail on CI) before making a checkpoint
    checkpoint = make_vllm_checkpoint(root / "model")
    return RealVLLM(start_vllm(checkpoint, root / "vllm.log"), checkpoint)


def pytest_collection_finish(session: pytest.Session) -> None:
    """When a selected test needs the real vLLM, start it now: its minute of start-up then runs
    beside the tests before the first one that uses it, on the core the test process leaves idle."""
    global _early_vllm
    if "PYTEST_XDIST_WORKER" in os.environ:  # each worker collects every test: start it when used
        return
    if session.config.option.collectonly or not any(
        "real_vllm" in getattr(item, "fixturenames", ()) for item in session.items
    ):
        return
    root = Path(tempfile.mkdtemp(prefix="vllm-"))
    session.config.add_cleanup(lambda: shutil.rmtree(root, ignore_errors=True))
    _early_vllm = ThreadPoolExecutor(1, thread_name_prefix="vllm-start").submit(_start_real_vllm, root)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the early vLLM when no test took it (a run stopped at its first failure)."""
    if _early_vllm is not None and _early_vllm.done() and _early_vllm.exception() is None:
        server = _early_vllm.result().server
        if server.proc is not None and server.proc.poll() is None:
            server.stop()


@pytest.fixture(scope="session")
def real_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real vLLM (CPU build) serving a tiny checkpoint made here: one per session, started at
    collection (it takes about a minute). Tests that load other weights into it load these back."""
    start = _early_vllm
    if start is None:  # requested though no collected test named it (a fixture of a fixture)
        start = ThreadPoolExecutor(1).submit(_start_real_vllm, tmp_path_factory.mktemp("vllm"))
    real = start.result(timeout=900)
    stop = stop_with_the_group("vllm", real.server.stop)
    try:
        yield real
    finally:
        stop()
