"""vdla._fileio.atomic_write: whole files only, and the permissions a plain open() gives."""

import os

import pytest

from vdla._fileio import atomic_write


def test_new_file_gets_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        path = atomic_write(tmp_path / "out.bin", b"abc")
    finally:
        os.umask(old)
    assert path.read_bytes() == b"abc"
    assert path.stat().st_mode & 0o777 == 0o644


def test_replaced_file_keeps_its_mode(tmp_path):
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")
    path.chmod(0o640)
    atomic_write(path, b"new")
    assert path.read_bytes() == b"new"
    assert path.stat().st_mode & 0o777 == 0o640


def test_failed_write_leaves_old_file_and_no_debris(tmp_path):
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")

    with pytest.raises(TypeError):
        atomic_write(path, object())          # not bytes: the write fails midway
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]
