"""`ModalVolumeSnapshotStore` and `export_sqlite`, with the Volume faked at its two calls.

`FakeVolume` models what Modal documents: each container sees its own view of the Volume
(its mount directory); ``commit()`` publishes that view, ``reload()`` pulls what others
published. Two stores on two mounts of one fake Volume are two containers.
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from grpo_service import create_app
from storage import SnapshotNotFound
from storage.modal_volume import ModalVolumeSnapshotStore, export_sqlite
from tests.conftest import make_settings

RUN = "run-1"
SID = "ab" + "0" * 30
BLOB = b"snapshot bytes"


class FakeVolume:
    def __init__(self, remote: Path, mount: Path, *, reload_delay_s: float = 0.0) -> None:
        self.remote, self.mount = remote, mount
        remote.mkdir(parents=True, exist_ok=True)
        mount.mkdir(parents=True, exist_ok=True)
        self.commits = 0
        self.reloads = 0
        self.reload_delay_s = reload_delay_s
        self.fail_reload = False

    def commit(self) -> None:
        self.commits += 1
        shutil.copytree(self.mount, self.remote, dirs_exist_ok=True)

    def reload(self) -> None:
        self.reloads += 1
        time.sleep(self.reload_delay_s)
        if self.fail_reload:
            raise RuntimeError("there are open files preventing the operation")
        shutil.copytree(self.remote, self.mount, dirs_exist_ok=True)


def container(tmp_path: Path, name: str, **kwargs: float) -> tuple[ModalVolumeSnapshotStore, FakeVolume]:
    vol = FakeVolume(tmp_path / "remote", tmp_path / name, **kwargs)
    return ModalVolumeSnapshotStore(vol.mount, vol, volume_name="synth-env-state"), vol


def test_put_writes_the_layout_atomically_and_commits(tmp_path: Path) -> None:
    store, vol = container(tmp_path, "a")
    path = Path(store.put(RUN, "env", SID, BLOB))
    assert path == vol.mount / "runs" / RUN / "env" / SID[:2] / f"{SID}.tar.gz"
    assert path.read_bytes() == BLOB
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no temp file left behind"
    assert vol.commits == 1
    assert (vol.remote / path.relative_to(vol.mount)).read_bytes() == BLOB


def test_another_container_sees_a_snapshot_after_one_reload(tmp_path: Path) -> None:
    writer, _ = container(tmp_path, "a")
    reader, vol = container(tmp_path, "b")
    writer.put(RUN, "env", SID, BLOB)
    assert not (vol.mount / "runs").exists(), "not visible before a reload"
    assert reader.get(RUN, "env", SID) == BLOB
    assert vol.reloads == 1
    assert reader.get(RUN, "env", SID) == BLOB
    assert vol.reloads == 1, "a hit costs no reload"


def test_each_miss_costs_one_reload(tmp_path: Path) -> None:
    """Written by another container: found after one reload. Written nowhere: one reload, then
    not found (``locate`` answers None, ``get`` raises)."""
    writer, _ = container(tmp_path, "a")
    reader, vol = container(tmp_path, "b")
    writer.put(RUN, "policy", SID, BLOB)
    assert (reader.locate("policy", SID), vol.reloads) == (RUN, 1)
    assert (reader.locate("env", SID), vol.reloads) == (None, 2)
    with pytest.raises(SnapshotNotFound):
        reader.get(RUN, "env", SID)
    assert vol.reloads == 3


def test_invalid_input_never_costs_a_reload(tmp_path: Path) -> None:
    store, vol = container(tmp_path, "a")
    with pytest.raises(SnapshotNotFound):
        store.get(RUN, "env", "../../etc/passwd")
    with pytest.raises(ValueError):
        store.get("../escape", "env", SID)
    with pytest.raises(ValueError):
        store.locate("bogus-kind", SID)
    assert vol.reloads == 0


def test_a_failed_reload_is_a_miss_not_an_error(tmp_path: Path) -> None:
    store, vol = container(tmp_path, "a")
    vol.fail_reload = True
    with pytest.raises(SnapshotNotFound):
        store.get(RUN, "env", SID)
    assert store.locate("env", SID) is None


def test_concurrent_misses_share_one_reload(tmp_path: Path) -> None:
    writer, _ = container(tmp_path, "a")
    reader, vol = container(tmp_path, "b", reload_delay_s=0.05)
    writer.put(RUN, "env", SID, BLOB)
    barrier, results = threading.Barrier(8), []

    def read() -> None:
        barrier.wait()
        results.append(reader.get(RUN, "env", SID))

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [BLOB] * 8
    assert vol.reloads == 1


def test_delete_commits_only_what_it_removed(tmp_path: Path) -> None:
    store, vol = container(tmp_path, "a")
    store.put(RUN, "env", SID, BLOB)
    assert store.delete(RUN, "env", SID) is True
    assert vol.commits == 2
    assert store.delete(RUN, "env", SID) is False
    assert vol.commits == 2
    assert store.describe() == f"modal-volume:synth-env-state:{vol.mount.resolve()}"


def test_restore_by_id_in_another_container(tmp_path: Path) -> None:
    """A snapshot taken through one container's API restores through another's by id alone."""
    store_a, _ = container(tmp_path, "a")
    store_b, vol_b = container(tmp_path, "b")
    with (
        TestClient(create_app(make_settings(tmp_path / "app-a"), store=store_a)) as a,
        TestClient(create_app(make_settings(tmp_path / "app-b"), store=store_b)) as b,
    ):
        env = a.post("/env/create", json={"env_name": "crafter", "seed": 7, "rl_run_id": RUN}).json()
        a.post(
            "/env/step", json={"env_id": env["env_id"], "actions": ["move_left", "noop"]}
        ).raise_for_status()
        snap = a.post("/env/snapshot", json={"env_id": env["env_id"]}).json()
        restored = b.post("/env/restore", json={"snapshot_id": snap["snapshot_id"]})
        assert restored.status_code == 200, restored.text
        assert restored.json()["step_idx"] == 2
        assert vol_b.reloads == 1


def test_export_sqlite_copies_a_consistent_file_and_commits(tmp_path: Path) -> None:
    live = tmp_path / "local" / "traces.db"
    live.parent.mkdir()
    db = sqlite3.connect(live)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t (x INTEGER)")
    db.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(100)])
    db.commit()  # still in the WAL, and the connection stays open
    vol = FakeVolume(tmp_path / "remote", tmp_path / "mount")
    dest = vol.mount / "traces"
    copy = export_sqlite(live, dest, vol, name="trace.db")
    db.close()
    assert copy == dest / "trace.db"
    assert [p.name for p in dest.iterdir()] == ["trace.db"]
    assert [p.name for p in live.parent.iterdir() if ".export" in p.name] == []
    with sqlite3.connect(copy) as exported:
        assert exported.execute("SELECT count(*) FROM t").fetchone()[0] == 100
    assert vol.commits == 1


def test_export_sqlite_of_a_missing_file_raises(tmp_path: Path) -> None:
    vol = FakeVolume(tmp_path / "remote", tmp_path / "mount")
    with pytest.raises(FileNotFoundError):
        export_sqlite(tmp_path / "nope.db", vol.mount, vol, name="x.db")
    assert vol.commits == 0
