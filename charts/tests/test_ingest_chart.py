"""`fleet ingest` in the chart: Deployment + Service (+ Ingress, CPU HPA, PDB), probes, token Secret, config."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from conftest import EVERYTHING, KUBE_VERSION, KUBE_VERSION_OLDEST, clean, render

INGEST = {"ingest": {"enabled": True}}
INGEST_EVERYTHING = {
    **copy.deepcopy(EVERYTHING),
    "ingest": {
        "enabled": True,
        "autoscaling": {"enabled": True},
        "apiToken": {"existingSecret": "fleet-ingest-token"},
        "ingress": {"enabled": True, "className": "nginx", "host": "fleet.example.com",
                    "tls": [{"hosts": ["fleet.example.com"], "secretName": "fleet-tls"}]},
    },
}


def test_ingest_is_off_by_default():
    r = render()
    assert not [d for d in r.docs if d["metadata"]["labels"].get("app.kubernetes.io/component") == "ingest"]
    assert "ingest" not in r.fleet_config()


def test_ingest_renders_deployment_service_pdb_and_config():
    r = render(INGEST)
    d = r.deployment("ingest")
    c = r.container("ingest")
    assert c["args"] == ["ingest"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8080, "metrics": 9092}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    # Serving pods drain before SIGTERM; the grace period outlasts preStop + the shutdown deadline.
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 25 + 5
    assert d["spec"]["replicas"] == 2
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["roots"] == "/etc/fleet/roots" and mounts["config"] == "/etc/fleet/fleet.yaml"
    svc = [s for s in r.of_kind("Service") if s["metadata"]["name"].endswith("-ingest")]
    assert len(svc) == 1 and svc[0]["spec"]["ports"][0]["targetPort"] == "http"
    assert any(p["metadata"]["name"].endswith("-ingest") for p in r.of_kind("PodDisruptionBudget"))
    cfg = r.fleet_config()
    assert cfg["ingest"]["topic"] in cfg["worker"]["input-topic"]
    assert cfg["ingest"]["notifications-path"] == "/apple/notifications"
    assert cfg["ingest"]["metrics-port"] == 9092
    # Both ports must be reachable from outside the pod (probes, Prometheus, the Service); the binaries default the
    # operations port to 127.0.0.1.
    assert cfg["ingest"]["host"] == "0.0.0.0" and cfg["ingest"]["metrics-host"] == "0.0.0.0"
    assert "api-token-file" not in cfg["ingest"]


def test_ingest_token_is_a_mounted_secret_never_rendered():
    r = render(INGEST_EVERYTHING)
    c = r.container("ingest")
    assert {"name": "api-token", "mountPath": "/etc/fleet/ingest-token", "readOnly": True} in c["volumeMounts"]
    vol = [v for v in r.deployment("ingest")["spec"]["template"]["spec"]["volumes"] if v["name"] == "api-token"][0]
    assert vol["secret"]["secretName"] == "fleet-ingest-token"
    assert r.fleet_config()["ingest"]["api-token-file"] == "/etc/fleet/ingest-token/token"
    assert not r.of_kind("Secret")


def test_ingest_ingress_exposes_only_the_two_endpoints_and_hpa_owns_replicas():
    r = render(INGEST_EVERYTHING)
    ing = r.one("Ingress", "ingest")
    paths = [p["path"] for p in ing["spec"]["rules"][0]["http"]["paths"]]
    assert paths == ["/apple/notifications", "/v1/transactions"]
    assert ing["spec"]["rules"][0]["host"] == "fleet.example.com"
    hpa = r.one("HorizontalPodAutoscaler", "ingest")
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert "replicas" not in r.deployment("ingest")["spec"]


@pytest.mark.parametrize("kube_version", [KUBE_VERSION, KUBE_VERSION_OLDEST])
@pytest.mark.parametrize("extra", [INGEST, INGEST_EVERYTHING], ids=["ingest", "ingest-everything"])
def test_ingest_manifests_validate(extra, kube_version):
    r = render(extra, kube_version=kube_version)
    for doc in r.docs:
        if doc["metadata"]["labels"].get("app.kubernetes.io/component") != "ingest":
            continue
        kubernetes_validate.validate(clean(doc), kube_version, strict=True)


def test_ingest_grace_period_must_outlast_the_deadline():
    with pytest.raises(Exception, match="ingest.terminationGracePeriodSeconds"):
        render({"ingest": {"enabled": True, "terminationGracePeriodSeconds": 20}})


def test_ingest_values_are_validated():
    with pytest.raises(Exception):
        render({"ingest": {"enabled": True}, "config": {"ingest": {"max-body-bytes": 10}}})
    with pytest.raises(Exception):
        render({"ingest": {"enabled": True, "bogus": 1}})
