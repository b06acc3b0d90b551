"""`make run` (README, "Quick start"): the extra flags an operator passes
in RUN_ARGS come after the defaults instead of replacing them, so that
`make run RUN_ARGS="--http-port 18090"` still has an L1 size.  Read from
`make -n` (nothing is built or started)."""
import os
import shlex
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_line(*make_args):
    out = subprocess.run(["make", "-n", "-s", "run", *make_args], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    lines = [l for l in out.splitlines() if "/lmcached" in l and not l.startswith("cmake")]
    assert lines, out
    return shlex.split(lines[-1])


def test_run_args_add_to_the_defaults():
    argv = run_line('RUN_ARGS=--http-port 18090')
    assert argv[1:] == ["--l1-size-gb", "1", "--eviction-policy", "LRU", "--http-port", "18090"]


def test_run_args_come_last_so_a_repeated_flag_wins():
    # The server takes the last of a repeated flag.
    argv = run_line("RUN_ARGS=--l1-size-gb 4")
    assert argv[-2:] == ["--l1-size-gb", "4"]


def test_the_defaults_can_be_dropped():
    argv = run_line("RUN_DEFAULTS=", "RUN_ARGS=--l1-size-gb 2")
    assert argv[1:] == ["--l1-size-gb", "2"]
