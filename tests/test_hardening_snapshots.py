"""Snapshot attacks: the tarball on disk is replaced by a hostile one (path traversal, links, a
pickle that would run code, truncation, another run's snapshot, another server's key, a gzip
bomb, ...). Every restore route refuses it with a 4xx, nothing is executed, nothing is written
anywhere, and no env or policy is left behind."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import shlex
import shutil
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from grpo_service import create_app
from storage import SnapshotCodec
from tests.conftest import make_settings
from tests.hardening import counts, file_tree
from tools.fake_server import FakeInferenceServer
from tools.server_thread import ServerThread

pytestmark = pytest.mark.through_ray

SECRET = make_settings(Path("unused")).snapshot_secret.get_secret_value().encode()  # type: ignore[union-attr]
MEMBERS = ("meta.json", "state.bin")  # the signature is in the gzip header (storage/codec.py)
REFUSED = {"invalid_snapshot", "snapshot_not_found"}


class RunsCode:
    """Unpickling this creates ``path``: a stand-in for arbitrary code execution."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {shlex.quote(str(self.path))}",)


@dataclass
class Store:
    client: httpx.Client
    root: Path  # everything the test may touch; STATE_DIR is root / "state"
    state_dir: Path
    env_snapshot: dict  # run-a
    other_run_snapshot: dict  # run-b
    policy_snapshot: dict  # run-a
    marker: Path

    @property
    def target(self) -> Path:
        return Path(self.env_snapshot["path"])

    def original(self) -> bytes:
        return (self.root / "originals" / "env.tar.gz").read_bytes()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, fake_llm: FakeInferenceServer) -> Iterator[Store]:
    root = tmp_path_factory.mktemp("snapshots")
    settings = make_settings(root, vllm_base_url=fake_llm.base_url)
    with (
        ServerThread(create_app(settings), name="snapshots") as server,
        httpx.Client(base_url=server.base_url, timeout=60) as client,
    ):

        def snapshot(run: str, seed: int, policy: bool = False) -> dict:
            env_id = client.post("/env/create", json={"env_name": "crafter", "seed": seed}).json()["env_id"]
            client.post("/env/step", json={"env_id": env_id, "actions": ["move_left", "do", "noop"]})
            if policy:
                pid = client.post("/policy/create", json={"policy_name": "crafter-random"}).json()[
                    "policy_id"
                ]
                snap = client.post("/policy/snapshot", json={"policy_id": pid, "rl_run_id": run}).json()
                client.post("/policy/terminate", json={"policy_id": pid})
            else:
                snap = client.post("/env/snapshot", json={"env_id": env_id, "rl_run_id": run}).json()
            client.post("/env/terminate", json={"env_id": env_id})
            return snap

        found = Store(
            client,
            root,
            settings.state_dir,
            snapshot("run-a", 5),
            snapshot("run-b", 6),
            snapshot("run-a", 5, policy=True),
            root / "CODE-RAN",
        )
        (root / "originals").mkdir()
        shutil.copy(found.target, root / "originals" / "env.tar.gz")
        yield found


# ------------------------------------------------------------------------------ forgeries


def tar_gz(entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data if kind == tarfile.REGTYPE else None


def members_of(blob: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}  # type: ignore[union-attr]


def with_members(blob: bytes, **replace: bytes) -> bytes:
    parts = members_of(blob) | replace
    return tar_gz([member(name, parts[name]) for name in MEMBERS])


def resigned(blob: bytes, payload: bytes, key: bytes = SECRET) -> bytes:
    """The same snapshot (id, kind, run) with another payload, signed with ``key``: a leaked key."""
    meta, _ = SnapshotCodec(SECRET).unpack(blob)
    for field in ("format", "format_version", "payload_sha256", "payload_size"):
        meta.pop(field)
    return SnapshotCodec(key).pack(meta, payload)


def traversal(s: Store) -> bytes:
    parts = members_of(s.original())
    escape = "../" * 12 + str(s.root / "ESCAPED").lstrip("/")
    return tar_gz([member(escape, b"owned"), *(member(n, parts[n]) for n in MEMBERS)])


def absolute_member(s: Store) -> bytes:
    parts = members_of(s.original())
    return tar_gz([member(n, parts[n]) for n in MEMBERS] + [member(str(s.root / "ABSOLUTE"), b"owned")])


def symlink_member(s: Store) -> bytes:
    parts = members_of(s.original())
    return tar_gz(
        [
            member("meta.json", kind=tarfile.SYMTYPE, link="/etc/passwd"),
            *(member(n, parts[n]) for n in MEMBERS[1:]),
        ]
    )


def hardlink_member(s: Store) -> bytes:
    parts = members_of(s.original())
    return tar_gz(
        [member("meta.json", parts["meta.json"]), member("state.bin", kind=tarfile.LNKTYPE, link="meta.json")]
    )


def device_member(s: Store) -> bytes:
    parts = members_of(s.original())
    return tar_gz([member("meta.json", parts["meta.json"]), member("state.bin", kind=tarfile.CHRTYPE)])


def pickle_unsigned(s: Store) -> bytes:
    return with_members(s.original(), **{"state.bin": pickle.dumps(RunsCode(s.marker))})


def pickle_signed(s: Store) -> bytes:
    return resigned(s.original(), pickle.dumps(RunsCode(s.marker)))


def zlib_pickle_signed(s: Store) -> bytes:
    return resigned(s.original(), zlib.compress(pickle.dumps(RunsCode(s.marker))))


def bit_flip(s: Store) -> bytes:
    state = bytearray(members_of(s.original())["state.bin"])
    state[len(state) // 2] ^= 0x01
    return with_members(s.original(), **{"state.bin": bytes(state)})


def gzip_bomb(s: Store) -> bytes:
    return with_members(s.original(), **{"state.bin": bytes(40 * 2**20)})  # 40 MiB of zeros, ~40 KB on disk


def extra_member(s: Store) -> bytes:
    parts = members_of(s.original())
    return tar_gz([member(n, parts[n]) for n in MEMBERS] + [member("run.sh", b"rm -rf /")])


def other_key(s: Store) -> bytes:
    return resigned(s.original(), members_of(s.original())["state.bin"], key=b"another-server-" + b"k" * 32)


ATTACKS: dict[str, Callable[[Store], bytes]] = {
    "path traversal member": traversal,
    "absolute path member": absolute_member,
    "symlink member": symlink_member,
    "hardlink member": hardlink_member,
    "device member": device_member,
    "extra member": extra_member,
    "pickle payload": pickle_unsigned,
    "pickle payload signed with the leaked key": pickle_signed,
    "zlib pickle payload signed with the leaked key": zlib_pickle_signed,
    "payload bit flip": bit_flip,
    "gzip bomb": gzip_bomb,
    "signed by another server's key": other_key,
    "truncated": lambda s: s.original()[: len(s.original()) // 2],
    "empty file": lambda s: b"",
    "not a tarball": lambda s: os.urandom(4096),
    "another run's snapshot copied over": lambda s: Path(s.other_run_snapshot["path"]).read_bytes(),
    "a policy snapshot copied over": lambda s: Path(s.policy_snapshot["path"]).read_bytes(),
}


# ---------------------------------------------------------------------------------- checks


def restore_everywhere(s: Store, snapshot_id: str) -> list[httpx.Response]:
    """Every route that restores an env snapshot."""
    source = {"snapshot_id": snapshot_id}
    policy = {"policy_name": "crafter-random"}
    return [
        s.client.post("/env/restore", json=source),
        s.client.post("/rollout", json={"env": source, "policy": policy, "max_turns": 1}),
        s.client.post(
            "/rollout/group", json={"group_size": 2, "env": source, "policy": policy, "max_turns": 1}
        ),
    ]


@contextlib.contextmanager
def hostile(s: Store, path: Path, place: Callable[[Path], None]) -> Iterator[None]:
    """Put a hostile file (or link, or directory) at ``path``; afterwards assert that nothing ran,
    nothing was written anywhere under the test's root and no env or policy was left behind;
    then put the genuine snapshot back and check that it still restores."""
    genuine = path.read_bytes()
    path.unlink()
    place(path)
    try:
        before = counts(s.client), file_tree(s.root)
        yield
        assert not s.marker.exists(), "the snapshot payload ran code"
        assert (counts(s.client), file_tree(s.root)) == before
    finally:
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
        path.write_bytes(genuine)
    assert (
        s.client.post("/env/restore", json={"snapshot_id": s.env_snapshot["snapshot_id"]}).status_code == 200
    )


def assert_refused(responses: list[httpx.Response], status: int | None = None) -> None:
    for r in responses:
        assert 400 <= r.status_code < 500 and r.json()["code"] in REFUSED, (r.request.url, r.text[:300])
        assert status is None or r.status_code == status, (r.request.url, r.text[:300])


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_hostile_snapshot_is_refused_and_runs_nothing(store: Store, attack: str) -> None:
    blob = ATTACKS[attack](store)
    with hostile(store, store.target, lambda path: path.write_bytes(blob)):
        assert_refused(restore_everywhere(store, store.env_snapshot["snapshot_id"]))
    assert not (store.root / "ESCAPED").exists() and not (store.root / "ABSOLUTE").exists()


def test_the_pickle_payload_would_run_code(tmp_path: Path) -> None:
    """Without this, "the marker file does not exist" would prove nothing."""
    pickle.loads(pickle.dumps(RunsCode(tmp_path / "ran")))
    assert (tmp_path / "ran").exists()


def test_links_and_directories_in_place_of_a_snapshot(store: Store, tmp_path: Path) -> None:
    outside = tmp_path / "forged.tar.gz"  # outside STATE_DIR, and validly signed
    outside.write_bytes(pickle_signed(store))
    snapshot_id = store.env_snapshot["snapshot_id"]
    with hostile(store, store.target, lambda path: path.symlink_to(outside)):
        assert_refused(restore_everywhere(store, snapshot_id), 404)
    other = Path(store.other_run_snapshot["path"])
    with hostile(store, store.target, lambda path: path.symlink_to(other)):
        assert_refused(restore_everywhere(store, snapshot_id), 422)
    with hostile(store, store.target, lambda path: path.mkdir()):
        assert_refused(restore_everywhere(store, snapshot_id), 404)


def test_a_snapshot_copied_into_another_run_is_refused(store: Store) -> None:
    snapshot_id = store.env_snapshot["snapshot_id"]
    copy = Path(store.other_run_snapshot["path"]).parent.parent / snapshot_id[:2] / f"{snapshot_id}.tar.gz"
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(store.original())
    try:
        with hostile(store, copy, lambda path: path.write_bytes(store.original())):
            r = store.client.post("/env/restore", json={"snapshot_id": snapshot_id, "rl_run_id": "run-b"})
            assert_refused([r], 422)
    finally:
        copy.unlink()


def test_hostile_policy_snapshot_is_refused(store: Store) -> None:
    snapshot_id = store.policy_snapshot["snapshot_id"]
    path = Path(store.policy_snapshot["path"])
    genuine = path.read_bytes()
    for blob in (
        resigned(genuine, pickle.dumps(RunsCode(store.marker))),
        resigned(genuine, b'{"policy_name": "crafter-random", "state": [1, 2]}'),
        with_members(genuine, **{"state.bin": b"{}"}),
        Path(store.env_snapshot["path"]).read_bytes(),
    ):
        with hostile(store, path, lambda p, blob=blob: p.write_bytes(blob)):
            r = store.client.post("/policy/restore", json={"snapshot_id": snapshot_id})
            assert_refused([r], 422)
    assert store.client.post("/policy/restore", json={"snapshot_id": snapshot_id}).status_code == 200
