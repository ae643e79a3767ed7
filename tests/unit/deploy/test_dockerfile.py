"""The Dockerfile (which cannot be built here) installs what ``make install`` does: the same
torch release first, then the project, whose files .dockerignore lets through."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _instructions(keyword: str) -> list[str]:
    """The arguments of every ``keyword`` instruction (continued lines joined)."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE)
    return [line.split(None, 1)[1] for line in joined.splitlines() if line.startswith(keyword)]


def test_the_image_pins_the_torch_release_make_install_does() -> None:
    (make_pin,) = re.findall(r"torch==([\w.]+)", (ROOT / "Makefile").read_text())
    assert f"TORCH_VERSION={make_pin}" in _instructions("ARG")
    (install,) = [run for run in _instructions("RUN") if "torch==" in run]
    assert "--index-url" in install  # the CPU build's index, when TORCH_INDEX_URL is given


def test_the_image_copies_the_project_and_dockerignore_lets_it_through() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copied = {source for copy in _instructions("COPY") for source in copy.split()[:-1]}
    assert {"pyproject.toml", pyproject["project"]["readme"], "cadenza"} <= copied
    allowed = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert copied <= allowed


def test_the_entrypoint_is_the_cadenza_command_under_an_init() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (entrypoint,) = _instructions("ENTRYPOINT")
    words = yaml.safe_load(entrypoint)  # the JSON (exec) form
    assert words[0].endswith("tini")  # SIGTERM to the edge alone; children reaped
    assert words[-1] in pyproject["project"]["scripts"]


def test_the_image_exposes_the_ports_the_deployment_uses() -> None:
    deployment = yaml.safe_load(
        (ROOT / "deploy" / "kubernetes" / "cadenza-deployment.yaml").read_text()
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (expose,) = _instructions("EXPOSE")
    assert sorted(int(p) for p in expose.split()) == sorted(
        p["containerPort"] for p in container["ports"]
    )
