"""deploy/kubernetes and deploy/grafana, checked offline: every manifest against the Kubernetes
API's schemas (kubernetes-validate ships them), KEDA's ScaledObject by hand and through the
HorizontalPodAutoscaler KEDA makes of it, and all of it against cadenza itself: the ports,
probe paths, drain and timeouts the manifests and haproxy.cfg name are the ones its
configuration, its routes and its defaults have, and every metric a query names is one
cadenza/edge/server/metrics.py exports."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.utils import floatToGoString

from cadenza.config import (
    ENV_NESTED_DELIMITER,
    ENV_PREFIX,
    AdmissionConfig,
    CadenzaConfig,
    ServerConfig,
    SupervisionConfig,
    load_config,
)
from cadenza.edge.server.lifecycle import CUT_GRACE_S

ROOT = Path(__file__).resolve().parents[3]
MANIFESTS = ROOT / "deploy" / "kubernetes"
DASHBOARD = ROOT / "deploy" / "grafana" / "cadenza-fleet.json"

# The oldest Kubernetes the manifests are written for; kubernetes-validate bundles its schemas.
KUBERNETES_VERSION = "1.30"

# Flags being added on other branches, by these names: where this code has them, the node's
# configuration is checked through them; until then their values are checked here by hand.
PENDING_FLAGS = {
    "--agent-port": ("server", "agent_port"),
    "--node-id": ("server", "node_id"),
    "--redis-url": ("limits", "redis_url"),
}
AGENT_PORT = 8001  # the agent check's port in these manifests (server.agent_port has none)
HTTP_PORT = 8000

# What a node needs past its drain before the kubelet may kill it: its edge gives the streams
# it ended CUT_GRACE_S to say so, then stops its engines one after another, each given 10 s to
# exit and 5 s after a SIGTERM (EngineClient.close, whose waits are not settings).
ENGINE_STOP_S = 10 + 5

# Labels a scrape adds to every sample (node: server.node_id's label, once every metric has it).
TARGET_LABELS = {"instance", "job", "namespace", "pod", "node"}


# -- the manifests ----------------------------------------------------------------------------


def _manifest_files() -> list[Path]:
    return sorted(p for p in MANIFESTS.glob("*.yaml") if p.name != "kustomization.yaml")


def _objects() -> list[dict[str, Any]]:
    objects = []
    for path in _manifest_files():
        objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return objects


def _object(kind: str, name: str) -> dict[str, Any]:
    found = [o for o in _objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def _container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["name"] == name
    return container


def _port(container: dict[str, Any], name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return int(port)


def _is_custom_resource(obj: dict[str, Any]) -> bool:
    return obj["apiVersion"].split("/")[0].endswith(".sh")  # keda.sh


def _ids(objects: list[dict[str, Any]]) -> list[str]:
    return [f"{o['kind']}/{o['metadata']['name']}" for o in objects]


def test_the_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in _manifest_files())


BUILT_IN = [o for o in _objects() if not _is_custom_resource(o)]


@pytest.mark.parametrize("obj", BUILT_IN, ids=_ids(BUILT_IN))
def test_every_manifest_validates_against_the_kubernetes_schemas(obj: dict[str, Any]) -> None:
    # strict: a field the API does not have (a typo) is an error, as the API server says too;
    # the answer is the version whose schemas it used (the nearest older one it bundles)
    assert kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION


def test_every_object_lives_in_the_namespace_the_manifests_make() -> None:
    (namespace,) = [o for o in _objects() if o["kind"] == "Namespace"]
    for obj in _objects():
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == namespace["metadata"]["name"], obj["kind"]


def test_a_port_given_as_a_string_is_rejected_naming_the_field() -> None:
    deployment = copy.deepcopy(_object("Deployment", "cadenza"))
    _container(deployment, "cadenza")["ports"][0]["containerPort"] = "8000"
    with pytest.raises(kubernetes_validate.ValidationError) as caught:
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    assert list(caught.value.path)[-1] == "containerPort"
    assert "'8000' is not of type 'integer'" in caught.value.message


def test_a_misspelt_field_is_rejected_naming_it() -> None:
    deployment = copy.deepcopy(_object("Deployment", "cadenza"))
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 60
    with pytest.raises(kubernetes_validate.ValidationError) as caught:
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    assert "terminationGracePeriod" in caught.value.message


SERVICES = [o for o in BUILT_IN if o["kind"] == "Service"]


@pytest.mark.parametrize("service", SERVICES, ids=_ids(SERVICES))
def test_each_service_selects_pods_and_ports_that_exist(service: dict[str, Any]) -> None:
    selector = service["spec"]["selector"]
    pods = [
        o["spec"]["template"]
        for o in _objects()
        if o["kind"] == "Deployment"
        and selector.items() <= o["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert len(pods) == 1, f"{service['metadata']['name']} selects {len(pods)} deployments"
    container_ports = [p for c in pods[0]["spec"]["containers"] for p in c["ports"]]
    for port in service["spec"]["ports"]:
        target = port["targetPort"]
        key = "name" if isinstance(target, str) else "containerPort"
        assert any(p[key] == target for p in container_ports), (service["metadata"], target)


# -- the cadenza node against cadenza's own configuration and routes ---------------------------


@dataclass(frozen=True)
class Node:
    """What the cadenza Deployment's command line and environment make of a node."""

    config: CadenzaConfig
    pending: dict[str, str]  # PENDING_FLAGS this code does not know yet: flag -> value
    environment: dict[str, str]  # as the container sees it (sample values, see _sample)


SAMPLE_POD_NAME = "cadenza-7c9d8f6b5-x2x9q"


def _sample_secret(name: str, key: str) -> str:
    """What a Secret's key holds in a real cluster, for the loader (the example Secrets hold
    placeholders cadenza refuses): letters, digits and dashes, long enough for any secret."""
    return f"sample-{name}-{key}-0123456789abcdef0123456789abcdef"


_REFERENCE = re.compile(r"\$\((\w+)\)")


def _expanded(text: str, environment: dict[str, str]) -> str:
    """``$(NAME)`` replaced as the kubelet does: by a variable defined before (else kept)."""
    return _REFERENCE.sub(lambda m: environment.get(m[1], m[0]), text)


def _environment(container: dict[str, Any]) -> dict[str, str]:
    """The container's variables as it sees them: literal values expanded, the downward API's
    pod name and Secrets' keys as samples."""
    environment: dict[str, str] = {}
    for variable in container["env"]:
        if "value" in variable:
            value = _expanded(variable["value"], environment)
        elif "secretKeyRef" in variable["valueFrom"]:
            ref = variable["valueFrom"]["secretKeyRef"]
            value = _sample_secret(ref["name"], ref["key"])
        else:  # the downward API
            assert variable["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            value = SAMPLE_POD_NAME
        environment[variable["name"]] = value
    return environment


def _node(monkeypatch: pytest.MonkeyPatch) -> Node:
    """The node's configuration, built by cadenza's own command line and loader from the
    container's arguments and its CADENZA_* variables (and nothing of the test's own)."""
    from cadenza.cli import build_parser
    from cadenza.cli.options import overrides

    container = _container(_object("Deployment", "cadenza"), "cadenza")
    environment = _environment(container)
    # $(NAME) in args is the kubelet's expansion of the container's own variables
    args = [_expanded(a, environment) for a in container["args"]]
    parsed, unknown = build_parser().parse_known_args(args)
    pending = dict(zip(unknown[::2], unknown[1::2], strict=True))
    assert set(pending) <= set(PENDING_FLAGS), f"flags cadenza does not have: {unknown}"
    for name in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in environment.items():
        if name.startswith(ENV_PREFIX):
            monkeypatch.setenv(name, value)
    return Node(load_config(parsed.config, overrides(parsed)), pending, environment)


def _setting(node: Node, flag: str) -> str | None:
    """A pending flag's value: from the configuration where this code has the key, else as
    the command line gives it."""
    section, key = PENDING_FLAGS[flag]
    if hasattr(getattr(node.config, section), key):
        value = getattr(getattr(node.config, section), key)
        return None if value is None else str(value)
    return node.pending.get(flag)


def test_the_node_listens_where_its_ports_and_services_say(monkeypatch) -> None:
    node = _node(monkeypatch)
    container = _container(_object("Deployment", "cadenza"), "cadenza")
    assert node.config.server.host == "0.0.0.0"  # not the loopback default: probes, HAProxy
    assert node.config.server.port == _port(container, "http") == HTTP_PORT
    assert _setting(node, "--agent-port") == str(_port(container, "agent")) == str(AGENT_PORT)


def test_the_node_is_named_after_its_pod(monkeypatch) -> None:
    assert _setting(_node(monkeypatch), "--node-id") == SAMPLE_POD_NAME


def test_the_node_shares_its_quotas_in_the_redis_service(monkeypatch) -> None:
    url = urlsplit(_setting(_node(monkeypatch), "--redis-url") or "")
    service = _object("Service", "redis")
    assert url.scheme == "redis"
    assert url.hostname == service["metadata"]["name"]  # same namespace: the short name
    assert url.port in [p["port"] for p in service["spec"]["ports"]]


def test_every_cadenza_variable_names_a_configuration_key() -> None:
    container = _container(_object("Deployment", "cadenza"), "cadenza")
    sections = CadenzaConfig.model_fields
    for variable in container["env"]:
        name = variable["name"]
        if not name.startswith(ENV_PREFIX):
            continue
        section, key = name[len(ENV_PREFIX) :].lower().split(ENV_NESTED_DELIMITER)
        assert section in sections, name
        assert key in sections[section].annotation.model_fields, name  # type: ignore[union-attr]


def test_the_calibration_cache_is_on_a_volume(monkeypatch) -> None:
    node = _node(monkeypatch)
    container = _container(_object("Deployment", "cadenza"), "cadenza")
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert node.config.calibration.cache_dir in mounts
    assert not mounts[node.config.calibration.cache_dir].get("readOnly", False)


def test_the_weights_come_from_the_hub_cache_volume_offline(monkeypatch) -> None:
    node = _node(monkeypatch)
    deployment = _object("Deployment", "cadenza")
    container = _container(deployment, "cadenza")
    assert node.environment["HF_HUB_OFFLINE"] == "1"
    (mount,) = [
        m for m in container["volumeMounts"] if m["mountPath"] == node.environment["HF_HOME"]
    ]
    (volume,) = [
        v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    ]
    claim = volume["persistentVolumeClaim"]["claimName"]
    assert _object("PersistentVolumeClaim", claim)


def test_the_grace_period_outlasts_the_drain(monkeypatch) -> None:
    """The node's drain (``ServerConfig``'s default unless the manifest sets one), then the
    stop of every engine it runs (replicas unset: one on a node with one GPU)."""
    config = _node(monkeypatch).config
    engines = len(config.served_models()) * (config.supervision.replicas or 1)
    engines *= 2 if config.supervision.warm_spare else 1
    shutdown_s = config.server.drain_timeout_s + CUT_GRACE_S + engines * ENGINE_STOP_S
    pod = _object("Deployment", "cadenza")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > shutdown_s


def test_the_startup_probe_waits_as_long_as_an_engine_may_take_to_load() -> None:
    container = _container(_object("Deployment", "cadenza"), "cadenza")
    probe = container["startupProbe"]
    window_s = (
        probe.get("initialDelaySeconds", 0) + probe["periodSeconds"] * probe["failureThreshold"]
    )
    assert window_s >= SupervisionConfig().startup_timeout_s


def _edge_get_routes() -> set[str]:
    from cadenza.edge.server.app import create_app

    app = create_app(CadenzaConfig())
    return {r.path for r in app.routes if "GET" in getattr(r, "methods", ())}


def test_the_probes_and_the_scrape_are_routes_the_edge_serves() -> None:
    routes = _edge_get_routes()
    deployment = _object("Deployment", "cadenza")
    template = deployment["spec"]["template"]
    container = _container(deployment, "cadenza")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] in routes, probe
        assert container[probe]["httpGet"]["port"] == "http"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"  # 503 while draining
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"  # 200 while it serves
    assert template["metadata"]["annotations"]["prometheus.io/path"] in routes
    assert int(template["metadata"]["annotations"]["prometheus.io/port"]) == HTTP_PORT


def test_healthz_answers_without_an_engine() -> None:
    """The liveness probe's route: 200 from the app alone (no lifespan, so no engine), as it
    stays while engines restart and while the node drains."""
    from fastapi.testclient import TestClient

    from cadenza.edge.server.app import create_app

    response = TestClient(create_app(CadenzaConfig())).get("/healthz")
    assert response.status_code == 200


def test_the_headless_service_lists_every_node_for_haproxy() -> None:
    service = _object("Service", "cadenza-nodes")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True


# -- who may connect: keys, tokens, origins, Redis's password ----------------------------------


def _secret_keys() -> dict[str, set[str]]:
    """The Secrets the manifests make, each with its keys."""
    return {
        o["metadata"]["name"]: set(o.get("stringData", {})) | set(o.get("data", {}))
        for o in _objects()
        if o["kind"] == "Secret"
    }


def _secret_ref(container: dict[str, Any], name: str) -> tuple[str, str]:
    """The Secret and key variable ``name`` of ``container`` comes from."""
    (variable,) = [v for v in container["env"] if v["name"] == name]
    assert "value" not in variable, f"{name} is written in the manifest, not in a Secret"
    ref = variable["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


def test_every_secret_a_pod_uses_is_one_the_manifests_make() -> None:
    secrets = _secret_keys()
    used = 0
    for deployment in [o for o in _objects() if o["kind"] == "Deployment"]:
        pod = deployment["spec"]["template"]["spec"]
        for container in pod["containers"]:
            for variable in container.get("env", []):
                ref = variable.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets[ref["name"]], ref
                    used += 1
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                items = volume["secret"]["items"]
                assert {item["key"] for item in items} <= secrets[volume["secret"]["secretName"]]
                used += 1
    assert used >= 4  # the key files, the token secret, Redis's password on both sides


def test_the_example_secrets_hold_placeholders_cadenza_refuses(tmp_path: Path) -> None:
    """Applied as shipped, the nodes do not start: no key file holds a key, the token secret
    is too short. Nothing runs open, or on a secret everyone can read here."""
    from cadenza.config import AuthConfig
    from cadenza.edge.auth.api_keys import ApiKeyFileError, ApiKeys

    keys = _object("Secret", "cadenza-keys")["stringData"]
    for name in ("api-keys", "admin-keys"):
        (tmp_path / name).write_text(keys[name])
        with pytest.raises(ApiKeyFileError, match="holds no key"):
            ApiKeys.load(tmp_path / name)
    token_secret = _object("Secret", "cadenza-auth")["stringData"]["token-secret"]
    with pytest.raises(ValueError, match="at least 32 characters"):
        AuthConfig(token_secret=token_secret)


def test_the_node_takes_stream_and_admin_keys_from_a_secret(monkeypatch) -> None:
    node = _node(monkeypatch)
    deployment = _object("Deployment", "cadenza")
    container = _container(deployment, "cadenza")
    names = {variable["name"] for variable in container["env"]}
    assert "CADENZA_SERVER__API_KEYS_FILE" not in names  # the old key, deprecated
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    for path in (node.config.auth.api_keys_file, node.config.auth.admin_keys_file):
        assert path is not None  # keys on: the node is not open, /admin/* takes admin keys
        directory, file_name = path.rsplit("/", 1)
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == directory]
        assert mount["readOnly"] is True
        secret = volumes[mount["name"]]["secret"]
        assert file_name in [item["path"] for item in secret["items"]]
        assert secret["defaultMode"] & 0o007 == 0  # not readable by other users
    assert node.config.auth.api_keys_file != node.config.auth.admin_keys_file


def test_the_token_secret_comes_from_a_secret(monkeypatch) -> None:
    container = _container(_object("Deployment", "cadenza"), "cadenza")
    name, key = _secret_ref(container, "CADENZA_AUTH__TOKEN_SECRET")
    token_secret = _node(monkeypatch).config.auth.token_secret
    assert token_secret is not None
    assert token_secret.get_secret_value() == _sample_secret(name, key)


def test_redis_takes_a_password_and_the_nodes_give_it(monkeypatch) -> None:
    redis = _container(_object("Deployment", "redis"), "redis")
    args = redis["args"]
    password_variable = _REFERENCE.fullmatch(args[args.index("--requirepass") + 1])
    assert password_variable is not None  # $(NAME): the kubelet's expansion
    secret = _secret_ref(redis, password_variable[1])
    assert _secret_ref(redis, "REDISCLI_AUTH") == secret  # the probe's redis-cli logs in
    assert redis["readinessProbe"]["exec"]["command"][0] == "redis-cli"
    url = urlsplit(_setting(_node(monkeypatch), "--redis-url") or "")
    assert url.password == _sample_secret(*secret)  # the same Secret's key, in the URL


def test_browser_origins_are_set(monkeypatch) -> None:
    origins = _node(monkeypatch).config.auth.allowed_origins
    assert origins and all(origin.startswith("https://") for origin in origins)


# -- HAProxy --------------------------------------------------------------------------------


def _haproxy_cfg() -> str:
    return str(_object("ConfigMap", "haproxy-config")["data"]["haproxy.cfg"])


def _haproxy_sections(cfg: str) -> dict[str, list[list[str]]]:
    """``{"backend cadenza_nodes": [["balance", "leastconn"], ...], ...}``."""
    sections: dict[str, list[list[str]]] = {}
    current: list[list[str]] = []
    for line in cfg.splitlines():
        words = line.split("#")[0].split()
        if not words:
            continue
        if not line[0].isspace():
            current = sections.setdefault(" ".join(words), [])
        else:
            current.append(words)
    return sections


def _directive(lines: list[list[str]], *prefix: str) -> list[str]:
    found = [words for words in lines if words[: len(prefix)] == list(prefix)]
    assert len(found) == 1, f"expected one {' '.join(prefix)}, found {found}"
    return found[0][len(prefix) :]


def _seconds(haproxy_time: str) -> float:
    value, unit = re.fullmatch(r"(\d+)(us|ms|s|m|h|d)?", haproxy_time).groups()  # type: ignore[union-attr]
    scale = {"us": 1e-6, "ms": 1e-3, None: 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    return int(value) * scale


def _backend() -> list[list[str]]:
    sections = _haproxy_sections(_haproxy_cfg())
    (frontend,) = [
        lines
        for name, lines in sections.items()
        if name.startswith("frontend") and any(words[0] == "default_backend" for words in lines)
    ]
    return sections[f"backend {_directive(frontend, 'default_backend')[0]}"]


def test_haproxy_balances_on_leastconn_and_retries_refusals_elsewhere() -> None:
    backend = _backend()
    assert _directive(backend, "balance") == ["leastconn"]
    assert "503" in _directive(backend, "retry-on")
    assert int(_directive(backend, "retries")[0]) >= 1
    _directive(backend, "option", "redispatch")


def test_haproxy_checks_the_nodes_readiness_and_agent() -> None:
    container = _container(_object("Deployment", "cadenza"), "cadenza")
    backend = _backend()
    assert _directive(backend, "option", "httpchk") == [
        "GET",
        container["readinessProbe"]["httpGet"]["path"],
    ]
    server = _directive(backend, "default-server")
    assert "check" in server and "agent-check" in server
    assert server[server.index("agent-port") + 1] == str(_port(container, "agent"))
    assert server[server.index("init-addr") + 1] == "none"  # starts before DNS answers
    resolvers = server[server.index("resolvers") + 1]
    assert f"resolvers {resolvers}" in _haproxy_sections(_haproxy_cfg())


def test_haproxy_finds_the_nodes_through_the_headless_service() -> None:
    service = _object("Service", "cadenza-nodes")
    deployment = _object("Deployment", "cadenza")
    scaler = _object("ScaledObject", "cadenza")
    _prefix, slots, address = _directive(_backend(), "server-template")
    host, port = address.rsplit(":", 1)
    meta = service["metadata"]
    assert host == f"{meta['name']}.{meta['namespace']}.svc.cluster.local"  # no search domains
    assert int(port) == _port(_container(deployment, "cadenza"), "http")
    surge = deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"]
    assert int(slots) >= scaler["spec"]["maxReplicaCount"] + surge


def test_haproxy_waits_as_long_as_cadenza_may() -> None:
    """A request may wait for capacity up to its class's longest wait before its first byte;
    a WebSocket may idle as long as cadenza lets it."""
    defaults = _haproxy_sections(_haproxy_cfg())["defaults"]
    admission = AdmissionConfig()
    longest_wait_s = max(
        admission.realtime_max_wait_s, admission.standard_max_wait_s, admission.batch_max_wait_s
    )
    assert _seconds(_directive(defaults, "timeout", "server")[0]) > longest_wait_s
    assert _seconds(_directive(defaults, "timeout", "client")[0]) > longest_wait_s
    assert _seconds(_directive(defaults, "timeout", "tunnel")[0]) >= max(
        ServerConfig().ws_idle_timeout_s, 3600
    )


def test_haproxy_listens_where_its_pod_and_service_say() -> None:
    sections = _haproxy_sections(_haproxy_cfg())
    binds = {
        int(_directive(lines, "bind")[0].rsplit(":", 1)[1]): name
        for name, lines in sections.items()
        if name.startswith("frontend")
    }
    deployment = _object("Deployment", "haproxy")
    container = _container(deployment, "haproxy")
    assert container["image"] == "haproxy:2.6"
    assert sorted(binds) == sorted(p["containerPort"] for p in container["ports"])
    front = _object("Service", "cadenza-front")
    assert front["spec"]["type"] == "LoadBalancer"
    (target,) = [p["targetPort"] for p in front["spec"]["ports"]]
    assert "default_backend" in {w[0] for w in sections[binds[_port(container, target)]]}
    stats = sections[binds[_port(container, "stats")]]
    assert container["readinessProbe"]["httpGet"]["path"] == _directive(stats, "monitor-uri")[0]
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == "/usr/local/etc/haproxy"  # where the image reads haproxy.cfg
    (volume,) = deployment["spec"]["template"]["spec"]["volumes"]
    assert volume["configMap"]["name"] == "haproxy-config"


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="no haproxy binary (make infra)")
def test_haproxy_accepts_the_configuration(tmp_path: Path) -> None:
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(_haproxy_cfg())
    checked = subprocess.run(
        ["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30
    )
    output = checked.stdout + checked.stderr
    assert checked.returncode == 0, output
    assert "could not resolve" not in output  # init-addr none: no DNS at start


def test_the_static_front_door_balances_and_checks_alike(capsys) -> None:
    """``cadenza haproxy-config`` (a fixed set of nodes) and this ConfigMap (nodes found in
    DNS) send streams and check nodes the same way."""
    from cadenza.cli import main

    node = f"10.0.0.1:{HTTP_PORT}:{AGENT_PORT}"
    assert main(["haproxy-config", "--listen", "0.0.0.0:8080", "--node", node]) == 0
    written = capsys.readouterr().out
    assert "backend" in written
    static = [words for lines in _haproxy_sections(written).values() for words in lines]
    ours = _backend()
    assert _directive(static, "balance") == _directive(ours, "balance")
    assert _directive(static, "option", "httpchk") == _directive(ours, "option", "httpchk")
    assert f"agent-port {AGENT_PORT}" in written


ADMIN_DENIAL = ["http-request", "deny", "deny_status", "403", "if", "{", "path,url_dec", "-m"]


def test_admin_routes_are_refused_at_the_door_as_the_static_front_door_refuses_them(
    capsys,
) -> None:
    """``/admin/*`` acts on one node, and a node without admin keys trusts loopback callers:
    the door refuses it (403), with the very rule ``cadenza haproxy-config`` writes (its
    effect on a real HAProxy: tests/integration/test_haproxy_front_door.py)."""
    from cadenza.cli import main

    node = f"10.0.0.1:{HTTP_PORT}:{AGENT_PORT}"
    assert main(["haproxy-config", "--listen", "0.0.0.0:8080", "--node", node]) == 0
    static = _haproxy_sections(capsys.readouterr().out)["frontend cadenza"]
    ours = [
        lines
        for name, lines in _haproxy_sections(_haproxy_cfg()).items()
        if name.startswith("frontend") and any(words[0] == "default_backend" for words in lines)
    ]
    (frontend,) = ours
    (rule,) = [words for words in static if words[:8] == ADMIN_DENIAL]
    assert rule == [*ADMIN_DENIAL, "beg", "/admin/", "}"]
    assert rule in frontend
    # before default_backend, so that no request reaches a node first
    assert frontend.index(rule) < frontend.index(["default_backend", "cadenza_nodes"])


# -- metrics: what cadenza exports, and the queries over them --------------------------------


@dataclass(frozen=True)
class Series:
    """One exported sample name: its family's type and label names, and for a histogram's
    buckets their ``le`` values as the exposition writes them."""

    family: str
    kind: str
    labels: frozenset[str]
    le_values: frozenset[str] = frozenset()


def _exported_series() -> dict[str, Series]:
    """Every sample name ``/metrics`` can print. prometheus_client keeps a family's name (a
    counter's without ``_total``), type, label names and bucket bounds on these attributes;
    nothing public gives them before a labelled series exists."""
    from cadenza.edge.server.metrics import Metrics

    series: dict[str, Series] = {}
    for metric in vars(Metrics()).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        name, kind = metric._name, metric._type
        labels = frozenset(metric._labelnames)
        if kind == "gauge":
            series[name] = Series(name, kind, labels)
        elif kind == "counter":
            for suffix in ("_total", "_created"):
                series[name + suffix] = Series(name, kind, labels)
        elif kind == "histogram":
            bounds = frozenset(floatToGoString(b) for b in metric._upper_bounds)
            series[f"{name}_bucket"] = Series(name, kind, labels | {"le"}, bounds)
            for suffix in ("_sum", "_count", "_created"):
                series[name + suffix] = Series(name, kind, labels)
        else:
            raise AssertionError(f"{name}: a {kind}, which this test does not know")
    return series


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_METRIC = re.compile(r"\bcadenza_[A-Za-z0-9_:]*")
_SELECTOR = re.compile(r"\b(cadenza_[A-Za-z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r'\s*([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")\s*,?')
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def query_problems(expr: str, series: dict[str, Series]) -> list[str]:
    """What in PromQL ``expr`` names something cadenza does not export: unknown sample names
    (suffixes as each family's type has them: a gauge named ``..._total`` is itself), label
    matchers and groupings on labels the series lack, ``le`` values that are no bucket's."""
    problems = []
    names = _METRIC.findall(_STRING.sub('""', expr))
    if not names:
        problems.append("names no cadenza metric")
    problems += [f"{name} is not exported" for name in names if name not in series]
    known = set(TARGET_LABELS)
    for name in names:
        known |= series[name].labels if name in series else set()
    for name, matchers in _SELECTOR.findall(expr):
        if name not in series:
            continue
        for label, value in _MATCHER.findall(matchers):
            if label not in series[name].labels | TARGET_LABELS:
                problems.append(f"{name} has no label {label}")
            if label == "le" and json.loads(value) not in series[name].le_values:
                problems.append(f"{name} has no bucket le={value}")
    for grouping in _GROUPING.findall(expr):
        for label in (g.strip() for g in grouping.split(",")):
            if label and not label.startswith("$") and label not in known:
                problems.append(f"grouped by {label}, which none of its series has")
    return problems


def test_query_problems_knows_each_familys_suffixes() -> None:
    series = _exported_series()
    assert query_problems("cadenza_kv_pages_total", series) == []  # a gauge, named so
    assert query_problems("cadenza_kv_pages", series) == ["cadenza_kv_pages is not exported"]
    assert query_problems("rate(cadenza_http_requests_total[5m])", series) == []
    assert query_problems("cadenza_http_requests", series) != []  # a counter: _total
    assert query_problems("rate(cadenza_engine_step_seconds_bucket[5m])", series) == []
    assert query_problems("cadenza_engine_step_seconds", series) != []  # a histogram
    assert query_problems("cadenza_streams_active_total", series) != []  # a gauge
    assert query_problems('cadenza_chunk_deadline_slack_seconds_bucket{le="0.0"}', series) == []
    assert query_problems('cadenza_chunk_deadline_slack_seconds_bucket{le="0"}', series) == [
        'cadenza_chunk_deadline_slack_seconds_bucket has no bucket le="0"'
    ]
    assert query_problems('cadenza_engine_ready{basis="held"}', series) == [
        "cadenza_engine_ready has no label basis"
    ]
    assert query_problems("sum by (code) (cadenza_engine_ready)", series) == [
        "grouped by code, which none of its series has"
    ]
    assert query_problems('sum(up{job="cadenza_x"})', series) == ["names no cadenza metric"]


def test_the_autoscaler_queries_metrics_cadenza_exports() -> None:
    (trigger,) = _object("ScaledObject", "cadenza")["spec"]["triggers"]
    assert query_problems(trigger["metadata"]["query"], _exported_series()) == []


# -- KEDA -----------------------------------------------------------------------------------


def test_the_scaled_object_scales_the_cadenza_deployment() -> None:
    scaler = _object("ScaledObject", "cadenza")
    deployment = _object("Deployment", "cadenza")
    assert scaler["apiVersion"] == "keda.sh/v1alpha1"
    target = scaler["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        deployment["apiVersion"],
        deployment["kind"],
        deployment["metadata"]["name"],
    )
    assert scaler["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    minimum, maximum = scaler["spec"]["minReplicaCount"], scaler["spec"]["maxReplicaCount"]
    assert isinstance(minimum, int) and isinstance(maximum, int)
    assert 1 <= minimum <= maximum  # never zero: a node takes minutes to load


def test_the_scaled_objects_trigger_is_a_utilisation_on_prometheus() -> None:
    (trigger,) = _object("ScaledObject", "cadenza")["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "Value"  # the fleet's ratio, not a per-pod average
    metadata = trigger["metadata"]
    assert all(isinstance(v, str) for v in metadata.values())  # KEDA reads strings only
    assert {"serverAddress", "query", "threshold"} <= set(metadata)
    assert urlsplit(metadata["serverAddress"]).scheme in ("http", "https")
    assert 0 < float(metadata["threshold"]) <= 1
    assert metadata["ignoreNullValues"] == "false"


def test_the_autoscaler_keda_makes_validates() -> None:
    """KEDA drives an autoscaling/v2 HorizontalPodAutoscaler made from the ScaledObject (its
    target, bounds and behavior, the trigger as an external metric): that one validates."""
    scaler = _object("ScaledObject", "cadenza")
    spec = scaler["spec"]
    (trigger,) = spec["triggers"]
    value_key = {"Value": "value", "AverageValue": "averageValue"}[trigger["metricType"]]
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {**scaler["metadata"], "name": f"keda-hpa-{scaler['metadata']['name']}"},
        "spec": {
            "scaleTargetRef": spec["scaleTargetRef"],
            "minReplicas": spec["minReplicaCount"],
            "maxReplicas": spec["maxReplicaCount"],
            "behavior": spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {"name": "s0-prometheus"},
                        "target": {
                            "type": trigger["metricType"],
                            value_key: trigger["metadata"]["threshold"],
                        },
                    },
                }
            ],
        },
    }
    kubernetes_validate.validate(hpa, KUBERNETES_VERSION, strict=True)


# -- Grafana ----------------------------------------------------------------------------------


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panels() -> list[dict[str, Any]]:
    return [p for p in _dashboard()["panels"] if p["type"] != "row"]


def test_the_dashboards_panels_each_query_and_have_their_own_id() -> None:
    ids = [p["id"] for p in _dashboard()["panels"]]
    assert len(ids) == len(set(ids))
    for panel in _panels():
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_dashboard_query_names_metrics_cadenza_exports() -> None:
    series = _exported_series()
    problems = {
        f"{panel['title']} / {target['refId']}": query_problems(target["expr"], series)
        for panel in _panels()
        for target in panel["targets"]
    }
    templating = _dashboard()["templating"]["list"]
    for variable in templating:
        if variable["type"] == "query":
            problems[f"${variable['name']}"] = query_problems(variable["definition"], series)
    assert {where: found for where, found in problems.items() if found} == {}


def test_the_dashboards_variables_are_defined() -> None:
    defined = {v["name"] for v in _dashboard()["templating"]["list"]}
    used = set(re.findall(r"\$\{?(\w+)", DASHBOARD.read_text()))
    assert {name for name in used if not name.startswith("__")} <= defined
    (node_label,) = [v for v in _dashboard()["templating"]["list"] if v["name"] == "node_label"]
    assert {o["value"] for o in node_label["options"]} == {"instance", "node"}
