"""``vdla serve``'s inputs: each bad one a clear error before anything listens. (Serving
itself is tested end to end in tests/runtime/test_remote.py.)"""

import pytest

from vdla.cli import main

KEY = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize("args, message", [
    (["--sim", "functional", "--port", "70000"], "--port must be 0..65535, not 70000"),
    (["--board", "pynq-z1", "--timeout", "0"], "--timeout must be a positive number"),
    (["--board", "nosuch"], "--board 'nosuch': one of"),
    (["--board", "de10-nano"], "--board de10-nano: the board runtime runs on a Zynq's Linux; "
                               "serve from pynq-z1, pynq-z2"),
    (["--sim", "functional", "--config", "no-such-config"], "no-such-config"),
])
def test_bad_serve_options(args, message, monkeypatch, capsys):
    monkeypatch.setenv("VDLA_REMOTE_KEY", KEY)
    assert main(["serve", *args]) == 1
    assert message in capsys.readouterr().err


def test_serve_needs_a_key(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("VDLA_REMOTE_KEY", raising=False)
    assert main(["serve", "--sim", "functional"]) == 1
    assert "a shared key of at least 16 bytes is needed" in capsys.readouterr().err
    short = tmp_path / "key"
    short.write_text("short")
    assert main(["serve", "--sim", "functional", "--key-file", str(short)]) == 1
    assert "at least 16 bytes" in capsys.readouterr().err
    assert main(["serve", "--sim", "functional", "--key-file", str(tmp_path / "none")]) == 1
    assert "key file" in capsys.readouterr().err


def test_serve_needs_a_board_or_a_simulator(capsys):
    with pytest.raises(SystemExit):
        main(["serve"])
    assert "one of the arguments --board --sim is required" in capsys.readouterr().err
