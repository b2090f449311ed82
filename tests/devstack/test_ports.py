"""`python -m devstack ports`: one line naming a taken port and its variable, nothing when free."""

import socket
import subprocess
import sys

from devstack.ports import first_taken, port_in_use
from tests.stack import ROOT, free_port


def test_a_listening_port_is_in_use_and_a_free_one_is_not():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        taken = sock.getsockname()[1]
        assert port_in_use("127.0.0.1", taken)
        assert first_taken("127.0.0.1", {"PORT": free_port(), "DEMO_API_PORT": taken}) == (
            f"make run: port {taken} is in use (set DEMO_API_PORT to another port)"
        )
    assert not port_in_use("127.0.0.1", taken)
    assert first_taken("127.0.0.1", {"PORT": taken}) is None


def test_the_command_prints_one_line_and_exits_1_for_a_taken_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        taken = sock.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "devstack", "ports", f"PORT={taken}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 1
    assert result.stdout == f"make run: port {taken} is in use (set PORT to another port)\n"
    assert result.stderr == ""


def test_the_command_is_silent_when_the_ports_are_free():
    result = subprocess.run(
        [sys.executable, "-m", "devstack", "ports", f"PORT={free_port()}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
