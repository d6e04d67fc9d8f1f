"""``vdla serve``'s inputs: each bad one a clear error before anything listens. (Serving
itself is tested end to end in tests/runtime/test_remote*.py.)"""

import pytest

from vdla.cli import main
from vdla.runtime.remote import new_key


@pytest.fixture(scope="module")
def key_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve") / "vdla-key"
    new_key(folder)
    return str(folder)


@pytest.mark.parametrize("args, message", [
    (["--sim", "functional", "--port", "70000"], "--port must be 0..65535, not 70000"),
    (["--board", "pynq-z1", "--timeout", "0"], "--timeout must be a positive number"),
    (["--board", "nosuch"], "--board 'nosuch': one of"),
    (["--board", "de10-nano"], "--board de10-nano: the board runtime runs on a Zynq's Linux; "
                               "serve from pynq-z1, pynq-z2"),
    (["--sim", "functional", "--config", "no-such-config"], "no-such-config"),
    (["--sim", "functional", "--max-uops", "0"], "--max-uops must be a positive integer"),
    (["--sim", "functional", "--session-seconds", "-1"],
     "--session-seconds must be a positive number of seconds"),
    (["--sim", "functional", "--idle-seconds", "0"],
     "--idle-seconds must be a positive number of seconds"),
])
def test_bad_serve_options(args, message, key_dir, capsys):
    assert main(["serve", *args, "--key-dir", key_dir]) == 1
    assert message in capsys.readouterr().err


def test_serve_needs_a_key(capsys, tmp_path):
    assert main(["serve", "--sim", "functional"]) == 1
    assert "--key-dir DIR is needed" in capsys.readouterr().err
    assert main(["serve", "--sim", "functional", "--key-dir", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert "key file" in err and "client.key" in err and "No such file" in err


def test_serve_needs_a_board_or_a_simulator(capsys):
    assert main(["serve"]) == 1
    assert "give --board NAME or --sim functional|verilator" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--sim", "functional", "--board", "pynq-z1"])
    assert "not allowed with argument" in capsys.readouterr().err
