"""Run folder safety (issue 12, items 1 and 9): a lock against two live runs, no silent wipe of an
earlier run, clear errors for unreadable checkpoints, removal of killed-write leftovers."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from pml_rank_plugins.cli import main
from pml_rank_plugins.experiment.schema import dump_yaml
from pml_rank_plugins.running import run_folder, runner
from pml_rank_plugins.running.checkpoints import CheckpointError
from pml_rank_plugins.running.run_folder import RunFolderBusy, RunFolderError, UnsafeRunFolder
from tests.lock_holder import hold_lock
from tests.tiny import tiny_config

# the tests of this module share one module-scoped fixture: under `-n 2 --dist loadfile`
# (make test) they run on one worker, so the fixture is built once
pytestmark = pytest.mark.xdist_group("run_folder_partial")


def one_epoch():
    return tiny_config(trainer={"MetricLossOnly": {"num_epochs": 1}})


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory):
    """A run interrupted after epoch 1 of 2 (copied by each test that damages it)."""
    run = tmp_path_factory.mktemp("partial") / "run"
    runner.train(tiny_config(), run, stop_after_epoch=1)
    return run


def test_second_run_into_a_live_folder_is_refused(tmp_path):
    run = tmp_path / "run"
    with run_folder.lock(run):
        with pytest.raises(
            RunFolderBusy, match=rf"{run} is in use by another run \(pid {os.getpid()}\)"
        ):
            runner.train(one_epoch(), run)
    assert not (run / "config.yaml").exists()  # the refused run wrote nothing
    runner.train(one_epoch(), run)  # released: the folder is usable again


def test_lock_is_held_across_processes(tmp_path):
    run = tmp_path / "run"
    holder = hold_lock(run)  # the real lock in a process without torch (tests/lock_holder.py)
    try:
        with pytest.raises(RunFolderBusy, match=f"pid {holder.pid}"):
            with run_folder.lock(run):
                pass
    finally:
        holder.kill()
        holder.wait()
    with run_folder.lock(run):  # a killed holder leaves no stale lock
        pass


@pytest.mark.parametrize("stop", [None, 1], ids=["finished", "partial"])
def test_fresh_run_into_a_used_folder_is_refused_unless_overwrite(tmp_path, stop):
    run = tmp_path / "run"
    runner.train(tiny_config(), run, stop_after_epoch=stop)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    kind = "finished" if stop is None else "partial"
    with pytest.raises(RunFolderError, match=f"already holds a {kind} run.*--resume.*--overwrite"):
        runner.train(tiny_config(seed=5), run)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    m = runner.train(tiny_config(seed=5), run, overwrite=True)
    assert m["seed"] == 5 and [h["epoch"] for h in m["history"]] == [1, 2]


def test_cli_refuses_and_overwrites(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    dump_yaml(one_epoch(), cfg)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["train", str(cfg), "--out", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"pml-rank: error: {run} already holds a finished run" in err
    assert "Traceback" not in err
    assert main(["train", str(cfg), "--out", str(run), "--overwrite"]) == 0


@pytest.mark.parametrize("damage", ["truncated", "empty", "random", "not_a_checkpoint"])
def test_corrupt_checkpoint_names_the_file_and_the_fix(tmp_path, partial_run, damage, capsys):
    run = tmp_path / "run"
    shutil.copytree(partial_run, run)
    latest = run / "checkpoints" / "latest.pt"
    data = latest.read_bytes()
    latest.write_bytes(
        {
            "truncated": data[: len(data) // 2],
            "empty": b"",
            "random": os.urandom(4096),
            "not_a_checkpoint": b"\x80\x04K\x07.",  # a pickled 7
        }[damage]
    )
    with pytest.raises(CheckpointError, match=rf"{latest}: .*(Delete it|--overwrite)"):
        runner.train(None, run, resume=True)
    with pytest.raises(CheckpointError, match=str(latest)):
        runner.evaluate(run, which="latest")
    assert main(["eval", str(run), "--which", "latest"]) == 1
    err = capsys.readouterr().err
    assert str(latest) in err and "Traceback" not in err


def test_leftovers_of_a_killed_write_are_removed(tmp_path, partial_run):
    run = tmp_path / "run"
    shutil.copytree(partial_run, run)
    leftover = run / "checkpoints" / ".latest.pt.k1ll3d.tmp"
    leftover.write_bytes(b"half a checkpoint")
    m = runner.train(None, run, resume=True)
    assert not leftover.exists()
    assert m["epochs_run"] == 2
    assert not list(run.rglob("*.tmp"))


def test_failed_run_is_described_as_failed(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps({"status": "failed", "error": "x"}))
    with pytest.raises(RunFolderError, match="already holds a failed run"):
        run_folder.prepare(run, resume=False, overwrite=False)


def test_R3_full_disk_writing_metrics_is_one_line(tmp_path, monkeypatch):
    import errno
    from pathlib import Path

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    target = tmp_path / "metrics.json"
    with pytest.raises(run_folder.DiskFullError, match=rf"^No space left on device: {target}$"):
        run_folder.write_text(target, "{}")
    with pytest.raises(PermissionError):  # other write errors pass through unchanged
        with run_folder.disk_full_as_error(target):
            raise PermissionError(errno.EACCES, "Permission denied")


# --------------------------------------------------------------------------- issue 28 item 3


def test_symlinked_lock_is_refused_and_its_target_untouched(tmp_path):
    run, victim = tmp_path / "r", tmp_path / "v"
    run.mkdir()
    victim.write_text("data\n")
    (run / ".lock").symlink_to("../v")
    with pytest.raises(UnsafeRunFolder, match=rf"^{run / '.lock'} is a symbolic link \(to ../v\)"):
        with run_folder.lock(run):
            pass
    assert victim.read_text() == "data\n"
    assert issubclass(UnsafeRunFolder, RunFolderError)


def test_dangling_lock_symlink_does_not_create_its_target(tmp_path):
    lock_file, target = tmp_path / ".tune-ask.lock", tmp_path / "elsewhere" / "created"
    target.parent.mkdir()
    lock_file.symlink_to(target)
    with pytest.raises(UnsafeRunFolder, match=f"{lock_file} is a symbolic link"):
        run_folder.open_lock_file(lock_file)
    assert not target.exists()


def test_open_lock_file_creates_a_plain_file_and_refuses_hard_links_and_folders(tmp_path):
    path = tmp_path / "a.lock"
    fd = run_folder.open_lock_file(path)
    try:
        os.write(fd, b"123\n")
        assert oct(os.stat(path).st_mode & 0o777) == oct(0o644 & ~_umask())
        assert os.get_inheritable(fd) is False
    finally:
        os.close(fd)
    os.close(run_folder.open_lock_file(path))  # an existing plain lock file opens again
    assert path.read_text() == "123\n"  # opening does not truncate
    victim = tmp_path / "victim"
    victim.write_text("data\n")
    os.link(victim, tmp_path / "hard.lock")
    with pytest.raises(UnsafeRunFolder, match=f"{tmp_path / 'hard.lock'} is a hard link"):
        run_folder.open_lock_file(tmp_path / "hard.lock")
    assert victim.read_text() == "data\n"
    (tmp_path / "dir.lock").mkdir()
    with pytest.raises(OSError):  # EISDIR: never a lock
        run_folder.open_lock_file(tmp_path / "dir.lock")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_symlinked_run_folder_is_refused_and_nothing_written_through_it(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UnsafeRunFolder, match=rf"^{tmp_path / 'link'} is a symbolic link \(to "):
        runner.train(one_epoch(), tmp_path / "link")
    assert list(real.iterdir()) == []
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    with pytest.raises(UnsafeRunFolder, match="dangling is a symbolic link"):
        with run_folder.lock(tmp_path / "dangling"):
            pass
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("resume", [False, True], ids=["fresh", "resume"])
def test_symlinked_run_output_is_refused_unless_overwrite_removes_the_link(tmp_path, resume):
    run, victim = tmp_path / "run", tmp_path / "victim"
    run.mkdir()
    victim.write_text("data\n")
    (run / "metrics.json").symlink_to(victim)
    with pytest.raises(UnsafeRunFolder, match=f"{run / 'metrics.json'} is a symbolic link"):
        run_folder.prepare(run, resume=resume, overwrite=False)
    (run / "config.yaml").symlink_to(tmp_path / "missing")  # dangling: would be created
    with pytest.raises(UnsafeRunFolder):
        run_folder.prepare(run, resume=resume, overwrite=False)
    if not resume:
        run_folder.prepare(run, resume=False, overwrite=True)
        assert not (run / "metrics.json").is_symlink() and not (run / "config.yaml").is_symlink()
    assert victim.read_text() == "data\n" and not (tmp_path / "missing").exists()


def test_nested_lock_is_shared_by_this_thread_only(tmp_path):
    import threading

    run = tmp_path / "run"
    with run_folder.lock(run, nested=True):
        with run_folder.lock(run):  # e.g. runner.train inside pool.run_job
            pass
        with run_folder.lock(tmp_path / "run" / ".." / "run"):  # same folder, other spelling
            pass
        errors = []

        def other_thread():
            try:
                with run_folder.lock(run):
                    pass
            except RunFolderBusy as e:
                errors.append(e)

        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        assert len(errors) == 1
    with run_folder.lock(run):  # plain locks still refuse each other in one process
        with pytest.raises(RunFolderBusy):
            with run_folder.lock(run):
                pass
    with run_folder.lock(run):  # released
        pass


def test_inside_resolves_dotdot_and_links(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert run_folder.inside(out, out / "m" / "seed0")
    assert run_folder.inside(out, out)
    assert not run_folder.inside(out, out / ".." / "seed0")
    assert not run_folder.inside(out, tmp_path / "outside")
    assert not run_folder.inside(out, tmp_path / "out2" / "x")  # a prefix is not a parent
    (out / "m").symlink_to(tmp_path)
    assert not run_folder.inside(out, out / "m" / "seed0")
    (out / "n").symlink_to(out / "m2")  # a link staying inside
    assert run_folder.inside(out, out / "n" / "seed0")
    assert run_folder.inside(tmp_path / "out" / ".." / "out", out / "a")
