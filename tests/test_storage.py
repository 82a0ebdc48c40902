"""bcrecord.storage: save/load round trips, atomic writes, clear errors."""

import copy
import dataclasses
import errno
import importlib
import io
import json
import os
import pickle
import re
import shutil
import sys
import types
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import bcrecord
from bcrecord.storage import StorageError, UnsavableValue, Writer, load, save

from .typed_text import JSON, SETTINGS, TYPED


def test_round_trip_of_plain_values_over_several_saves(tmp_path):
    writer = Writer(tmp_path)
    assert writer.write({"m:f:x@0": [1, 2], "m:f:y@0": [{"a": [1]}]}, step=0) == 3
    assert writer.write({"m:f:x@0": [3]}, step=5) == 1
    loaded = load(tmp_path)
    assert loaded["m:f:x@0"] == [1, 2, 3] and loaded.steps("m:f:x@0") == [0, 0, 5]
    assert loaded["m:f:y@0"] == [{"a": [1]}]
    assert json.loads((tmp_path / "index.json").read_text()) == {"format": "bcrecord-records", "version": 2}
    saves = (tmp_path / "index.jsonl").read_text().splitlines()
    assert len(saves) == 2  # one line per save
    row = json.loads(saves[0])["entries"][0]
    assert {"key", "step", "file", "kind", "shape", "dtype", "device", "bytes", "time"} <= set(row)
    # a later writer appends to the same directory
    Writer(tmp_path).write({"m:f:x@0": [4]}, step=6)
    assert load(tmp_path)["m:f:x@0"] == [1, 2, 3, 4]
    assert list(load(tmp_path, keys=["m:f:y@0"])) == ["m:f:y@0"]


def test_saves_a_recording(tmp_path):
    f = bcrecord.instrument(lambda a: a * 2, "return", name="lam")
    with bcrecord.recording() as rec:
        f(1)
        f(2)
    save(rec, tmp_path, step=1)
    assert load(tmp_path)["lam:<lambda>:return"] == [2, 4]


def test_what_was_loaded_saves_again_with_each_value_s_step_unless_a_step_is_given(tmp_path):
    # It was saved at step 0 (save's default) whatever steps the values had.
    for step, values in ((0, {"k": [1, 2]}), (3, {"k": [3], "j": ["a"]}), (0, {"k": [4]})):
        save(values, tmp_path / "first", step=step)
    again = load(save(load(tmp_path / "first"), tmp_path / "again"))
    assert (again["k"], again.steps("k")) == ([1, 2, 3, 4], [0, 0, 3, 0])
    assert (again["j"], again.steps("j")) == (["a"], [3])
    at = load(save(load(tmp_path / "first"), tmp_path / "at", step=7))
    assert (at["k"], at.steps("k"), at.steps("j")) == ([1, 2, 3, 4], [7, 7, 7, 7], [7])
    with pytest.raises(TypeError, match="a step is an integer, got 'x'"):
        save(load(tmp_path / "first"), tmp_path / "never", step="x")
    assert not (tmp_path / "never").exists()


def test_what_was_loaded_shows_as_its_counts_in_a_notebook(tmp_path):
    # A cell ending in bcrecord.load(folder) showed '<bcrecord.storage.Loaded object at 0x...>'.
    save({"m:f:x@0": [1, 2], "m:f:y@0": [3]}, tmp_path)
    assert repr(load(tmp_path)) == "<Loaded: 2 keys, 3 values>"
    assert repr(load(tmp_path, keys=["m:f:y@0"])) == "<Loaded: 1 key, 1 value>"


def test_a_save_cut_short_is_never_accepted(tmp_path, monkeypatch):
    Writer(tmp_path).write({"k": [1]}, step=0)
    real_dumps = json.dumps

    def crash_on_index(value, *args, **kwargs):
        if isinstance(value, dict) and "entries" in value:
            raise KeyboardInterrupt  # the process dies between the data file and the index
        return real_dumps(value, *args, **kwargs)

    monkeypatch.setattr(json, "dumps", crash_on_index)
    with pytest.raises(KeyboardInterrupt):
        Writer(tmp_path).write({"k": [2]}, step=1)
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "records").glob("[!.]*")) == ["000001.pkl", "000002.pkl"]
    assert load(tmp_path)["k"] == [1]  # the orphan file is ignored
    assert not [p for p in tmp_path.rglob(".*.tmp")]
    # A crash in the middle of the index line: readers ignore the part, the next save trims it.
    with open(tmp_path / "index.jsonl", "ab") as journal:
        journal.write(b'{"entries": [{"key": "k", "st')
    assert load(tmp_path)["k"] == [1]
    Writer(tmp_path).write({"k": [3]}, step=2)
    assert load(tmp_path)["k"] == [1, 3] and load(tmp_path).steps("k") == [0, 2]
    assert (tmp_path / "index.jsonl").read_text().count("\n") == 2


def _fsyncs(monkeypatch):
    """The paths ``os.fsync`` is given from now on, in order (read through /proc/self/fd)."""
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names a descriptor's file through /proc")
def test_a_save_syncs_its_data_file_then_the_directory_naming_it_then_the_index(tmp_path, monkeypatch):
    # The data file's rename was never synced: after a power loss the index, synced after
    # it, could name a data file missing from the directory (its values lost, a warning).
    writer = Writer(tmp_path)
    writer.write({"k": [0]}, step=0)
    synced = _fsyncs(monkeypatch)
    writer.write({"k": [1]}, step=1)
    records = os.path.realpath(tmp_path / "records")
    assert synced == [
        os.path.join(records, ".000002.pkl.tmp"),
        records,
        os.path.realpath(tmp_path / "index.jsonl"),
    ]
    assert load(tmp_path)["k"] == [0, 1]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names a descriptor's file through /proc")
def test_a_new_directory_s_header_and_an_upgrade_s_journal_are_synced_with_it(tmp_path, monkeypatch):
    # index.json (and the journal) were renamed into a new directory, and a version 1 index's
    # journal renamed before its header replaced the entries, none with a directory fsync: after
    # a power loss a run could read as no records directory, an upgraded one lose its entries.
    synced = _fsyncs(monkeypatch)
    Writer(tmp_path / "a" / "run")
    top, run = os.path.realpath(tmp_path), os.path.realpath(tmp_path / "a" / "run")
    # The new folder's name in its folder; the header in the directory made beside run's place,
    # its name there; then run's own name, renamed into place.
    made = os.path.dirname(synced[1])
    assert re.fullmatch(rf"\.run\.[\w-]+\.{os.getpid()}\.[0-9a-f]{{12}}\.making", os.path.basename(made))
    assert synced[:4] == [top, os.path.join(made, ".index.json.tmp"), made, os.path.dirname(run)]
    old = tmp_path / "old"
    (old / "records").mkdir(parents=True)
    (old / "index.json").write_text(json.dumps({"format": "bcrecord-records", "version": 1, "entries": []}))
    synced.clear()
    Writer(old)
    old = os.path.realpath(old)
    assert synced[-4:] == [
        os.path.join(old, ".index.jsonl.tmp"),
        old,  # the journal's rename, before the header replaces the version 1 index
        os.path.join(old, ".index.json.tmp"),
        old,
    ]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names a descriptor's file through /proc")
def test_a_records_folder_made_again_in_a_run_is_synced_with_it(tmp_path, monkeypatch):
    # records/ removed from a run (by the program) was made again with no fsync of the run's
    # directory: after a power loss the saves into it, synced, could be in a folder not there.
    save({"k": [1]}, tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "records")
    synced = _fsyncs(monkeypatch)
    Writer(tmp_path / "run").write({"k": [2]}, step=1)
    run = os.path.realpath(tmp_path / "run")
    assert synced[:2] == [run, os.path.join(run, "records", "..write-test.tmp")]  # before anything in it
    with pytest.warns(bcrecord.storage.DamagedRecords, match="000001.pkl"):  # (the value removed with it)
        assert load(tmp_path / "run")["k"] == [2] and synced.count(run) == 1


def test_a_new_directory_appears_with_its_header(tmp_path, monkeypatch):
    # bcrecord run makes -o at its first save: a `bcrecord view` (or a test polling load())
    # at that moment found the folder with records/ and no index.json, "not a bcrecord records
    # directory". It is made beside its place and renamed there whole.
    import bcrecord.storage as storage

    run, seen = tmp_path / "a" / "run", []
    write_header = storage._write_header
    monkeypatch.setattr(storage, "_write_header", lambda d: seen.append(run.exists()) or write_header(d))
    writer = Writer(run, make=False)
    assert (writer.write({"k": [1]}, step=0), seen) == (1, [False])
    assert load(run)["k"] == [1] and sorted(os.listdir(run.parent)) == ["run"]
    other = tmp_path / "b"  # made meanwhile by another writer: theirs stays, and is written to

    def made_meanwhile(directory):
        monkeypatch.setattr(storage, "_write_header", write_header)
        Writer(other)
        write_header(directory)

    monkeypatch.setattr(storage, "_write_header", made_meanwhile)
    Writer(other).write({"k": [2]}, step=1)
    assert load(other)["k"] == [2] and sorted(os.listdir(tmp_path)) == ["a", "b"]


def test_a_directory_there_already_is_filled_in_place_with_its_header_first(tmp_path, monkeypatch):
    # A directory the program removed and made again, empty (or made beforehand) was filled with
    # records/ first and its header last: a reader could find records/ there and no index.json,
    # "not a bcrecord records directory". Now the header comes first (the directory reads as
    # empty until records/ is there); the directory itself stays, its mode and inode kept.
    import bcrecord.storage as storage

    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o750)
    inode, seen = run.stat().st_ino, []
    make = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self == run / "records":
            seen.append(sorted(os.listdir(run)))
            seen.append(dict(load(run)))  # what a reader finds then
        return make(self, *args, **kwargs)

    monkeypatch.setattr(storage.Path, "mkdir", mkdir)
    assert Writer(run).write({"k": [1]}, step=0) == 1
    assert seen == [["index.json", "index.jsonl"], {}]
    assert load(run)["k"] == [1] and sorted(os.listdir(tmp_path)) == ["run"]
    assert run.stat().st_ino == inode and run.stat().st_mode & 0o777 == 0o750  # the same directory


def test_what_a_writer_killed_while_making_a_directory_left_goes_with_the_next_one(tmp_path):
    # A writer killed between making '.run.<random>.making' and renaming it to 'run' left that
    # folder there for good. Now it is named for its host and process, and the next writer to
    # make a directory removes the ones of processes of this host that are gone.
    import subprocess

    import bcrecord.storage as storage

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead, host = int(gone.stdout), storage._HOST
    left = [
        f".run.{host}.{dead}.0123456789ab.making",  # a dead writer's: goes
        f".run.{host}.{os.getpid()}.0123456789ab.making",  # a live writer's (this process): stays
        f".run.another-host.{dead}.0123456789ab.making",  # another host's: its pid means nothing here
        f".run.x.{host}.{dead}.0123456789ab.making",  # a directory named 'run.x': not run's
        ".run.0123456789ab.making",  # an older bcrecord's: whose it is cannot be told
    ]
    for name in left:
        (tmp_path / name / "records").mkdir(parents=True)
    Writer(tmp_path / "run").write({"k": [1]}, step=0)
    assert sorted(os.listdir(tmp_path)) == sorted(left[1:] + ["run"])
    assert load(tmp_path / "run")["k"] == [1]
    # And one killed for real, in the middle of making it.
    killer = "import os, signal, sys, bcrecord.storage as s\n"
    killer += "s._write_header = lambda d: os.kill(os.getpid(), signal.SIGKILL)\ns.Writer(sys.argv[1])\n"
    subprocess.run(
        [sys.executable, "-c", killer, str(tmp_path / "b")],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    (killed,) = [name for name in os.listdir(tmp_path) if name.startswith(".b.")]
    assert killed.endswith(".making") and not (tmp_path / "b").exists()
    Writer(tmp_path / "b")
    assert [name for name in os.listdir(tmp_path) if name.startswith(".b.")] == []
    assert (tmp_path / "b" / "index.json").is_file()


def test_a_writer_in_another_pid_namespace_keeps_this_one_s_making_folder(tmp_path):
    # A process in another pid namespace under the same host name (a container sharing it: Docker's
    # --uts=host, a Kubernetes pod on the host network) found a live writer's '.run.<host>.<pid>...'
    # folder's pid gone in its own namespace and removed it while it was made: that writer's
    # save failed ('No such file or directory'). Each namespace's folders are now named apart.
    import subprocess

    import bcrecord.storage as storage

    if not shutil.which("unshare"):
        pytest.skip("no unshare here")
    ours = storage._staging(tmp_path / "run")  # (this process's, alive)
    ours.mkdir()
    remover = "import os, bcrecord.storage as s\ns._remove_dead_stagings(s.Path(os.environ['D']) / 'run')\n"
    other = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--pid",
            "--fork",
            sys.executable,
            "-c",
            remover + "print(os.getpid())",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "D": str(tmp_path)},
    )
    if other.returncode != 0:
        pytest.skip(f"no pid namespace can be made here: {other.stderr}")
    assert other.stdout.split()[0] == "1"  # (in a namespace of its own: this pid is not there)
    assert os.listdir(tmp_path) == [ours.name]


def test_a_directory_with_a_long_name_is_made(tmp_path):
    # A name of 220 characters (under the file system's 255) was refused: 'File name too long',
    # naming the '.NAME.<host>.<pid>.<random>.making' folder it is made in first, 33 or more
    # characters longer. That folder's name is now cut to fit; a dead writer's is still removed.
    import subprocess

    import bcrecord.storage as storage

    for length in (220, 255):
        run = tmp_path / ("r" * length)
        assert Writer(run).write({"k": [length]}, step=0) == 1
        assert load(run)["k"] == [length] and len(os.listdir(tmp_path)) == 1
        shutil.rmtree(run)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    left = storage._staging(run).name.replace(f".{os.getpid()}.", f".{int(gone.stdout)}.")
    (tmp_path / left).mkdir()
    Writer(run)
    assert os.listdir(tmp_path) == [run.name]


def test_a_writer_killed_writing_the_header_of_a_directory_there_leaves_no_file(tmp_path):
    # A writer killed while writing the header of a directory that was there (filled in place)
    # left its temporary '.index.json.<pid>.<random>.tmp' in it for good, the next writer's
    # saves beside it. Now it is named as a making folder is, and the next writer removes it.
    import subprocess

    import bcrecord.storage as storage

    run = tmp_path / "run"
    run.mkdir()
    live = f".index.json.{storage._HOST}.{os.getpid()}.0a1b2c3d.tmp"  # (this process's: stays)
    (run / live).write_bytes(b"")
    killer = "import os, sys, bcrecord.storage as s\nreplace = os.replace\n"
    killer += "s.os.replace = lambda a, b: str(b).endswith('index.json') and os.kill(os.getpid(), 9)"
    killer += " or replace(a, b)\n"
    subprocess.run(
        [sys.executable, "-c", killer + "s.Writer(sys.argv[1])\n", str(run)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert len([name for name in os.listdir(run) if name.startswith(".index.json.")]) == 2
    Writer(run).write({"k": [1]}, step=0)
    assert sorted(os.listdir(run)) == [live, "index.json", "index.jsonl", "records"]
    assert load(run)["k"] == [1]


def test_a_run_s_records_folder_is_refused_as_a_records_directory(tmp_path):
    # `run -o out/records` saved a run inside the run in out: its records/records/ and its
    # index nested in out's records folder, where loading out never looks.
    save({"k": [1]}, tmp_path / "out", step=0)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(StorageError, match=r"records folder of the saved run in .*out; save to"):
        Writer(tmp_path / "out" / "records")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing made
    Writer(tmp_path / "elsewhere" / "records").write({"k": [2]}, step=0)  # a folder named so, alone
    assert load(tmp_path / "elsewhere" / "records")["k"] == [2]
    # A version 1 run (every entry in index.json, no index.jsonl) was not told apart from one.
    old = tmp_path / "old"
    (old / "records").mkdir(parents=True)
    (old / "index.json").write_text(json.dumps({"format": "bcrecord-records", "version": 1, "entries": []}))
    with pytest.raises(StorageError, match=r"records folder of the saved run in .*old; save to"):
        Writer(old / "records")
    assert sorted(p.name for p in old.rglob("*")) == ["index.json", "records"]  # nothing made
    (tmp_path / "other").mkdir()  # another program's index.json: its records folder is not a run's
    (tmp_path / "other" / "index.json").write_text('{"format": "another"}')
    Writer(tmp_path / "other" / "records").write({"k": [3]}, step=0)
    assert load(tmp_path / "other" / "records")["k"] == [3]


def test_the_next_save_removes_what_a_save_killed_mid_write_left(tmp_path):
    import subprocess

    Writer(tmp_path).write({"k": [0]}, step=0)
    # A process killed between writing its data file and renaming it.
    killed = (
        "import os, sys, bcrecord.storage as s\n"
        "writer = s.Writer(sys.argv[1])\n"
        "os.replace = lambda *args: os._exit(9)\n"
        "writer.write({'k': [list(range(1000))]}, step=1)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    assert subprocess.run([sys.executable, "-c", killed, str(tmp_path)], env=env).returncode == 9
    records = tmp_path / "records"
    assert [p.name for p in records.glob(".*.tmp")] == [".000002.pkl.tmp"]
    (records / ".000002.safetensors.tmp").write_bytes(b"what a save with tensors left")
    save({"k": [2]}, tmp_path, step=2)  # the killed save's number, pickles only
    assert not list(records.glob(".*.tmp"))
    assert sorted(p.name for p in records.glob("[!.]*")) == ["000001.pkl", "000002.pkl"]
    assert load(tmp_path)["k"] == [0, 2] and load(tmp_path).steps("k") == [0, 2]


def test_a_save_waits_for_another_process_s_save_in_progress_and_both_are_kept(tmp_path):
    import subprocess
    import threading

    Writer(tmp_path)
    # Another process in the middle of a save (its temporary file being written) until we let it
    # go: a gate, not a sleep, so a slow machine cannot let it finish before we look.
    slow = (
        "import os, sys, bcrecord.storage as s\n"
        "writer = s.Writer(sys.argv[1])\n"
        "real, gated = os.fsync, []\n"
        "def slow(fd):\n"
        "    if not gated:  # the record's own file; the index's later fsyncs pass\n"
        "        gated.append(print('writing', flush=True))\n"
        "        sys.stdin.readline()\n"
        "    real(fd)\n"
        "os.fsync = slow\n"
        "writer.write({'k': ['theirs']}, step=0)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    other = subprocess.Popen(
        [sys.executable, "-c", slow, str(tmp_path)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    ours = threading.Thread(target=save, args=({"k": ["ours"]}, tmp_path), kwargs={"step": 1})
    try:
        assert other.stdout.readline() == "writing\n"
        assert [p.name for p in (tmp_path / "records").glob(".*.tmp")] == [".000001.pkl.tmp"]
        ours.start()
        ours.join(0.5)
        assert ours.is_alive()  # waiting: the other save cannot end before the gate opens
        other.stdin.write("go\n")
        other.stdin.flush()
        ours.join(60)
    finally:
        other.stdin.close()
        assert other.wait(60) == 0
    assert not ours.is_alive()
    loaded = load(tmp_path)
    assert loaded["k"] == ["theirs", "ours"] and loaded.steps("k") == [0, 1]


def test_saves_append_to_the_index_and_writers_see_each_other(tmp_path):
    first, second = Writer(tmp_path), Writer(tmp_path)
    for step in range(3):
        first.write({"a": [step]}, step)
        second.write({"b": [-step]}, step)
    loaded = load(tmp_path)
    assert loaded["a"] == [0, 1, 2] and loaded["b"] == [0, -1, -2]
    # six saves, six data files: neither writer reused the other's file number
    assert len(list((tmp_path / "records").glob("*.pkl"))) == 6
    damaged = tmp_path / "index.jsonl"
    damaged.write_text("not json\n" + damaged.read_text())
    with pytest.raises(StorageError, match="save 1 is damaged"):
        load(tmp_path)


def test_a_version_1_directory_loads_and_takes_more_saves(tmp_path):
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "000001.pkl").write_bytes(pickle.dumps({"k#0#0": 10}))
    row = {"key": "k", "step": 0, "file": "records/000001.pkl", "name": "k#0#0", "kind": "pickle"}
    version_1 = {"format": "bcrecord-records", "version": 1, "entries": [row]}
    (tmp_path / "index.json").write_text(json.dumps(version_1))
    assert load(tmp_path)["k"] == [10]
    Writer(tmp_path).write({"k": [20]}, step=1)
    assert load(tmp_path)["k"] == [10, 20] and load(tmp_path).steps("k") == [0, 1]
    assert json.loads((tmp_path / "index.json").read_text())["version"] == 2
    assert sorted(p.name for p in (tmp_path / "records").glob("[!.]*")) == ["000001.pkl", "000002.pkl"]


def test_loading_tensors_without_torch_says_torch_is_missing_not_safetensors(tmp_path, monkeypatch):
    # 'bcrecord[save]' installs safetensors alone; its torch module imports torch. The error
    # said to install safetensors (installed already).
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "torch.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
    )
    safetensors = types.ModuleType("safetensors")
    safetensors.__path__ = [str(tmp_path / "fake")]
    monkeypatch.setitem(sys.modules, "safetensors", safetensors)
    monkeypatch.delitem(sys.modules, "safetensors.torch", raising=False)
    folder = tmp_path / "out"
    save({"n": [3]}, folder)
    row = {"key": "t", "step": 0, "file": "records/000002.safetensors", "name": "t#0#0", "kind": "tensor"}
    with open(folder / "index.jsonl", "a") as journal:
        journal.write(json.dumps({"entries": [row]}) + "\n")
    (folder / "records" / "000002.safetensors").write_bytes(b"")
    with pytest.raises(StorageError) as caught:
        load(folder)
    assert str(caught.value) == (
        f"{folder / 'records' / '000002.safetensors'} holds tensors: loading them needs torch (pip install "
        "torch); bcrecord.load(DIR, keys=[...]) reads the other keys without it"
    )
    assert load(folder, keys=["n"])["n"] == [3]


def test_loading_tensors_with_neither_torch_nor_safetensors_names_both(tensors_without_torch):
    # It said to install safetensors alone: once installed, the next load said torch was missing.
    folder = tensors_without_torch
    with pytest.raises(bcrecord.storage.TensorsNeedTorch) as caught:  # (a StorageError)
        load(folder)
    assert caught.value.needs == "torch and the safetensors package (pip install torch 'bcrecord[save]')"
    assert str(caught.value) == (
        f"{folder / 'records' / '000002.safetensors'} holds tensors: loading them needs torch and the "
        "safetensors package (pip install torch 'bcrecord[save]'); bcrecord.load(DIR, keys=[...]) reads "
        "the other keys without them"
    )
    assert load(folder, keys=["n"])["n"] == [3]


def test_unwritable_directory_and_full_disk_give_clear_errors(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match=f"cannot write records to {blocker}/sub"):
        Writer(blocker / "sub")
    writer = Writer(tmp_path / "ok")

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(StorageError, match="No space left on device"):
        writer.write({"k": [1]}, step=0)
    monkeypatch.undo()
    assert len(load(tmp_path / "ok")) == 0  # the failed save left nothing behind
    with pytest.raises(StorageError, match="no index.json"):
        load(tmp_path)
    with pytest.raises(StorageError, match="^no such directory: .*nosuch$"):
        load(tmp_path / "nosuch")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "index.json").write_text("{}")
    with pytest.raises(StorageError, match="not a bcrecord records index"):
        load(tmp_path / "bad")


def test_write_many_buffers_steps_into_one_save(tmp_path):
    writer = Writer(tmp_path)
    assert writer.write_many([(step, {"k": [step * 10]}) for step in range(5)]) == 5
    loaded = load(tmp_path)
    assert loaded["k"] == [0, 10, 20, 30, 40] and loaded.steps("k") == [0, 1, 2, 3, 4]
    assert [p.suffix for p in (tmp_path / "records").glob("[!.]*")] == [".pkl"]


def test_write_many_keeps_every_value_of_a_step_given_twice(tmp_path):
    writer = Writer(tmp_path)
    assert writer.write_many([(7, {"k": [1]}), (7, {"k": [2, 3]}), (8, {"k": [4]})]) == 4
    loaded = load(tmp_path)
    assert loaded["k"] == [1, 2, 3, 4] and loaded.steps("k") == [7, 7, 7, 8]


class Unpicklable:
    def __reduce__(self):
        raise TypeError("not today")

    def __repr__(self):
        return "<Unpicklable>"


def test_a_value_pickle_refuses_is_named_and_the_save_writes_nothing(tmp_path):
    writer = Writer(tmp_path)
    with pytest.raises(
        UnsavableValue,
        match=r"^cannot save 'm:f:odd@0' \(step 4\): Unpicklable cannot be pickled \(TypeError: not today\)$",
    ):
        writer.write_many([(3, {"m:f:x@0": [1]}), (4, {"m:f:x@0": [2], "m:f:odd@0": [Unpicklable()]})])
    assert len(load(tmp_path)) == 0 and list((tmp_path / "records").glob("[!.]*")) == []
    assert writer.write({"m:f:x@0": [5]}, step=5) == 1  # the writer goes on
    assert load(tmp_path).steps("m:f:x@0") == [5]


def test_save_into_a_new_directory_that_refuses_a_value_leaves_no_directory(tmp_path):
    folder = tmp_path / "new"
    with pytest.raises(UnsavableValue, match="cannot save 'm:f:odd@0'"):
        save({"m:f:x@0": [1], "m:f:odd@0": [Unpicklable()]}, folder)
    assert not folder.exists()
    save({"m:f:x@0": [1]}, folder)  # one that was there before keeps everything
    with pytest.raises(UnsavableValue):
        save({"m:f:odd@0": [Unpicklable()]}, folder, step=1)
    assert load(folder)["m:f:x@0"] == [1]


def test_a_save_that_refuses_a_value_makes_no_folder_above_its_directory_nor_fills_an_empty_one(tmp_path):
    # The folders above a new directory stayed (a, a/b), and an empty folder given kept a header,
    # an index and records/.lock: it read as a records directory with no save.
    odd = {"m:f:odd@0": [Unpicklable()]}
    with pytest.raises(UnsavableValue, match="cannot save 'm:f:odd@0'"):
        save(odd, tmp_path / "a" / "b" / "run")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UnsavableValue, match="cannot save 'm:f:odd@0'"):
        save(odd, tmp_path / "empty")
    writer = Writer(tmp_path / "later" / "run", make=False)  # (bcrecord run's: made by its first save)
    with pytest.raises(UnsavableValue, match="cannot save 'm:f:odd@0'"):
        writer.write(odd, step=0)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["empty"]
    assert not writer.made and writer.write({"m:f:x@0": [1]}, step=1) == 1
    assert load(tmp_path / "later" / "run").steps("m:f:x@0") == [1]


def test_a_save_into_a_folder_whose_records_is_a_file_is_refused_before_anything_is_written(tmp_path):
    # It wrote index.json and index.jsonl, then said 'File exists' of records: the user's folder
    # then read as a records directory.
    (tmp_path / "records").write_text("mine")
    for attempt in (lambda: save({"k": [1]}, tmp_path), lambda: Writer(tmp_path)):
        with pytest.raises(StorageError) as caught:
            attempt()
        assert (
            str(caught.value)
            == f"cannot write records to {tmp_path}: {tmp_path / 'records'} is a file, not a folder"
        )
        assert os.listdir(tmp_path) == ["records"] and (tmp_path / "records").read_text() == "mine"


def test_a_writer_refuses_a_directory_whose_index_is_damaged_before_saving(tmp_path):
    # A save added there would be one that load() refuses with the rest. (save() makes a
    # writer per call and reads the last save only: per-step saves stay quick.)
    save({"m:f:x@0": [1]}, tmp_path)
    journal = tmp_path / "index.jsonl"
    journal.write_bytes(b"{not json\n" + journal.read_bytes())
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(StorageError, match=r"index.jsonl: save 1 is damaged"):
        Writer(tmp_path)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_writer_told_not_to_make_its_directory_makes_it_with_the_first_save_only(tmp_path):
    writer = Writer(tmp_path / "run" / "a", make=False)
    assert (writer.made, writer.saved, writer.last_step) == (False, 0, None)
    assert not (tmp_path / "run").exists()
    assert writer.write({"m:f:x@0": [1, 2]}, step=3) == 2
    assert writer.made and load(tmp_path / "run" / "a").steps("m:f:x@0") == [3, 3]
    # A directory there already, a file in the way: checked (and made) at once, as make=True does.
    save({"m:f:x@0": [1]}, tmp_path / "b")
    assert Writer(tmp_path / "b", make=False).saved == 1
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError) as caught:
        Writer(tmp_path / "file" / "c", make=False)
    said = f"cannot write records to {tmp_path / 'file' / 'c'}: {tmp_path / 'file'} is a file, not a folder"
    assert str(caught.value) == said


@pytest.mark.parametrize(
    "flags, said",
    [
        ({"check": "no"}, "check is True or False, got 'no'"),
        ({"make": None}, "make is True or False, got None"),
    ],
)
def test_a_writer_s_flags_that_are_no_bools_are_refused_before_anything_is_made(tmp_path, flags, said):
    # check='no' checked every save; make=None made the folder at once.
    with pytest.raises(TypeError, match=f"^{re.escape(said)}$"):
        Writer(tmp_path / "run", **flags)
    assert list(tmp_path.iterdir()) == []


def test_a_save_under_a_file_or_into_one_names_that_file_not_a_staging_folder(tmp_path):
    # It named the folder the directory is made in first:
    # 'Not a directory (.../afile/.run.HOST.PID.making/records)'.
    (tmp_path / "afile").write_text("mine")
    for under, said in (
        ("afile/run", tmp_path / "afile"),
        ("afile/a/b", tmp_path / "afile"),
        ("afile", "it"),
    ):
        with pytest.raises(StorageError) as caught:
            save({"k": [1]}, tmp_path / under)
        assert (
            str(caught.value) == f"cannot write records to {tmp_path / under}: {said} is a file, not a folder"
        )
    assert os.listdir(tmp_path) == ["afile"] and (tmp_path / "afile").read_text() == "mine"


def test_a_writer_not_made_yet_reads_what_another_saved_in_its_directory_meanwhile(tmp_path):
    # saved and last_step promise the directory's state (by any writer), yet a writer that had
    # not made its directory read 0 and None where another process had made it, with values.
    import subprocess

    run = tmp_path / "run"
    writer = Writer(run, make=False)
    other = f"import bcrecord; bcrecord.save({{'k': [1, 2]}}, {str(run)!r}, step=7)"
    subprocess.run(
        [sys.executable, "-c", other], check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    )
    assert (writer.made, writer.saved, writer.last_step) == (False, 2, 7)
    half = tmp_path / "half"
    waiting = Writer(half, make=False)
    half.mkdir()  # made meanwhile by another process's writer, killed before records/ (filled in place)
    (half / "index.jsonl").touch()
    bcrecord.storage._write_header(half)
    assert (waiting.made, waiting.saved, waiting.last_step) == (False, 0, None)
    assert writer.write({"k": [3]}, step=8) == 1 and (writer.saved, writer.last_step) == (3, 8)
    assert load(run)["k"] == [1, 2, 3]


def test_with_unsavable_a_value_pickle_refuses_is_saved_as_its_repr_and_the_rest_as_they_are(tmp_path):
    told = []
    batches = [(3, {"x": [1, 2], "odd": [Unpicklable()]}), (4, {"x": [3], "odd": [None, Unpicklable()]})]
    assert Writer(tmp_path).write_many(batches, unsavable=lambda *why: told.append(why)) == 6
    loaded = load(tmp_path)
    assert loaded["x"] == [1, 2, 3] and loaded.steps("x") == [3, 3, 4]
    assert loaded["odd"] == ["<Unpicklable>", None, "<Unpicklable>"] and loaded.steps("odd") == [3, 4, 4]
    why = "Unpicklable cannot be pickled (TypeError: not today)"
    assert told == [("odd", 3, why), ("odd", 4, why)]  # the caller decides how often to warn
    assert Writer(tmp_path).write({"fine": [1]}, step=5, unsavable=told.append) == 1 and len(told) == 2


def test_an_empty_save_gives_a_directory_that_loads(tmp_path):
    assert save({}, tmp_path / "empty") == tmp_path / "empty"
    assert len(load(tmp_path / "empty")) == 0
    Writer(tmp_path / "unused")  # a run that records nothing
    assert len(load(tmp_path / "unused")) == 0


def test_writers_into_one_directory_keep_each_other_s_saves(tmp_path):
    first, second = Writer(tmp_path), Writer(tmp_path)
    first.write({"a": [1]}, step=0)
    second.write({"b": [2]}, step=0)
    save({"c": [3]}, tmp_path, step=1)
    first.write({"a": [4]}, step=2)
    loaded = load(tmp_path)
    assert {key: loaded[key] for key in loaded} == {"a": [1, 4], "b": [2], "c": [3]}
    assert len(list((tmp_path / "records").glob("[!.]*"))) == 4  # no data file overwritten


def test_a_relative_directory_stays_where_it_was_when_the_program_changes_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    writer = Writer("out")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    writer.write({"k": [1]}, step=0)
    assert load(tmp_path / "out")["k"] == [1] and not (tmp_path / "elsewhere" / "out").exists()


def test_a_directory_under_home_written_with_a_tilde_is_under_home(tmp_path, monkeypatch):
    # '~/runs' was a folder named '~' in the working directory (which 'rm -rf ~' then removes).
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert save({"k": [1.5]}, "~/runs", step=2) == tmp_path / "home" / "runs"
    Writer("~/runs").write({"k": [2.5]}, step=3)
    assert not (tmp_path / "~").exists()
    assert load(tmp_path / "home" / "runs").steps("k") == [2, 3]
    assert load("~/runs")["k"] == [1.5, 2.5] and bcrecord.storage.saved_keys("~/runs") == ["k"]


def test_a_folder_named_tilde_written_as_the_shell_writes_one_is_that_folder_not_home(tmp_path, monkeypatch):
    # './~' and './~backup' were expanded as '~' and '~backup': pathlib drops the './' first, and
    # the run was saved into a home folder ('~backup' is /var/backups on Debian).
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert save({"k": [1.5]}, "./~", step=0).absolute() == tmp_path / "~"
    assert save({"k": [2.5]}, "./~root/x", step=1).absolute() == tmp_path / "~root" / "x"
    assert not (tmp_path / "home").exists()
    assert load("./~")["k"] == [1.5] and load("./~root/x")["k"] == [2.5]


def test_a_tilde_naming_no_user_here_is_refused_saying_how_to_name_such_a_folder(tmp_path, monkeypatch):
    # It raised pathlib's RuntimeError ("Could not determine home directory"): a traceback.
    monkeypatch.chdir(tmp_path)
    told = "'~nosuchuser7/x': there is no user 'nosuchuser7' on this machine"
    for attempt in (lambda: save({"k": [1]}, "~nosuchuser7/x"), lambda: load("~nosuchuser7/x")):
        with pytest.raises(StorageError, match=re.escape(told) + r".*give '\./~nosuchuser7/x'"):
            attempt()
    assert os.listdir(tmp_path) == []


def test_a_folder_whose_records_folder_holds_files_of_its_own_is_refused_before_any_is_replaced(tmp_path):
    # A folder without an index whose records/ held 000001.pkl (a user's) got it replaced.
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "000001.pkl").write_bytes(b"user data")
    with pytest.raises(StorageError, match="its records folder holds files no run of bcrecord's wrote"):
        save({"k": [1]}, tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["records"] and os.listdir(tmp_path / "records") == ["000001.pkl"]
    assert (tmp_path / "records" / "000001.pkl").read_bytes() == b"user data"
    (tmp_path / "records" / "000001.pkl").unlink()
    (tmp_path / "records" / ".lock").touch()  # what a run removed while killed may leave: taken
    assert save({"k": [1]}, tmp_path) == tmp_path and load(tmp_path)["k"] == [1]


def test_saved_index_lists_every_saved_value_in_save_order_without_reading_one(tmp_path):
    save({"a": [1, 2], "b": [3.5]}, tmp_path, step=4)
    save({"a": [5]}, tmp_path, step=7)
    (tmp_path / "records" / "000001.pkl").write_bytes(b"damaged")  # no value is read
    rows = bcrecord.storage.saved_index(tmp_path)
    assert [(row["key"], row["step"], row["dtype"]) for row in rows] == [
        ("a", 4, "int"),
        ("a", 4, "int"),
        ("b", 4, "float"),
        ("a", 7, "int"),
    ]
    assert [row["file"] for row in rows] == ["records/000001.pkl"] * 3 + ["records/000002.pkl"]


class _NotMaterialized:
    """A value whose array attributes raise until it is materialized (it pickles all the same)."""

    def __init__(self, size):
        self.size = size

    def __eq__(self, other):
        return type(other) is _NotMaterialized and other.size == self.size

    @property
    def shape(self):
        raise RuntimeError("not materialized")

    dtype = nbytes = shape


def test_a_value_whose_shape_raises_is_saved_as_it_is(tmp_path):
    # The index's description read its shape: the save was refused (UnsavableValue), and under
    # bcrecord run, which saves reprs of values a save refuses, every later value was lost.
    save({"k": [1, _NotMaterialized(3)]}, tmp_path, step=4)
    loaded = load(tmp_path)
    assert loaded["k"] == [1, _NotMaterialized(3)] and loaded.steps("k") == [4, 4]
    info = loaded.entries[1].info
    assert (info["shape"], info["dtype"], info["bytes"]) == (None, "_NotMaterialized", None)


class _Step:
    """An integer type of another library (numpy's int64)."""

    def __index__(self) -> int:
        return 4


@pytest.mark.parametrize(
    "index, why",
    [
        ('{"name": "my project"}', "not a bcrecord records index"),
        ("not json", "cannot read"),
        (
            '{"format": "bcrecord-records", "version": 99}',
            "version 99 is not supported, written by a newer bcrecord "
            "\\(this bcrecord reads versions 1 to 2\\): upgrade bcrecord to read it",
        ),
        (
            '{"format": "bcrecord-records", "version": "2"}',
            "version '2' is not supported, this bcrecord reads",
        ),
        # Equal to 1, not version 1: it was read as one (an empty run, 'saved keys: ' of none).
        ('{"format": "bcrecord-records", "version": true}', "version True is not supported, this bcrecord"),
        ('{"format": "bcrecord-records", "version": 1.0}', "version 1.0 is not supported, this bcrecord"),
    ],
)
def test_a_directory_that_is_not_a_records_directory_is_refused_and_left_as_it_was(tmp_path, index, why):
    (tmp_path / "index.json").write_text(index)
    for attempt in (lambda: Writer(tmp_path), lambda: save({"k": [1]}, tmp_path), lambda: load(tmp_path)):
        with pytest.raises(StorageError, match=why):
            attempt()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["index.json"]  # no records/, no lock


@pytest.mark.skipif(os.name == "nt", reason="a working directory in use cannot be removed")
def test_a_relative_save_dir_in_a_removed_working_directory_is_a_clear_error(tmp_path, monkeypatch):
    # It was os.getcwd()'s FileNotFoundError, a traceback out of `bcrecord run -o out`.
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(StorageError) as caught:
        Writer("out")
    assert str(caught.value) == (
        "cannot write records to out: it is relative to the working directory, which was removed"
    )


@pytest.mark.skipif(not hasattr(os, "symlink") or os.name == "nt", reason="needs symlinks")
def test_a_save_dir_that_is_a_dangling_link_says_where_it_points(tmp_path):
    # It said "cannot write records to DIR: File exists (DIR)", of a directory that is not there.
    link = tmp_path / "runs"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(StorageError) as caught:
        Writer(link)
    assert str(caught.value) == (
        f"cannot write records to {link}: {link} is a link to {tmp_path / 'gone'}, which does not exist"
    )
    assert not (tmp_path / "gone").exists()


@pytest.mark.parametrize("lines", ['{"text": "hello"}\n{"text": "world"}', '{"text": "one line"}\n'])
def test_another_program_s_index_jsonl_is_refused_and_left_as_it_was(tmp_path, lines):
    # JSON Lines data: kept as a journal whose header was lost, its last line would be
    # trimmed, or the whole file taken over
    (tmp_path / "index.jsonl").write_text(lines)
    for attempt in (lambda: Writer(tmp_path), lambda: save({"k": [1]}, tmp_path)):
        with pytest.raises(StorageError, match="has an index.jsonl that bcrecord did not write"):
            attempt()
        assert [p.name for p in tmp_path.iterdir()] == ["index.jsonl"]
        assert (tmp_path / "index.jsonl").read_text() == lines
    # bcrecord's own journal whose index.json was lost is kept (and a header written again)
    own = tmp_path / "own"
    save({"k": [1]}, own)
    (own / "index.json").unlink()
    save({"k": [2]}, own, step=1)
    assert load(own)["k"] == [1, 2]


def test_an_empty_directory_name_is_refused(tmp_path, monkeypatch):
    # Path("") is the working directory: what an unset shell variable gives (-o "$OUT"). Loading
    # read the working directory's records for it ('bcrecord view ""'), where saving refused.
    class Unset:
        def __fspath__(self):
            return ""

    monkeypatch.chdir(tmp_path)
    save({"k": [1]}, ".")  # records in the working directory, which "" is not taken for
    for empty in ("", Unset()):
        for use in (
            Writer,
            load,
            bcrecord.storage.saved_index,
            lambda d: list(bcrecord.storage.iter_saved_index(d)),
        ):
            with pytest.raises(StorageError, match="the records directory is an empty string"):
                use(empty)


class _Flag:
    """A bool of an array library: an index (1), of dtype bool."""

    dtype = "bool"

    def __index__(self):
        return 1

    def __repr__(self):
        return "True"


@pytest.mark.parametrize(
    "records, step, why",
    [
        ({"name": "resnet"}, 0, """the values of 'name' are a str, not a list of values (give ["text"]"""),
        ({"loss": 0.5}, 0, "the values of 'loss' are a float, not a list of values (give [value]"),
        (5, 0, "records are a Recording or a dict of key -> list of values, got int"),
        ({1: [1]}, 0, "a key is a string, got 1"),
        ({"k": [1]}, "3", "a step is an integer"),
        ({"k": [1]}, True, "a step is an integer, got True (bool)"),  # (was saved as step 1)
        ({"k": [1]}, _Flag(), "a step is an integer, got True (_Flag)"),  # (numpy's or torch's bool)
    ],
)
def test_a_bad_save_says_what_is_wrong_and_makes_no_directory(tmp_path, records, step, why):
    with pytest.raises(TypeError, match=re.escape(why)):
        save(records, tmp_path / "new", step=step)
    assert not (tmp_path / "new").exists()


def test_any_sequence_of_values_saves(tmp_path):
    from collections import UserList, deque

    save({"a": UserList([1]), "b": range(2), "c": deque([3], maxlen=1), "d": (4,)}, tmp_path)
    assert dict(load(tmp_path)) == {"a": [1], "b": [0, 1], "c": [3], "d": [4]}


def test_load_takes_one_key_or_several(tmp_path):
    save({"m:f:x@0": [1], "m:f:y@0": [2]}, tmp_path)
    assert dict(load(tmp_path, keys="m:f:x@0")) == {"m:f:x@0": [1]}
    assert dict(load(tmp_path, keys=["m:f:y@0"])) == {"m:f:y@0": [2]}
    with pytest.raises(TypeError, match="keys is a key or a list of keys, got 3"):
        load(tmp_path, keys=3)  # (was "'int' object is not iterable")
    with pytest.raises(TypeError, match=r"keys is a key or a list of keys, got b'm:f:x@0'"):
        load(tmp_path, keys=b"m:f:x@0")  # (was "a key is a string, got 109 (int)": its bytes)


def test_steps_are_integers_of_any_integer_type(tmp_path):
    save({"k": [1]}, tmp_path, step=_Step())
    assert load(tmp_path).steps("k") == [4]
    with pytest.raises(TypeError, match=r"a step is an integer, got '4' \(str\)"):
        save({"k": [2]}, tmp_path, step="4")
    assert load(tmp_path)["k"] == [1]


def test_a_local_s_key_without_its_assignment_suggests_the_saved_one(tmp_path):
    loaded = load(save({"__main__:train_step:loss@0": [1.5]}, tmp_path))
    for typed in ("__main__:train_step:loss", "prog:train_step:loss@0"):  # ('prog': the script's stem)
        with pytest.raises(KeyError, match=r"did you mean '__main__:train_step:loss@0'\?"):
            loaded[typed]


def test_a_missing_key_names_the_saved_ones_for_values_and_steps(tmp_path):
    loaded = load(save({"m:f:x@0": [1]}, tmp_path))
    for read in (loaded.__getitem__, loaded.steps):
        with pytest.raises(
            KeyError, match="no saved values for 'm:f:y@0'; did you mean 'm:f:x@0'.; saved keys: m:f:x@0"
        ):
            read("m:f:y@0")


def test_writers_made_at_once_in_threads_all_work(tmp_path):
    import threading

    errors = []

    def save(n):
        try:
            Writer(tmp_path).write({f"k{n}": [n]}, step=n)
        except Exception as error:  # collected: the assert below names it
            errors.append(error)

    threads = [threading.Thread(target=save, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and sorted(load(tmp_path)) == [f"k{n}" for n in range(8)]


def test_the_index_survives_what_a_person_may_do_to_it(tmp_path):
    Writer(tmp_path).write({"k": [1]}, step=0)
    with open(tmp_path / "index.jsonl", "a") as journal:
        journal.write("\n")  # an editor's trailing newline: a blank line
    (tmp_path / "index.json").unlink()  # the header lost: the saves in the journal stay
    writer = Writer(tmp_path)
    writer.write({"k": [2]}, step=1)
    assert load(tmp_path)["k"] == [1, 2] and writer.last_step == 1
    with pytest.raises(TypeError, match="a key is a string, got 1"):
        writer.write({1: [3]}, step=2)


def test_files_get_the_mode_the_umask_gives(tmp_path):
    previous = os.umask(0o022)
    try:
        Writer(tmp_path).write({"k": [1]}, step=0)
    finally:
        os.umask(previous)
    modes = {
        p.name: p.stat().st_mode & 0o777 for p in [*tmp_path.iterdir(), *(tmp_path / "records").iterdir()]
    }
    assert modes["index.json"] == modes["index.jsonl"] == modes["000001.pkl"] == 0o644


@pytest.mark.parametrize("same_inode", [False, True])
def test_a_writer_follows_a_directory_made_again(tmp_path, same_inode):
    import shutil

    run = tmp_path / "run"
    writer = Writer(run)
    writer.write({"k": ["a" * 50]}, step=0)
    if same_inode:  # emptied in place: a journal made again in the same inode
        for data in (run / "records").glob("[!.]*"):
            data.unlink()
        (run / "index.jsonl").write_bytes(b"")
    else:
        shutil.rmtree(run)
    other = Writer(run)  # another run fills it again: a longer first line
    other.write({"a key much longer than the first run's": ["b"]}, step=0)
    writer.write({"k": ["c"]}, step=1)  # the first writer reads the new journal from its start
    loaded = load(run)
    assert loaded["k"] == ["c"] and loaded["a key much longer than the first run's"] == ["b"]
    assert sorted(p.name for p in (run / "records").glob("[!.]*")) == ["000001.pkl", "000002.pkl"]


@pytest.mark.parametrize(
    "entries, why",
    [
        ([{"key": "k", "step": 0, "name": "k#0#0"}], "entry 1 has no 'file'"),
        ([{"key": 1}], "entry 1's 'key' is 1, not a str"),
        ([{"key": "k", "step": "0", "file": "records/1.pkl", "name": "k"}], "'step' is '0', not an int"),
        ([{"key": "k", "step": True, "file": "records/1.pkl", "name": "k"}], "'step' is True, not an int"),
        ([{"key": "k", "step": 0, "file": "/etc/passwd", "name": "k"}], "entry 1's 'file' is '/etc/passwd'"),
        (["k"], "entry 1 is a str, not an object"),
        ({"key": "k"}, "its entries are a dict, not a list"),
    ],
)
def test_an_index_entry_missing_a_field_or_of_a_wrong_type_is_a_clear_error(tmp_path, entries, why):
    writer = Writer(tmp_path)
    writer.write({"k": [1]}, step=0)
    with open(tmp_path / "index.jsonl", "a") as journal:
        journal.write(json.dumps({"entries": entries}) + "\n")
    before = sorted((p.name, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file())
    reads = (
        lambda: load(tmp_path),
        lambda: writer.last_step,
        lambda: Writer(tmp_path),
        lambda: writer.write({"k": [2]}, step=1),  # (the last line alone read: it was 'save 1')
        lambda: save({"k": [2]}, tmp_path, step=1),
    )
    for read in reads:
        with pytest.raises(StorageError, match="save 2 is damaged") as caught:
            read()
        assert why in str(caught.value)
    assert sorted((p.name, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file()) == before


def test_save_names_the_damaged_line_of_an_index_by_its_number_as_load_does(tmp_path):
    # save() reads the index's last line alone, which it called 'save 1' whatever its number.
    save({"a": [1]}, tmp_path)
    save({"a": [2]}, tmp_path, step=1)
    with open(tmp_path / "index.jsonl", "ab") as journal:
        journal.write(b"garbage\n")
    for read in (lambda: load(tmp_path), lambda: save({"a": [3]}, tmp_path, step=2)):
        with pytest.raises(StorageError, match=r"index.jsonl: save 3 is damaged \(Expecting value"):
            read()


def test_a_damaged_version_1_index_is_a_clear_error_and_a_value_missing_from_its_file_is_lost(tmp_path):
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "000001.pkl").write_bytes(pickle.dumps({"k#0#0": 10}))
    version_1 = {"format": "bcrecord-records", "version": 1, "entries": [{"key": "k", "step": 0}]}
    (tmp_path / "index.json").write_text(json.dumps(version_1))
    for read in (lambda: load(tmp_path), lambda: Writer(tmp_path)):
        with pytest.raises(StorageError, match="index.json: it is damaged \\(entry 1 has no 'file'\\)"):
            read()
    assert json.loads((tmp_path / "index.json").read_text()) == version_1  # not upgraded
    rows = [
        {"key": "k", "step": 0, "file": "records/000001.pkl", "name": "k#0#9"},
        {"key": "k", "step": 1, "file": "records/000001.pkl", "name": "k#0#0"},
    ]
    (tmp_path / "index.json").write_text(json.dumps({**version_1, "entries": rows}))
    told = r"000001.pkl is damaged \(it has no value 'k#0#9', which the index names: another save's file\?\)"
    with pytest.warns(bcrecord.storage.DamagedRecords, match=told):
        loaded = load(tmp_path)
    assert list(loaded.keys()) == []  # (its 'k#0#0' is another save's too, whatever its name)


def test_a_data_file_replaced_by_another_save_s_loses_its_own_values_only(tmp_path):
    # Two writers without locks, or a copy mixed up: load refused the whole directory. Values
    # of the same names in the other save's file are not this one's: none of them is read.
    save({"m:f:s@0": [1.0, 2.0]}, tmp_path)
    save({"m:f:t@0": ["kept"]}, tmp_path, step=1)
    save({"m:f:s@0": [9.0]}, tmp_path / "other")  # 'm:f:s@0#0#0' too
    files = sorted((tmp_path / "records").glob("*.pkl"))
    files[0].write_bytes(next((tmp_path / "other" / "records").glob("*.pkl")).read_bytes())
    told = r"2 of its 2 values could not be read; left out: 'm:f:s@0' \(step 0\); every other file's values"
    with pytest.warns(bcrecord.storage.DamagedRecords, match=told):
        loaded = load(tmp_path)
    assert list(loaded.keys()) == ["m:f:t@0"] and loaded["m:f:t@0"] == ["kept"]
    # Asked for a key the other save's file has too (its 'm:f:s@0#0#0', 9.0): none of it either.
    with pytest.warns(bcrecord.storage.DamagedRecords, match=r"it has no value 'm:f:s@0#0#1'"):
        assert list(load(tmp_path, keys=["m:f:s@0"]).keys()) == []
    # A file with more values than its index rows is another save's too, whatever is asked of it.
    save({"m:f:s@0": [7.0, 8.0, 9.0]}, tmp_path / "larger")
    files[0].write_bytes(next((tmp_path / "larger" / "records").glob("*.pkl")).read_bytes())
    with pytest.warns(bcrecord.storage.DamagedRecords, match=r"it has 3 values where the index names 2"):
        assert list(load(tmp_path, keys=["m:f:s@0"]).keys()) == []


def test_a_data_file_an_older_bcrecord_wrote_two_values_of_one_name_into_loads(tmp_path):
    # It wrote two index rows of one name ('loss#0#0', a step given twice) and the value once:
    # taken for another save's file, the whole file was left out.
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "000001.pkl").write_bytes(pickle.dumps({"loss#0#0": 2.0, "acc#0#0": 0.5}))
    rows = [
        {"key": "loss", "step": 0, "file": "records/000001.pkl", "name": "loss#0#0"},
        {"key": "acc", "step": 0, "file": "records/000001.pkl", "name": "acc#0#0"},
        {"key": "loss", "step": 0, "file": "records/000001.pkl", "name": "loss#0#0"},
    ]
    index = {"format": "bcrecord-records", "version": 1, "entries": rows}
    (tmp_path / "index.json").write_text(json.dumps(index))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load(tmp_path)
    assert loaded["loss"] == [2.0, 2.0] and loaded["acc"] == [0.5]


def test_load_of_a_key_never_saved_names_it_and_the_saved_keys(tmp_path):
    save({"m:f:x@0": [1], "m:f:y@0": [2]}, tmp_path)
    told = r"no saved values for 'm:f:x@1'; did you mean 'm:f:x@0'.*; saved keys: m:f:x@0, m:f:y@0"
    with pytest.raises(KeyError, match=told):
        load(tmp_path, keys=["m:f:y@0", "m:f:x@1"])
    with pytest.raises(KeyError, match="no saved values for 'nosuch'; saved keys: none"):
        load(save({}, tmp_path / "empty"), keys="nosuch")
    with pytest.raises(TypeError, match=r"a key is a string, got 3 \(int\)"):
        load(tmp_path, keys=[3])
    assert dict(load(tmp_path, keys=[])) == {}


def test_keys_escaped_in_a_data_file_keep_their_own_values(tmp_path):
    odd = "m:f:x\udc80"  # a lone surrogate: no UTF-8, so its name in the file is escaped
    escaped = ascii(odd)  # an ordinary key, spelt as that escape
    loaded = load(save({odd: ["odd's"], escaped: ["escaped's"]}, tmp_path, step=0))
    assert loaded[odd] == ["odd's"] and loaded[escaped] == ["escaped's"]


def test_a_key_is_looked_up_in_saved_records_without_a_did_you_mean(tmp_path, monkeypatch):
    loaded = load(save({"m:f:x@0": [1]}, tmp_path, step=0))

    def hint(*args, **kwargs):
        raise AssertionError("'in' built a KeyError's hint (slow over many keys)")

    monkeypatch.setattr(bcrecord.storage, "did_you_mean", hint)
    assert "m:f:x@0" in loaded and "m:f:y@0" not in loaded


def test_load_of_a_folder_of_records_directories_names_them(tmp_path):
    for rank in (0, 1):
        save({"m:f:x@0": [rank]}, tmp_path / "train" / f"rank{rank}", step=0)
    said = r"has no index.json: not a bcrecord records directory \(records directories in it: rank0, rank1; "
    with pytest.raises(StorageError, match=said + r"read each\)$"):
        load(tmp_path / "train")
    assert load(tmp_path / "train" / "rank1")["m:f:x@0"] == [1]


def test_load_of_a_folder_inside_records_names_the_records_directory(tmp_path, monkeypatch):
    # `bcrecord view runs/a/plots` (the folder view drew into) said only "not a records directory".
    save({"m:f:x@0": [1]}, tmp_path / "runs" / "a", step=0)
    (tmp_path / "runs" / "a" / "plots").mkdir()
    monkeypatch.chdir(tmp_path)
    for inner in ("plots", "records"):
        with pytest.raises(StorageError) as refused:
            load(f"runs/a/{inner}")
        assert str(refused.value).endswith(
            "(it is a folder of the records directory runs/a: read that instead)"
        )


class ExceptionOfTwoArguments(Exception):
    """Pickles its message alone, and its __init__ wants two arguments: it pickles, and does not load."""

    def __init__(self, first, second):
        super().__init__(f"{first}-{second}")


class StateRefused:
    def __init__(self):
        self.x = 1

    def __setstate__(self, state):
        raise ValueError("no state today")


def test_a_value_that_pickles_and_does_not_load_loses_no_other_value_of_its_save(tmp_path):
    # Every non-tensor value of a save is in one pickle: one that could not be made again
    # made the whole file unreadable, every key of the save lost, even with load(keys=...).
    refused = StateRefused()
    Writer(tmp_path).write(
        {
            "m:f:x@0": [1, {"a": [2.5, None]}],
            "m:f:e@0": [ExceptionOfTwoArguments(1, 2)],
            "m:f:s@0": [refused, [refused, 7]],
        },
        step=3,
    )
    loaded = load(tmp_path)
    assert loaded["m:f:x@0"] == [1, {"a": [2.5, None]}] and loaded.steps("m:f:x@0") == [3, 3]
    assert load(tmp_path, keys=["m:f:x@0"])["m:f:x@0"] == [1, {"a": [2.5, None]}]
    (error,) = loaded["m:f:e@0"]
    assert isinstance(error, bcrecord.storage.Unloadable) and error.args == ("1-2",)
    assert error.error == (
        "TypeError: ExceptionOfTwoArguments.__init__() missing 1 required positional argument: 'second'"
    )
    assert repr(error).startswith("<tests.test_storage.ExceptionOfTwoArguments, could not be made again (")
    alone, (inside, seven) = loaded["m:f:s@0"]
    assert alone is inside and seven == 7  # one stand-in, wherever the value was
    assert alone.state == {"x": 1} and alone.error == "ValueError: no state today"


def _two_saves(folder, count):
    """Two saves into ``folder``: ``count`` values of 'm:f:x@0' at step 0 (file 1), three at step 1."""
    values = [{"n": n, "text": f"value {n}", "list": list(range(n % 7))} for n in range(count)]
    save({"m:f:x@0": values}, folder, step=0)
    save({"m:f:x@0": ["a", "b", "c"], "m:f:y@0": [1.5]}, folder, step=1)
    return values, folder / "records" / "000001.pkl"


@pytest.mark.parametrize("cut", [0.5, 0.999])
def test_a_data_file_cut_short_loses_only_its_values_after_the_cut_with_a_warning(tmp_path, cut):
    # The process killed while a copy ran, a full disk: load() raised 'pickle data was
    # truncated' and the whole run was lost. (2500 values: pickle sets them in batches of 1000.)
    values, data = _two_saves(tmp_path, 2500)
    whole = data.read_bytes()
    data.write_bytes(whole[: int(len(whole) * cut)])
    with pytest.warns(bcrecord.storage.DamagedRecords) as caught:
        loaded = load(tmp_path)
    kept = loaded["m:f:x@0"][:-3]
    assert 1000 < len(kept) < 2500 and kept == values[: len(kept)]  # what is there, never a wrong value
    assert loaded["m:f:x@0"][-3:] == ["a", "b", "c"] and loaded["m:f:y@0"] == [1.5]
    assert loaded.steps("m:f:x@0") == [0] * len(kept) + [1, 1, 1]
    (message,) = [str(warning.message) for warning in caught]
    assert message.startswith(
        f"{data} is damaged (pickle data was truncated; {len(whole) * cut:.0f} bytes): "
    )
    assert f": {2500 - len(kept)} of its 2500 values could not be read; left out: 'm:f:x@0' (step 0);" in (
        message
    )
    assert message.endswith("; its other values, and every other file's, are loaded")
    # Strict: the warning made an error refuses the directory.
    with warnings.catch_warnings():
        warnings.simplefilter("error", bcrecord.storage.DamagedRecords)
        with pytest.raises(bcrecord.storage.DamagedRecords, match="000001.pkl is damaged"):
            load(tmp_path)


def test_a_data_file_emptied_or_gone_loses_its_values_and_no_other(tmp_path):
    values, data = _two_saves(tmp_path, 3)
    data.write_bytes(b"")
    with pytest.warns(
        bcrecord.storage.DamagedRecords, match=r"000001\.pkl is damaged \(Ran out of input; 0 bytes\)"
    ):
        assert dict(load(tmp_path)) == {"m:f:x@0": ["a", "b", "c"], "m:f:y@0": [1.5]}
    data.unlink()
    with pytest.warns(
        bcrecord.storage.DamagedRecords, match=r"\(No such file or directory\): 3 of its 3 values"
    ):
        assert load(tmp_path).steps("m:f:x@0") == [1, 1, 1]
    with pytest.warns(bcrecord.storage.DamagedRecords):  # a key whose every value is lost: none
        assert dict(load(tmp_path, keys="m:f:x@0")) == {"m:f:x@0": ["a", "b", "c"]}


def test_a_data_file_with_bytes_added_after_it_loads_whole(tmp_path):
    values, data = _two_saves(tmp_path, 3)
    data.write_bytes(data.read_bytes() + b"\x00garbage")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load(tmp_path)["m:f:x@0"] == values + ["a", "b", "c"]


def test_a_data_file_overwritten_in_the_middle_keeps_the_values_before_it(tmp_path):
    values, data = _two_saves(tmp_path, 2500)
    whole = bytearray(data.read_bytes())
    middle = len(whole) // 2
    whole[middle : middle + 8] = b"\xff" * 8
    data.write_bytes(bytes(whole))
    with pytest.warns(bcrecord.storage.DamagedRecords, match=r"000001\.pkl is damaged"):
        kept = load(tmp_path)["m:f:x@0"][:-3]
    assert 1000 <= len(kept) < 2500 and kept == values[: len(kept)]


@pytest.mark.parametrize(
    "raised",
    [
        "raise OSError('libcudart.so: cannot open shared object file')",
        # A BaseException, not an Exception: load() (and `bcrecord view`) ended with it, silently.
        "raise SystemExit(2)",
        "import argparse; argparse.ArgumentParser().parse_args(['--no-such-option'])",
    ],
)
def test_a_value_of_a_module_that_raises_on_import_here_loads_as_unimportable(tmp_path, monkeypatch, raised):
    # Saved on a machine where the module imports; loaded where importing it raises (no GPU,
    # a shared library missing: OSError) or exits (argparse given other arguments). It made the
    # whole data file unreadable.
    (tmp_path / "needs_a_gpu.py").write_text(
        "import os\n"
        "if os.environ.get('NO_GPU_HERE'):\n"
        f"    {raised}\n"
        "class Box:\n"
        "    def __init__(self, v):\n"
        "        self.v = v\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import needs_a_gpu

    records = tmp_path / "records"
    save({"m:f:box@0": [needs_a_gpu.Box(3), 5], "m:f:x@0": [1]}, records)
    monkeypatch.delitem(sys.modules, "needs_a_gpu")
    monkeypatch.setenv("NO_GPU_HERE", "1")
    loaded = load(records)
    box, five = loaded["m:f:box@0"]
    assert isinstance(box, bcrecord.storage.Unimportable) and box.state == {"v": 3}
    assert repr(box) == "<needs_a_gpu.Box, not importable here: {'v': 3}>"
    assert five == 5 and loaded["m:f:x@0"] == [1]


def test_a_keyboard_interrupt_while_a_value_s_module_is_imported_still_stops_the_load(tmp_path, monkeypatch):
    (tmp_path / "slow_to_import.py").write_text(
        "import os\nif os.environ.get('INTERRUPTED'):\n    raise KeyboardInterrupt\nclass Box:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import slow_to_import

    records = save({"m:f:box@0": [slow_to_import.Box()]}, tmp_path / "records")
    monkeypatch.delitem(sys.modules, "slow_to_import")
    monkeypatch.setenv("INTERRUPTED", "1")
    with pytest.raises(KeyboardInterrupt):
        load(records)


@pytest.mark.skipif(bcrecord.storage.fcntl is None, reason="no fcntl: saves take no lock")
@pytest.mark.parametrize("code", [errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP])
def test_a_file_system_without_file_locks_saves_with_one_warning(tmp_path, monkeypatch, code):
    # Lustre mounted without -o flock, NFS without its lock daemon: flock raises, and every
    # save failed ("cannot write records to DIR: Function not implemented").
    def no_locks(fd, operation):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(bcrecord.storage.fcntl, "flock", no_locks)
    with pytest.warns(RuntimeWarning, match=r"is on a file system without file locks \(") as said:
        writer = Writer(tmp_path)
        assert writer.write({"m:f:x@0": [1]}, step=0) == 1
        save({"m:f:x@0": [2]}, tmp_path, step=1)
    assert len(said) == 1  # once per directory
    assert load(tmp_path)["m:f:x@0"] == [1, 2] and load(tmp_path).steps("m:f:x@0") == [0, 1]

    def refused(fd, operation):  # any other failure is the save's
        raise OSError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(bcrecord.storage.fcntl, "flock", refused)
    with pytest.raises(StorageError, match="cannot write records to .*: Permission denied"):
        save({"m:f:x@0": [3]}, tmp_path, step=2)


def test_a_damaged_file_s_warning_counts_every_value_lost_and_names_those_asked_for(tmp_path):
    Writer(tmp_path).write_many([(step, {"a": [step], "b": [-step]}) for step in range(10)])
    save({"a": [10]}, tmp_path, step=10)
    (tmp_path / "records" / "000001.pkl").write_bytes(b"")
    with pytest.warns(bcrecord.storage.DamagedRecords) as caught:
        assert load(tmp_path, keys="a")["a"] == [10]
    (message,) = [str(warning.message) for warning in caught]
    assert message.endswith(
        ": 20 of its 20 values could not be read; left out: 'a' (10 values, steps 0..9); "
        "every other file's values are loaded"
    )


def test_a_data_file_that_cannot_be_read_is_an_error_not_values_left_out(tmp_path):
    # Not damage: the values are there for a process that can read them (here, a folder in its place).
    _two_saves(tmp_path, 3)
    data = tmp_path / "records" / "000001.pkl"
    data.unlink()
    data.mkdir()
    with pytest.raises(StorageError, match=r"cannot read .*000001\.pkl: Is a directory$"):
        load(tmp_path)


def test_a_pickled_data_file_cut_at_any_byte_gives_whole_values_only(tmp_path):
    # Shared, nested and reduced values (a set, a frozen dataclass, an exception), each kept only
    # when pickle had written it whole; never one made of the bytes before the cut alone.
    shared = [1, 2, "shared"]
    values = [1, "s", [1, [2, (3, 4)]], {"k": {1, 2}}, shared, (shared, b"x"), ValueError("e"), 3.5]
    values += [frozenset({1}), None, "k#0#3", Frozen(1), {"deep": [Frozen([2])]}]
    names = [f"k#0#{n}" for n in range(len(values))]
    data = bcrecord.storage._dumps(dict(zip(names, values, strict=True)))
    kept = [bcrecord.storage._intact_pickled(data[:cut], names) for cut in range(len(data) + 1)]
    for cut, got in enumerate(kept):
        assert list(got) == names[: len(got)], cut  # (never a value after one lost)
        assert [repr(value) for value in got.values()] == [repr(value) for value in values[: len(got)]], cut
    assert [len(got) for got in kept][-1] == len(values) and len(kept[len(data) * 3 // 4]) > 5


@dataclasses.dataclass(frozen=True)
class Frozen:
    """A dataclass pickle makes again through ``__reduce_ex__`` (a frozen one: object.__setattr__)."""

    field: object


# --- properties: any keys given to load are values, a KeyError naming the saved keys, or a TypeError ---


@SETTINGS
@given(st.one_of(TYPED, st.lists(st.one_of(TYPED, st.just("m:f:x@0")), max_size=3), JSON))
def test_property_any_keys_load_their_values_or_name_the_saved_keys(tmp_path_factory, keys):
    folder = save({"m:f:x@0": [1.5]}, tmp_path_factory.mktemp("saved"))
    try:
        loaded = load(folder, keys=keys)
    except KeyError as error:
        assert "saved keys: m:f:x@0" in str(error)
    except TypeError as error:
        assert "key" in str(error)
    else:
        assert dict(loaded) in ({"m:f:x@0": [1.5]}, {})


def _long_index(directory, saves, per_save):
    """A records directory whose index names ``saves * per_save`` values of key 'b' (their data
    files left out: what is tested reads none) and one value of key 'a' in a file of its own."""
    bcrecord.save({"a": [1.5]}, directory, step=0)
    with open(directory / "index.jsonl", "a") as journal:
        for save_number in range(saves):
            file = f"records/{save_number + 2:06d}.pkl"
            entries = [
                {"key": "b", "step": step, "file": file, "name": f"b#{step}#0", "kind": "pickle",
                 "shape": None, "dtype": "float", "device": None, "bytes": None, "time": 0.0}
                for step in range(save_number * per_save, (save_number + 1) * per_save)
            ]  # fmt: skip
            journal.write(json.dumps({"entries": entries}) + "\n")


def test_what_needs_a_part_of_a_long_index_holds_one_save_of_it_at_a_time(tmp_path):
    import tracemalloc

    _long_index(tmp_path, saves=40, per_save=1000)  # 40,001 entries: some 25 MB read whole
    peaks = {}
    for name, read in [
        ("saved_keys", lambda: bcrecord.storage.saved_keys(tmp_path)),
        ("load one key", lambda: load(tmp_path, keys=["a"])["a"]),
        ("Writer.saved", lambda: Writer(tmp_path).saved),
        ("Writer.last_step", lambda: Writer(tmp_path, check=False).last_step),
    ]:
        low = None
        for _ in range(2):  # (the lower peak of two: another thread's allocations count too)
            tracemalloc.start()
            try:
                result = read()
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            low = peak if low is None else min(low, peak)
        peaks[name] = (result, low < 3 << 20)
    # The index read whole was 30-40 MB at its peak; one save of it is under 1 MB. (Once in
    # CI, py311, Writer.saved's single peak was over 3 MB.)
    assert peaks == {
        "saved_keys": (["a", "b"], True),
        "load one key": ([1.5], True),
        "Writer.saved": (40_001, True),
        "Writer.last_step": (39_999, True),
    }


def test_loading_matches_each_data_file_s_name_once_not_each_entry_s(tmp_path, monkeypatch):
    saved = bcrecord.save({"m:f:x@0": list(range(500))}, tmp_path, step=0)
    bcrecord.save({"m:f:x@0": [7]}, saved, step=1)
    asked = []
    pattern = bcrecord.storage._DATA_FILE

    class Counted:
        def fullmatch(self, text):
            asked.append(text)
            return pattern.fullmatch(text)

    monkeypatch.setattr(bcrecord.storage, "_DATA_FILE", Counted())
    assert load(saved)["m:f:x@0"] == [*range(500), 7]
    assert asked == ["records/000001.pkl", "records/000002.pkl"]


def test_iter_saved_index_gives_saved_index_a_row_at_a_time(tmp_path):
    folder = save({"m:f:x@0": [1.0, 2.5], "m:f:y@0": ["a"]}, tmp_path / "saved", step=3)
    save({"m:f:x@0": [4.0]}, folder, step=4)
    rows = bcrecord.storage.iter_saved_index(folder)
    assert next(rows)["key"] == "m:f:x@0"  # (a generator: the rest not read yet)
    assert [next(rows)] + list(rows) == bcrecord.storage.saved_index(folder)[1:]
    assert [(row["key"], row["step"]) for row in bcrecord.storage.iter_saved_index(folder)] == [
        ("m:f:x@0", 3),
        ("m:f:x@0", 3),
        ("m:f:y@0", 3),
        ("m:f:x@0", 4),
    ]


def test_a_file_given_for_the_records_directory_is_told_the_directory_to_give(tmp_path):
    # Was "cannot read .../index.json/index.json: [Errno 20] Not a directory".
    run = save({"m:f:x@0": [1]}, tmp_path / "run")
    data = next(path for path in (run / "records").iterdir() if path.is_file() and path.name != ".lock")
    for file in (run / "index.json", data):
        with pytest.raises(StorageError) as caught:
            load(file)
        assert str(caught.value) == f"{file} is a file, of the records directory {run}: give that"
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(StorageError, match=r"notes\.txt is a file, not a records directory$"):
        load(tmp_path / "notes.txt")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt", "run"]
    assert load(run)["m:f:x@0"] == [1]


def test_get_of_a_key_not_saved_is_its_default_without_comparing_every_saved_key(tmp_path, monkeypatch):
    # Mapping's get went through __getitem__, whose KeyError's did-you-mean compared every saved
    # key: seconds for one missing key of a long run.
    loaded = load(save({f"m:f:x{i}@0": [i] for i in range(30)}, tmp_path))

    def compared(*args, **kwargs):
        raise AssertionError("get compared the saved keys")

    monkeypatch.setattr(bcrecord.storage, "did_you_mean", compared)
    assert loaded.get("m:f:x7@0") == [7] and loaded.get("m:f:y@0") is None
    assert loaded.get("m:f:y@0", []) == [] and loaded.get(3, "none") == "none"


def test_a_missing_key_s_message_lists_twenty_saved_keys_not_every_one(tmp_path):
    # A long run's message listed every saved key: 700,000 characters for 20,000 keys.
    keys = [f"m:f:x{i}@0" for i in range(30)]
    loaded = load(save({key: [1] for key in keys}, tmp_path))
    for read in (loaded.__getitem__, lambda key: load(tmp_path, keys=[key])):
        with pytest.raises(KeyError) as error:
            read("m:f:zz@0")
        listed = error.value.args[0].partition("saved keys: ")[2]
        assert listed == ", ".join(keys[:20]) + " and 10 more"


class _NotARecording:
    """Has an ``all`` and ``keys``, as a pandas DataFrame and Series have."""

    def all(self, axis=0):
        raise ValueError(f"No axis named {axis} for object type DataFrame")

    def keys(self):
        return ["m:f:x@0"]


def test_a_value_with_all_and_keys_that_is_no_recording_is_told_what_records_are(tmp_path):
    # Taken for a Recording: a pandas DataFrame's save raised pandas' own "No axis named m:f:x@0".
    told = "records are a Recording or a dict of key -> list of values, got _NotARecording"
    for saving in (
        lambda: save(_NotARecording(), tmp_path / "a"),
        lambda: Writer(tmp_path / "b").write(_NotARecording(), step=0),
    ):
        with pytest.raises(TypeError, match=told):
            saving()
    assert not (tmp_path / "a").exists()
    with bcrecord.recording() as rec:
        rec.add("m:f:x@0", 1.5)
        rec.add("m:f:x@0", 2.5)
    assert load(save(rec, tmp_path / "c"))["m:f:x@0"] == [1.5, 2.5]


_RESAVED_MODULE = """
import collections

class Box:
    def __init__(self, v):
        self.v = v

class Called:  # pickled as a call of its class
    def __init__(self, v):
        self.v = v
    def __reduce__(self):
        return Called, (self.v,)

class Row(list):
    pass

class Table(dict):
    pass

Pair = collections.namedtuple("Pair", "a b")

class Rebuilt:  # pickled in copyreg's form: made with object.__new__, past a stand-in's __new__
    def __init__(self, v):
        self.v = v
    def __reduce__(self):
        return object.__reduce__(self)
"""


def test_values_loaded_as_unimportable_save_again_and_load_as_their_class_where_it_imports(
    tmp_path, monkeypatch
):
    # A `bcrecord run` save of a __main__ class's values, read elsewhere, loaded as stand-ins that
    # no save took: "Can't pickle <class '__main__.Pt'>".
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "gone_mod.py").write_text(_RESAVED_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    import gone_mod

    values = [
        gone_mod.Box(3),
        gone_mod.Called(4),
        gone_mod.Row([1, 2]),
        gone_mod.Table(a=1),
        gone_mod.Pair(5, 6),
        gone_mod.Rebuilt(8),
    ]
    shared = gone_mod.Box(7)
    save({"m:f:v@0": values, "m:f:s@0": [[shared, shared]], "m:f:x@0": [1.5]}, tmp_path / "first")
    monkeypatch.delitem(sys.modules, "gone_mod")
    (tmp_path / "mods" / "gone_mod.py").rename(tmp_path / "gone_mod.py.away")
    first = load(tmp_path / "first")
    assert all(isinstance(value, bcrecord.storage.Unimportable) for value in first["m:f:v@0"])

    save(first, tmp_path / "second")  # was UnsavableValue: Can't pickle <class 'gone_mod.Box'>
    second = load(tmp_path / "second")
    assert [repr(value) for value in second["m:f:v@0"]] == [repr(value) for value in first["m:f:v@0"]]
    assert repr(second["m:f:v@0"][0]) == "<gone_mod.Box, not importable here: {'v': 3}>"
    # (its repr raised AttributeError: 'Rebuilt' object has no attribute 'args'; its save too)
    assert repr(second["m:f:v@0"][5]) == "<gone_mod.Rebuilt, not importable here: {'v': 8}>"
    ((one, other),) = second["m:f:s@0"]
    assert one is other and one.state == {"v": 7} and second["m:f:x@0"] == [1.5]

    (tmp_path / "gone_mod.py.away").rename(tmp_path / "mods" / "gone_mod.py")
    importlib.invalidate_caches()
    box, called, row, table, pair, rebuilt = load(tmp_path / "second")["m:f:v@0"]
    assert type(rebuilt).__name__ == "Rebuilt" and rebuilt.v == 8
    assert type(box).__name__ == "Box" and box.v == 3 and type(called).__name__ == "Called" and called.v == 4
    assert (
        type(row).__name__ == "Row"
        and row == [1, 2]
        and type(table).__name__ == "Table"
        and table == {"a": 1}
    )
    assert type(pair).__name__ == "Pair" and pair == (5, 6) and pair.b == 6


def test_a_value_loaded_as_unloadable_saves_again_as_the_same_stand_in(tmp_path):
    save({"m:f:e@0": [ExceptionOfTwoArguments(1, 2)]}, tmp_path / "first")
    (error,) = load(tmp_path / "first")["m:f:e@0"]
    (again,) = load(save({"m:f:e@0": [error]}, tmp_path / "second"))["m:f:e@0"]
    assert (
        type(again) is bcrecord.storage.Unloadable and again.args == ("1-2",) and again.error == error.error
    )
    assert repr(again) == repr(error)


_FAILING_MODULE = """
import os
with open(os.environ["IMPORTS_LOG"], "a") as log:
    log.write("import\\n")
if os.environ.get("IMPORT_FAILS"):
    raise RuntimeError("needs a GPU")

class Thing:
    def __init__(self, i):
        self.i = i
"""


def _failing_module(tmp_path, monkeypatch):
    """A module ``gpu_mod`` that logs each import to ``tmp_path/imports.log``, then fails once
    IMPORT_FAILS is set, and the function that says how many imports were logged since last asked."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "gpu_mod.py").write_text(_FAILING_MODULE)
    log = tmp_path / "imports.log"
    monkeypatch.setenv("IMPORTS_LOG", str(log))
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))

    def imports():
        count = len(log.read_text().splitlines()) if log.exists() else 0
        log.unlink(missing_ok=True)
        return count

    return imports


def test_a_load_imports_a_failing_module_once_however_many_values_and_files_need_it(tmp_path, monkeypatch):
    # A stand-in saved again looked its class up once per value as it loaded: 2000 values of a
    # module that needs a GPU took 11 s (the module's code ran 2000 times); the original save's
    # load looked it up once per data file.
    imports = _failing_module(tmp_path, monkeypatch)
    import gpu_mod

    for step in range(3):  # (three data files)
        save({"m:f:t@0": [gpu_mod.Thing(10 * step + i) for i in range(20)]}, tmp_path / "first", step=step)
    monkeypatch.delitem(sys.modules, "gpu_mod")
    monkeypatch.setenv("IMPORT_FAILS", "1")
    imports()
    first = load(tmp_path / "first")["m:f:t@0"]
    assert imports() == 1 and [thing.state["i"] for thing in first] == [
        10 * s + i for s in range(3) for i in range(20)
    ]
    assert len({type(thing) for thing in first}) == 1  # (one stand-in class for the load)

    save({"m:f:t@0": first}, tmp_path / "second")
    assert imports() == 0
    second = load(tmp_path / "second")["m:f:t@0"]
    assert imports() == 1 and [repr(thing) for thing in second] == [repr(thing) for thing in first]
    assert repr(second[0]) == "<gpu_mod.Thing, not importable here: {'i': 0}>"


def test_a_copy_of_a_stand_in_is_of_its_stand_in_class_and_imports_nothing(tmp_path, monkeypatch):
    # copy.deepcopy went through the stand-in's pickle: its module imported again, and the copy
    # of another stand-in class.
    imports = _failing_module(tmp_path, monkeypatch)
    import gpu_mod

    save({"m:f:t@0": [gpu_mod.Thing([1, 2])]}, tmp_path)
    monkeypatch.delitem(sys.modules, "gpu_mod")
    monkeypatch.setenv("IMPORT_FAILS", "1")
    (thing,) = load(tmp_path)["m:f:t@0"]
    imports()
    deep, shallow = copy.deepcopy(thing), copy.copy(thing)
    assert imports() == 0 and type(deep) is type(thing) and type(shallow) is type(thing)
    assert deep.state == {"i": [1, 2]} and deep.state["i"] is not thing.state["i"]
    assert shallow.state == {"i": [1, 2]} and shallow.state is not thing.state
    assert shallow.state["i"] is thing.state["i"] and repr(deep) == repr(thing)


_FUNCTIONS_MODULE = """
def loss_fn(x):
    return 2 * x

class Cfg:
    pass
"""


def test_a_function_or_class_loaded_as_a_stand_in_class_saves_again(tmp_path, monkeypatch):
    # A __main__ function or class saved as a value loads elsewhere as a stand-in class, which no
    # save took: "Can't pickle <class '__main__.loss_fn'>".
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "fn_mod.py").write_text(_FUNCTIONS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    import fn_mod

    save(
        {"m:f:cfg@0": [{"loss": fn_mod.loss_fn, "kind": fn_mod.Cfg, "obj": fn_mod.Cfg()}]}, tmp_path / "first"
    )
    monkeypatch.delitem(sys.modules, "fn_mod")
    (tmp_path / "mods" / "fn_mod.py").rename(tmp_path / "fn_mod.py.away")
    (first,) = load(tmp_path / "first")["m:f:cfg@0"]
    assert isinstance(first["loss"], type) and issubclass(first["loss"], bcrecord.storage.Unimportable)

    save({"m:f:cfg@0": [first]}, tmp_path / "second")  # was UnsavableValue: Can't pickle
    (second,) = load(tmp_path / "second")["m:f:cfg@0"]
    assert (
        repr(second["loss"]) == "<class 'fn_mod.loss_fn'>" and repr(second["kind"]) == "<class 'fn_mod.Cfg'>"
    )
    assert type(second["obj"]) is second["kind"]  # (one lookup of the name, shared)

    (tmp_path / "fn_mod.py.away").rename(tmp_path / "mods" / "fn_mod.py")
    importlib.invalidate_caches()
    (again,) = load(tmp_path / "second")["m:f:cfg@0"]
    assert again["loss"](3) == 6 and again["kind"].__name__ == "Cfg" and type(again["obj"]) is again["kind"]


def test_a_stand_in_s_repr_and_a_key_in_a_message_are_cut_short(tmp_path):
    # A 16 MB tensor pickled where torch was missing had a repr of 47 million characters; a key too
    # long for a safetensors header gave a message of 100 MB.
    from bcrecord.storage import Unimportable

    stand_in = Unimportable.__new__(Unimportable)
    stand_in._where, stand_in.state = "torch._utils._rebuild_tensor_v2", {"data": b"x" * 1_000_000}
    assert len(repr(stand_in)) < 1100 and repr(stand_in).startswith("<torch._utils._rebuild_tensor_v2, ")
    chain = None  # stand-ins inside stand-ins, 400 deep (a linked list): its repr ran out of stack
    for k in range(400):
        node = Unimportable.__new__(Unimportable)
        node._where, node.state = "m.Node", {"v": k, "nxt": chain}
        chain = node
    assert repr(chain).startswith("<m.Node, not importable here: {'v': 399, 'nxt': <m.Node, ")
    assert len(repr(chain)) < 1100
    # A stand-in class named as a builtin container (another module's 'list'): reprlib took it for one.
    from bcrecord.storage import _Unpickler

    find = _Unpickler(io.BytesIO(b"")).find_class
    kind = find("no_such_module", "Point")
    point, listed = kind.__new__(kind), find("no_such_module", "list")()
    listed.append(1)
    point.__setstate__({"xs": listed})
    inner = "<no_such_module.list, not importable here: [1]>"
    assert repr(point) == f"<no_such_module.Point, not importable here: {{'xs': {inner}}}>"
    small = Unimportable.__new__(Unimportable)  # (a state of a few fields is shown whole, in order)
    small._where, small.state = "m.Config", {k: [0] * 8 for k in "zyxwvu"}
    assert repr(small) == f"<m.Config, not importable here: {small.state!r}>"
    with pytest.raises(UnsavableValue) as caught:
        save({"k" * 1_000_000: [lambda: 1]}, tmp_path / "out")
    assert len(str(caught.value)) < 600 and str(caught.value).startswith("cannot save 'kkkk")
    assert not (tmp_path / "out").exists()


def test_a_writer_that_makes_its_directory_at_its_first_save_makes_none_for_a_save_of_no_values(tmp_path):
    # It made the folder (index and records/) for a save that wrote nothing.
    writer = Writer(tmp_path / "run", make=False)
    assert writer.write({}, step=0) == 0 and writer.write({"k": []}, step=1) == 0
    assert (writer.made, list(tmp_path.iterdir())) == (False, [])
    assert writer.write({"k": [1]}, step=2) == 1 and writer.made and load(tmp_path / "run")["k"] == [1]
