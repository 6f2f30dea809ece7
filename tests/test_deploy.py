"""Deployment files stay loadable: YAML parses, kustomize references exist, profiles load."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tierd import TierdConfig

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kustomization", sorted((REPO / "deploy" / "k8s").rglob("kustomization.yaml")))
def test_kustomizations_reference_existing_files(kustomization: Path) -> None:
    doc = yaml.safe_load(kustomization.read_text())
    for res in doc.get("resources", []):
        assert (kustomization.parent / res).exists(), res
    for gen in doc.get("configMapGenerator", []):
        for entry in gen["files"]:
            target = entry.split("=", 1)[-1]
            assert (kustomization.parent / target).exists(), target
            TierdConfig.load(kustomization.parent / target, env={})


def test_manifests_parse_and_the_sidecar_runs_tierd_serve() -> None:
    deployment = yaml.safe_load((REPO / "deploy" / "k8s" / "base" / "deployment.yaml").read_text())
    sidecar = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "tierd")
    assert "tierd --config /etc/tierd/tierd.toml serve" in sidecar["command"][-1]
    # probes reach the API on loopback (the profile binds 127.0.0.1) at the health routes
    probes = {
        k: " ".join(sidecar[k]["exec"]["command"])
        for k in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert "127.0.0.1:8080/readyz" in probes["readinessProbe"]
    assert "127.0.0.1:8080/healthz" in probes["livenessProbe"]
    cfg = TierdConfig.load(REPO / "deploy" / "k8s" / "base" / "tierd.toml", env={})
    assert (cfg.server.host, cfg.server.port) == ("127.0.0.1", 8080)
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > cfg.server.shutdown_grace  # the drain finishes before the kubelet's SIGKILL
    for path in (REPO / "deploy").rglob("*.yaml"):
        assert yaml.safe_load(path.read_text()) is not None, path


@pytest.mark.parametrize("profile", sorted((REPO / "conf").glob("*.toml")))
def test_every_shipped_profile_loads(profile: Path) -> None:
    TierdConfig.load(profile, env={})
