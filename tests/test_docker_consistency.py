"""docker/ stays in step with the Procfile and the documented settings.

The compose file is read with a deliberately small line parser (PyYAML is not
a dependency of this project): each attache service's command sits on one line
as ``command: ["bash", "-c", "<Procfile line, $ written as $$>"]`` and the
attache settings sit in the ``x-attache-env`` block. When PyYAML happens to be
importable, a full parse is compared with the line parser's result as well.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from app.config import Settings

REPO = Path(__file__).resolve().parents[1]
PROCFILE = REPO / "Procfile"
COMPOSE = REPO / "docker" / "compose.yaml"
DOCKERFILE = REPO / "docker" / "Dockerfile"
PROCESSES = ("release", "web", "worker", "scheduler")
ENV_BLOCK = "x-attache-env"


def procfile() -> dict[str, str]:
    entries = {}
    for line in PROCFILE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, command = line.partition(":")
            entries[name.strip()] = command.strip()
    return entries


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _significant(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def compose_commands() -> dict[str, list[str]]:
    """service -> its ``command:`` list, with Compose's ``$$`` turned back into ``$``."""
    commands: dict[str, list[str]] = {}
    section = service = None
    for line in _significant(COMPOSE.read_text()):
        indent = _indent(line)
        if indent == 0:
            section, service = line.split(":", 1)[0], None
        elif indent == 2 and section == "services":
            service = line.strip().split(":", 1)[0]
        elif section == "services" and service and indent == 4:
            match = re.fullmatch(r"\s*command:\s*(\[.*\])\s*", line)
            if match:
                assert service not in commands, f"{service} has two command lines"
                raw = match.group(1)
                # a single $ would be interpolated by Compose on the host, not by the container's shell
                assert "$" not in raw.replace("$$", ""), f"{service}: write $ as $$ in compose.yaml"
                commands[service] = json.loads(raw.replace("$$", "$"))
    return commands


def compose_env_names() -> list[str]:
    """The variable names of the ``x-attache-env`` block (shared by the attache services)."""
    names: list[str] = []
    inside = False
    for line in _significant(COMPOSE.read_text()):
        if _indent(line) == 0:
            inside = line.split(":", 1)[0] == ENV_BLOCK
        elif inside:
            match = re.fullmatch(r"\s+([A-Za-z_][A-Za-z0-9_]*):(\s.*)?", line)
            assert match, f"unexpected line in {ENV_BLOCK}: {line!r}"
            names.append(match.group(1))
    return names


def known_variables() -> set[str]:
    """Every documented setting, plus the process knobs the Procfile itself reads."""
    names = {env for env, _default, _doc in Settings.documented()}
    for command in procfile().values():
        names.update(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", command))
    return names


def test_every_procfile_process_has_a_compose_service():
    assert set(procfile()) == set(PROCESSES)
    assert set(PROCESSES) <= set(compose_commands())


@pytest.mark.parametrize("process", PROCESSES)
def test_compose_command_is_the_procfile_command(process):
    command = compose_commands()[process]
    assert command[:2] == ["bash", "-c"], "run through bash -c: the Procfile lines use ${VAR:-default}"
    assert command == ["bash", "-c", procfile()[process]]


def test_compose_sets_only_documented_variables():
    names = compose_env_names()
    for required in ("DATABASE_URL", "BROKER_URL", "STORAGE_URL", "S3_ACCESS_KEY", "S3_SECRET_KEY", "PORT"):
        assert required in names
    unknown = sorted(set(names) - known_variables())
    assert not unknown, f"not settings in docs/configuration.md: {unknown}"


def test_dockerfile_defaults_to_web():
    text = DOCKERFILE.read_text()
    instructions = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert instructions[0].startswith("FROM python:3.11-slim")
    users = [line.split()[1] for line in instructions if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), "the image must run as a non-root user"
    assert any("/healthz" in line for line in instructions if line.startswith(("HEALTHCHECK", "CMD ["))), \
        "HEALTHCHECK must probe /healthz"
    cmd = [line for line in instructions if line.startswith("CMD ")]
    assert cmd, "the image needs a default CMD"
    assert json.loads(cmd[-1][len("CMD "):]) == ["bash", "-c", procfile()["web"]]


def test_schema_is_installed_with_the_package():
    import tomllib

    from app.core import messages

    package = REPO / "app"
    assert messages.SCHEMA_PATH.is_file()
    assert messages.SCHEMA_PATH.is_relative_to(package), "the schema must be read from inside the package"
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["app"]
    relative = messages.SCHEMA_PATH.relative_to(package)
    assert any(relative.match(pattern) for pattern in data), f"{relative} is not in package-data"
    assert (REPO / "schemas" / "jobs.schema.json").resolve() == messages.SCHEMA_PATH.resolve()


def test_line_parser_agrees_with_yaml():
    yaml = pytest.importorskip("yaml")
    document = yaml.safe_load(COMPOSE.read_text())
    services = document["services"]
    commands = compose_commands()
    for process in PROCESSES:
        service = services[process]
        assert [part.replace("$$", "$") for part in service["command"]] == commands[process]
        assert sorted(service["environment"]) == sorted(compose_env_names())
        assert service["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
    for process in ("web", "worker", "scheduler"):
        depends = services[process]["depends_on"]
        assert depends["release"]["condition"] == "service_completed_successfully"
        assert depends["postgres"]["condition"] == "service_healthy"
        assert depends["rabbitmq"]["condition"] == "service_healthy"
    assert "8000:8000" in services["web"]["ports"]


def compose_ports() -> dict[str, list[str]]:
    """service -> its published ``ports:`` entries, as written."""
    ports: dict[str, list[str]] = {}
    section = service = None
    inside = False
    for line in _significant(COMPOSE.read_text()):
        indent = _indent(line)
        if indent == 0:
            section, service, inside = line.split(":", 1)[0], None, False
        elif indent == 2 and section == "services":
            service, inside = line.strip().split(":", 1)[0], False
        elif section == "services" and service and indent == 4:
            inside = line.strip() == "ports:"
        elif inside and indent >= 6:
            match = re.fullmatch(r"\s*-\s*\"?([^\"#\s]+)\"?\s*(#.*)?", line)
            assert match, f"unexpected ports line: {line!r}"
            ports.setdefault(service, []).append(match.group(1))
    return ports


def test_only_web_is_published_beyond_this_machine():
    """The RabbitMQ management UI and the MinIO console log in with the compose file's passwords."""
    ports = compose_ports()
    assert ports["web"] == ["8000:8000"]
    assert ports["rabbitmq"] == ["127.0.0.1:15672:15672"] and ports["minio"] == ["127.0.0.1:9001:9001"]
    for service, entries in ports.items():
        if service != "web":
            assert all(entry.startswith("127.0.0.1:") for entry in entries), (service, entries)


def test_compose_has_no_default_api_token():
    """The API needs ATTACHE_API_TOKENS; compose takes it from the shell and has no token of its own."""
    line = next(line for line in COMPOSE.read_text().splitlines() if line.strip().startswith("ATTACHE_API_TOKENS:"))
    value = line.split(":", 1)[1].strip().strip('"')
    assert value.startswith("${ATTACHE_API_TOKENS:?"), "no default: compose refuses to start without tokens"
    readme = (REPO / "docker" / "README.md").read_text()
    assert "no API authentication" not in readme and "ATTACHE_API_TOKENS" in readme


def test_line_parser_agrees_with_yaml_on_ports():
    yaml = pytest.importorskip("yaml")
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert {name: service["ports"] for name, service in services.items() if "ports" in service} == compose_ports()
