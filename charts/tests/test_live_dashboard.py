"""The optional `fleet dashboard` Deployment + Service (values.liveDashboard)."""

from __future__ import annotations

from conftest import render


def live(r):
    return [d for d in r.docs if d["metadata"]["labels"].get("app.kubernetes.io/component") == "live-dashboard"]


def test_disabled_by_default():
    assert live(render()) == []


def test_enabled_renders_a_deployment_and_a_service():
    r = render({"liveDashboard": {"enabled": True}})
    assert sorted(d["kind"] for d in live(r)) == ["Deployment", "Service"]
    c = r.container("live-dashboard")
    # Exactly the command's flags; topics default to the worker's; the binary binds 127.0.0.1 unless told otherwise,
    # so the chart passes 0.0.0.0 (probes, the Service).
    assert c["args"] == ["dashboard", "--result-topic", "entitlements.verified", "--rejected-topic", "appstore.rejected",
                         "--host", "0.0.0.0", "--port", "8080"]
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    env = {e["name"]: e for e in c["env"]}
    assert env["FLEET_CONFIG"]["value"] == "/etc/fleet/fleet.yaml"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    pod = r.deployment("live-dashboard")["spec"]["template"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8080"
    svc = r.one("Service", "live-dashboard")
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    assert svc["spec"]["selector"] == r.deployment("live-dashboard")["spec"]["selector"]["matchLabels"]


def test_topics_port_and_credentials_follow_the_values():
    r = render({
        "liveDashboard": {"enabled": True, "host": "::", "port": 9000, "resultTopic": "ent.v1", "rejectedTopic": "raw.rej",
                          "service": {"type": "LoadBalancer", "port": 8443}},
        "kafkaAuth": {"sasl": {"enabled": True, "existingSecret": "kafka-credentials"}},
    })
    c = r.container("live-dashboard")
    assert c["args"] == ["dashboard", "--result-topic", "ent.v1", "--rejected-topic", "raw.rej", "--host", "::",
                         "--port", "9000"]
    # Credentials come from the Secret by reference, never rendered as values.
    secret_refs = [e for e in c["env"] if "valueFrom" in e]
    assert secret_refs and all("secretKeyRef" in e["valueFrom"] for e in secret_refs)
    svc = r.one("Service", "live-dashboard")
    assert svc["spec"]["type"] == "LoadBalancer" and svc["spec"]["ports"][0]["port"] == 8443


def test_schema_rejects_unknown_keys():
    import pytest
    with pytest.raises(Exception):
        render({"liveDashboard": {"enabled": True, "prot": 1}})
