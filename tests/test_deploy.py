"""The container and service files agree with the bot: the same install script, the data directory, the stop grace,
and model servers reached by the names compose gives them. (No image is built here: see docs/deploy.md.)"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import yaml

from bot.program.config import Settings

ROOT = Path(__file__).resolve().parent.parent
GRACE = Settings().turns.shutdown_grace_seconds


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [tuple(line.split(None, 1)) for line in lines]  # type: ignore[misc]


def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_the_dockerfile_installs_with_setup_sh_and_migrates_before_running():
    instructions = dockerfile_instructions()
    runs = [args for name, args in instructions if name == "RUN"]
    assert any("bash scripts/setup.sh" in run for run in runs)
    assert not any("pip install" in run for run in runs)  # one install path: the script CI runs
    (cmd,) = [args for name, args in instructions if name == "CMD"]
    assert cmd.index("qwenbot migrate") < cmd.index("exec .venv/bin/qwenbot run")  # run as PID 1, gets SIGTERM
    assert ("VOLUME", "/app/data") in instructions and ("USER", "qwenbot") in instructions


def test_the_image_takes_its_base_as_an_argument_installs_no_test_extras_and_checks_its_health():
    instructions = dockerfile_instructions()
    assert instructions[0] == ("ARG", "BASE_IMAGE=python:3.11-slim") and ("FROM", "${BASE_IMAGE}") in instructions
    (setup,) = [args for name, args in instructions if name == "RUN" and "scripts/setup.sh" in args]
    assert "SETUP_EXTRAS= bash scripts/setup.sh" in setup  # no pytest and friends in the image
    (health,) = [args for name, args in instructions if name == "HEALTHCHECK"]
    assert health.endswith('CMD [".venv/bin/qwenbot", "health"]')
    env = " ".join(args for name, args in instructions if name == "ENV")
    assert "METRICS_PORT=9464" in env and "METRICS_HOST=127.0.0.1" in env  # the endpoint, on loopback only
    assert "tests" in (ROOT / ".dockerignore").read_text().split()


def test_compose_checks_the_bots_health_and_waits_for_a_model_server_beside_it():
    services = compose()["services"]
    for name in ("bot", "bot-gpu"):
        assert services[name]["healthcheck"]["test"] == ["CMD", ".venv/bin/qwenbot", "health"]
        for server in ("vllm", "ollama"):
            assert services[name]["depends_on"][server] == {"condition": "service_healthy", "required": False}
        assert services[name]["environment"]["OPENAI_SERVER_WAIT_SECONDS"].startswith("${OPENAI_SERVER_WAIT_SECONDS:-")
    for server in ("vllm", "ollama"):
        assert services[server]["healthcheck"]["test"][0] == "CMD"


def test_compose_keeps_the_data_dir_in_a_volume_and_gives_turns_time_to_finish():
    services = compose()["services"]
    for name in ("bot", "bot-gpu"):
        assert "data:/app/data" in services[name]["volumes"]
        assert int(services[name]["stop_grace_period"].rstrip("s")) > GRACE
    assert services["bot-gpu"]["profiles"] == ["gpu"]
    assert services["bot-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "profiles" not in services["bot"]


def test_model_servers_are_optional_and_the_documented_urls_name_them():
    services = compose()["services"]
    assert services["vllm"]["profiles"] == ["vllm"] and services["ollama"]["profiles"] == ["ollama"]
    assert "--tool-call-parser hermes" in services["vllm"]["command"]
    assert "${OPENAI_API_KEY" in services["vllm"]["command"]  # the key the bot sends is the key vLLM wants
    urls = re.findall(r"OPENAI_BASE_URL=http://([\w-]+):(\d+)/v1", (ROOT / "compose.yaml").read_text())
    assert {host for host, _ in urls} == {"vllm", "ollama"}
    assert all(host in services for host, _ in urls)
    assert not any("ports" in service for service in services.values())  # nothing published


def test_the_systemd_unit_stops_gracefully_and_stops_retrying_a_bad_setting():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read(ROOT / "scripts" / "qwenbot.service")
    service = unit["Service"]
    assert service["ExecStart"].endswith("/.venv/bin/qwenbot run")
    assert service["ExecStartPre"].endswith("/.venv/bin/qwenbot migrate")
    assert int(service["TimeoutStopSec"]) > GRACE and service["KillSignal"] == "SIGTERM"
    assert service["Restart"] == "on-failure"
    # Ready once serving, and restarted by the watchdog when its health checks fail (bot/program/systemd.py).
    assert service["Type"] == "notify" and service["NotifyAccess"] == "main" and int(service["WatchdogSec"]) >= 60
    # Exit status 2 is a setting to fix, but also a model server still loading: retried, a bounded number of times.
    assert int(unit["Unit"]["StartLimitBurst"]) * int(service["RestartSec"]) < int(unit["Unit"]["StartLimitIntervalSec"])
