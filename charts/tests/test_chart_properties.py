"""Properties of the rendered chart: autoscaling exclusivity, probes, security, wiring, graceful shutdown,
the ConfigMap's layout, secrets, and the dashboard."""

from __future__ import annotations

import json
import re

import pytest
import yaml

import helm_python
from conftest import CHART, EVERYTHING, REPO, render, with_mode

# The keys of config/fleet.yaml (flag names without `--`).
CONTRACT_KAFKA_KEYS = {"bootstrap-servers", "properties"}
CONTRACT_WORKER_KEYS = {
    "group", "input-topic", "result-topic", "rejected-topic", "root-certificate", "bundle-id", "environment",
    "app-apple-id", "products", "require-known-products", "metrics-port", "shutdown-deadline-seconds",
    "log-level", "log-format", "validation-time", "allow-unsigned-environments", "metrics-host", "offset-reset-policy",
    "max-receipt-bytes", "trusted-intermediate", "stall-timeout-seconds",
    "revocation-check", "ocsp-timeout-ms", "ocsp-max-age-seconds",
}
CONTRACT_SINK_KEYS = {
    "group", "result-topic", "database-url", "rejected-topic", "metrics-port", "shutdown-deadline-seconds",
    "log-level", "log-format", "max-batch-size", "batch-target-ms", "writers", "metrics-host", "offset-reset-policy",
    "stall-timeout-seconds",
}
CONTRACT_METRICS = [
    "fleet_worker_inputs_total", "fleet_worker_verdicts_total", "fleet_consumer_lag",
    "fleet_worker_verify_seconds", "fleet_verifier_chain_cache_hits_total",
    "fleet_verifier_chain_cache_misses_total", "fleet_sink_batch_seconds",
]


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


# ---- autoscaling ----------------------------------------------------------------------------------

def test_keda_mode_renders_scaledobject_and_no_hpa_and_no_replicas():
    r = render(with_mode("keda"))
    assert len(r.of_kind("ScaledObject")) == 1
    assert [h for h in r.of_kind("HorizontalPodAutoscaler")
            if h["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"] == []
    assert "replicas" not in r.deployment("worker")["spec"]


def test_hpa_mode_renders_cpu_hpa_and_no_scaledobject_and_no_replicas():
    r = render(with_mode("hpa"))
    assert r.of_kind("ScaledObject") == [] and r.of_kind("TriggerAuthentication") == []
    hpa = r.one("HorizontalPodAutoscaler", "worker")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": r.deployment("worker")["metadata"]["name"]}
    assert hpa["spec"]["metrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}]
    assert "replicas" not in r.deployment("worker")["spec"]


def test_none_mode_renders_fixed_replicas_and_no_autoscaler():
    r = render(with_mode("none", {"worker": {"replicas": 3}}))
    assert r.of_kind("ScaledObject") == []
    assert [h for h in r.of_kind("HorizontalPodAutoscaler")
            if h["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"] == []
    assert r.deployment("worker")["spec"]["replicas"] == 3


@pytest.mark.parametrize("extra", [{}, EVERYTHING], ids=["defaults", "everything"])
def test_never_keda_and_hpa_for_the_same_workload(mode, extra):
    r = render(with_mode(mode, extra))
    targets = [o["spec"]["scaleTargetRef"]["name"] for o in r.of_kind("ScaledObject") + r.of_kind("HorizontalPodAutoscaler")]
    assert len(targets) == len(set(targets)), f"two autoscalers on one Deployment: {targets}"
    for name in targets:  # an autoscaled Deployment never pins replicas
        dep = [d for d in r.of_kind("Deployment") if d["metadata"]["name"] == name][0]
        assert "replicas" not in dep["spec"]


def test_scaledobject_settings_come_from_values():
    values = with_mode("keda", {
        "autoscaling": {"minReplicas": 2, "maxReplicas": 24,
                        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}},
                        "keda": {"lagThreshold": 250, "activationLagThreshold": 7, "limitToPartitionsWithLag": True,
                                 "pollingInterval": 10, "cooldownPeriod": 120,
                                 "fallback": {"enabled": True, "failureThreshold": 5, "replicas": 6}}},
    })
    so = render(values).one("ScaledObject")["spec"]
    assert so["scaleTargetRef"]["name"] == render(values).deployment("worker")["metadata"]["name"]
    assert (so["minReplicaCount"], so["maxReplicaCount"]) == (2, 24)
    assert (so["pollingInterval"], so["cooldownPeriod"]) == (10, 120)
    assert so["fallback"] == {"failureThreshold": 5, "replicas": 6}
    behavior = so["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 600
    assert behavior["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 60}]
    for trigger in so["triggers"]:
        assert trigger["type"] == "kafka"
        md = trigger["metadata"]
        assert md["lagThreshold"] == "250" and md["activationLagThreshold"] == "7"
        assert md["limitToPartitionsWithLag"] == "true" and md["allowIdleConsumers"] == "false"


def test_keda_fallback_and_idle_replicas_are_optional():
    so = render(with_mode("keda", {"autoscaling": {"minReplicas": 0, "keda": {
        "idleReplicaCount": 0, "fallback": {"enabled": False}}}})).one("ScaledObject")["spec"]
    assert "fallback" not in so and so["idleReplicaCount"] == 0 and so["minReplicaCount"] == 0
    assert "idleReplicaCount" not in render(with_mode("keda")).one("ScaledObject")["spec"]


def test_hpa_uses_the_same_scale_down_stabilisation():
    values = with_mode("hpa", {"autoscaling": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 450}}}})
    assert render(values).one("HorizontalPodAutoscaler", "worker")["spec"]["behavior"]["scaleDown"][
        "stabilizationWindowSeconds"] == 450


def test_sink_has_its_own_simple_scaling():
    r = render(with_mode("keda"))
    assert r.deployment("sink")["spec"]["replicas"] == 1
    r = render(with_mode("keda", {"sink": {"autoscaling": {"enabled": True, "maxReplicas": 3}}}))
    hpa = r.one("HorizontalPodAutoscaler", "sink")
    assert hpa["spec"]["maxReplicas"] == 3
    assert hpa["spec"]["scaleTargetRef"]["name"] == r.deployment("sink")["metadata"]["name"]
    assert "replicas" not in r.deployment("sink")["spec"]
    assert len(r.of_kind("ScaledObject")) == 1  # the worker's, untouched


def test_sink_writers_reach_the_config_and_are_validated():
    r = render(with_mode("keda", {"config": {"sink": {"writers": 3}}}))
    assert r.fleet_config()["sink"]["writers"] == 3
    with pytest.raises(Exception, match="writers"):
        render(with_mode("keda", {"config": {"sink": {"writers": 0}}}))


# ---- topics and group wiring ------------------------------------------------------------------------

def test_topics_and_group_are_wired_into_scaledobject_and_worker_config():
    values = with_mode("keda", {"config": {
        "kafka": {"bootstrap-servers": "b1.kafka:9093,b2.kafka:9093"},
        "worker": {"group": "verifiers-eu", "input-topic": ["apple.notifications", "storekit.transactions"],
                   "result-topic": "ent.v1", "rejected-topic": "apple.rejected"},
        "sink": {"group": "sink-eu", "result-topic": "ent.v1"},
    }})
    r = render(values)
    triggers = r.one("ScaledObject")["spec"]["triggers"]
    assert [t["metadata"]["topic"] for t in triggers] == ["apple.notifications", "storekit.transactions"]
    assert {t["metadata"]["consumerGroup"] for t in triggers} == {"verifiers-eu"}
    assert {t["metadata"]["bootstrapServers"] for t in triggers} == {"b1.kafka:9093,b2.kafka:9093"}

    cfg = r.fleet_config()
    assert cfg["kafka"]["bootstrap-servers"] == "b1.kafka:9093,b2.kafka:9093"
    assert cfg["worker"]["group"] == "verifiers-eu"
    assert cfg["worker"]["input-topic"] == ["apple.notifications", "storekit.transactions"]
    assert cfg["worker"]["result-topic"] == "ent.v1" and cfg["worker"]["rejected-topic"] == "apple.rejected"
    assert cfg["sink"]["group"] == "sink-eu" and cfg["sink"]["result-topic"] == "ent.v1"

    # The worker reads that ConfigMap: FLEET_CONFIG points at the mounted file.
    worker = r.container("worker")
    assert worker["args"] == ["worker"]
    assert env_of(worker)["FLEET_CONFIG"]["value"] == "/etc/fleet/fleet.yaml"
    mount = [m for m in worker["volumeMounts"] if m["name"] == "config"][0]
    assert (mount["mountPath"], mount["subPath"]) == ("/etc/fleet/fleet.yaml", "fleet.yaml")
    volume = [v for v in r.deployment("worker")["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"][0]
    assert volume["configMap"]["name"] == r.one("ConfigMap", "config")["metadata"]["name"]


def test_config_change_rolls_the_pods():
    a = render().deployment("worker")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    b = render({"config": {"worker": {"group": "other"}}}).deployment("worker")["spec"]["template"]["metadata"][
        "annotations"]["checksum/config"]
    assert a != b


# ---- probes, ports, metrics -------------------------------------------------------------------------

@pytest.mark.parametrize("component,port", [("worker", 9090), ("sink", 9091)])
def test_probes_hit_healthz_and_readyz_on_the_metrics_port(component, port):
    r = render()
    c = r.container(component)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": port}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    ann = r.deployment(component)["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert ann["prometheus.io/port"] == str(port)
    assert ann["prometheus.io/path"] == "/metrics"


def test_metrics_port_follows_config():
    r = render({"config": {"worker": {"metrics-port": 9300}, "sink": {"metrics-port": 9301}}})
    assert r.container("worker")["ports"][0]["containerPort"] == 9300
    assert r.fleet_config()["worker"]["metrics-port"] == 9300
    assert r.container("sink")["ports"][0]["containerPort"] == 9301
    svc = {s["metadata"]["labels"]["app.kubernetes.io/component"]: s["spec"]["ports"][0] for s in r.of_kind("Service")}
    assert svc["worker"]["port"] == 9300 and svc["worker"]["targetPort"] == "metrics"
    assert svc["sink"]["port"] == 9301


def test_servicemonitor_selects_the_metrics_services():
    r = render({"metrics": {"serviceMonitor": {"enabled": True, "interval": "15s"}}})
    sm = r.one("ServiceMonitor")
    assert sm["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}]
    selector = sm["spec"]["selector"]["matchLabels"]
    services = r.of_kind("Service")
    assert len(services) == 2
    for s in services:
        assert selector.items() <= s["metadata"]["labels"].items()
    assert render().of_kind("ServiceMonitor") == []


# ---- security -------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra", [{}, EVERYTHING], ids=["defaults", "everything"])
def test_every_pod_is_non_root_read_only_without_privileges(extra):
    r = render(with_mode("keda", extra))
    pods = [d["spec"]["template"]["spec"] for d in r.of_kind("Deployment") + r.of_kind("Job")]
    assert len(pods) == (4 if extra else 2)  # everything: + migrate Job + live dashboard
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["automountServiceAccountToken"] is False
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["privileged"] is False
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
            # a read-only root needs a writable /tmp
            assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"])
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]


def test_pdb_and_topology_spread():
    r = render()
    for component in ("worker", "sink"):
        pdb = r.one("PodDisruptionBudget", component)
        dep = r.deployment(component)
        assert pdb["spec"]["maxUnavailable"] == 1
        assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
        spread = dep["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert [s["topologyKey"] for s in spread] == ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
        for s in spread:
            assert s["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert r.one("PodDisruptionBudget", "worker")["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # the field exists from Kubernetes 1.26: left out for older clusters
    assert "unhealthyPodEvictionPolicy" not in render(kube_version="1.25.0").one("PodDisruptionBudget", "worker")["spec"]
    off = render({"worker": {"podDisruptionBudget": {"enabled": False}, "topologySpread": {"enabled": False}}})
    assert [p["metadata"]["labels"]["app.kubernetes.io/component"] for p in off.of_kind("PodDisruptionBudget")] == ["sink"]
    assert "topologySpreadConstraints" not in off.deployment("worker")["spec"]["template"]["spec"]


# ---- secrets ----------------------------------------------------------------------------------------

def test_secrets_are_referenced_never_rendered():
    r = render(with_mode("keda", EVERYTHING))
    assert r.of_kind("Secret") == []
    sink_env = env_of(r.container("sink"))
    assert sink_env["FLEET_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "demo-entitlement-fleet-database", "key": "url"}
    for component in ("worker", "sink"):
        env = env_of(r.container(component))
        assert env["FLEET_KAFKA_SASL_USERNAME"]["valueFrom"]["secretKeyRef"] == {"name": "kafka-credentials", "key": "username"}
        assert env["FLEET_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "kafka-credentials", "key": "password"}
        assert not any("value" in e and "postgres" in str(e["value"]) for e in env.values())
    assert "FLEET_DATABASE_URL" not in env_of(r.container("worker"))
    migrate = r.one("Job", "migrate")["spec"]["template"]["spec"]["containers"][0]
    assert migrate["args"] == ["migrate"]
    assert env_of(migrate)["FLEET_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "demo-entitlement-fleet-database"
    props = r.fleet_config()["kafka"]["properties"]
    assert props["security.protocol"] == "SASL_SSL"
    assert props["sasl.mechanisms"] == "SCRAM-SHA-512"
    assert props["ssl.ca.location"] == "/etc/fleet/kafka-tls/ca.crt"
    assert props["ssl.certificate.location"] == "/etc/fleet/kafka-tls/tls.crt"
    assert "sasl.password" not in props and "database-url" not in r.fleet_config()["sink"]
    # KEDA reads the lag with the same credentials
    auth = r.one("TriggerAuthentication")
    params = {p["parameter"]: (p["name"], p["key"]) for p in auth["spec"]["secretTargetRef"]}
    assert params == {"username": ("kafka-credentials", "username"), "password": ("kafka-credentials", "password"),
                      "ca": ("kafka-tls", "ca.crt"), "cert": ("kafka-tls", "tls.crt"), "key": ("kafka-tls", "tls.key")}
    for t in r.one("ScaledObject")["spec"]["triggers"]:
        assert t["authenticationRef"]["name"] == auth["metadata"]["name"]
        assert t["metadata"]["sasl"] == "scram_sha512" and t["metadata"]["tls"] == "enable"


def test_root_certificates_from_a_named_configmap_or_secret():
    r = render({"rootCertificates": {"kind": "ConfigMap", "name": "my-roots", "files": ["AppleRootCA-G3.cer"]}})
    vols = {v["name"]: v for v in r.deployment("worker")["spec"]["template"]["spec"]["volumes"]}
    assert vols["roots"]["configMap"] == {"name": "my-roots", "items": [{"key": "AppleRootCA-G3.cer", "path": "AppleRootCA-G3.cer"}]}
    assert r.fleet_config()["worker"]["root-certificate"] == ["/etc/fleet/roots/AppleRootCA-G3.cer"]
    mounts = {m["name"]: m for m in r.container("worker")["volumeMounts"]}
    assert mounts["roots"]["mountPath"] == "/etc/fleet/roots" and mounts["roots"]["readOnly"] is True

    r = render(EVERYTHING)
    vols = {v["name"]: v for v in r.deployment("worker")["spec"]["template"]["spec"]["volumes"]}
    assert vols["roots"]["secret"]["secretName"] == "apple-roots"
    assert r.fleet_config()["worker"]["root-certificate"] == [
        "/etc/fleet/roots/AppleRootCA-G3.cer", "/etc/fleet/roots/AppleRootCA-G2.cer"]


def test_trusted_intermediates_mounted_beside_the_roots():
    r = render({"rootCertificates": {"kind": "Secret", "name": "apple-roots", "files": ["AppleRootCA-G3.cer"],
                                     "intermediateFiles": ["AppleITunesStoreCertificationAuthority.cer"]},
                "config": {"worker": {"max-receipt-bytes": 2097152}}})
    vols = {v["name"]: v for v in r.deployment("worker")["spec"]["template"]["spec"]["volumes"]}
    assert [i["key"] for i in vols["roots"]["secret"]["items"]] == [
        "AppleRootCA-G3.cer", "AppleITunesStoreCertificationAuthority.cer"]
    worker = r.fleet_config()["worker"]
    assert worker["trusted-intermediate"] == ["/etc/fleet/roots/AppleITunesStoreCertificationAuthority.cer"]
    assert worker["root-certificate"] == ["/etc/fleet/roots/AppleRootCA-G3.cer"]
    assert worker["max-receipt-bytes"] == 2097152
    # none by default: no key rendered
    assert "trusted-intermediate" not in render().fleet_config()["worker"]


def test_product_catalogue_mounted_at_the_contract_path():
    r = render(EVERYTHING)
    assert r.fleet_config()["worker"]["products"] == "/etc/fleet/products/products.yaml"
    cm = r.one("ConfigMap", "products")
    catalogue = yaml.safe_load(cm["data"]["products.yaml"])
    assert catalogue["products"]["com.example.tickets.10"]["units"] == 10
    vols = {v["name"]: v for v in r.deployment("worker")["spec"]["template"]["spec"]["volumes"]}
    assert vols["products"]["configMap"]["items"] == [{"key": "products.yaml", "path": "products.yaml"}]
    mounts = {m["name"]: m["mountPath"] for m in r.container("worker")["volumeMounts"]}
    assert mounts["products"] == "/etc/fleet/products"
    assert "products" not in render().fleet_config()["worker"]


# ---- graceful shutdown -------------------------------------------------------------------------------

@pytest.mark.parametrize("component", ["worker", "sink"])
def test_grace_period_exceeds_shutdown_deadline(component):
    r = render()
    pod = r.deployment(component)["spec"]["template"]["spec"]
    deadline = r.fleet_config()[component]["shutdown-deadline-seconds"]
    assert (pod["terminationGracePeriodSeconds"], deadline) == (40, 25)
    assert pod["terminationGracePeriodSeconds"] > deadline


def test_prestop_sleep_counts_against_the_grace_period():
    r = render({"worker": {"preStopSleepSeconds": 5}})
    assert r.container("worker")["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert "lifecycle" not in render().container("worker")
    with pytest.raises(helm_python.HelmRenderError, match="terminationGracePeriodSeconds"):
        render({"worker": {"preStopSleepSeconds": 15}})  # 25 + 15 >= 40


@pytest.mark.parametrize("values", [
    {"worker": {"terminationGracePeriodSeconds": 25}},
    {"config": {"worker": {"shutdown-deadline-seconds": 60}}},
    {"sink": {"terminationGracePeriodSeconds": 10}},
], ids=["worker-grace-equal", "worker-deadline-longer", "sink-grace-short"])
def test_grace_period_not_longer_than_deadline_is_refused(values):
    with pytest.raises(helm_python.HelmRenderError, match="must be greater than"):
        render(values)


def test_rollout_never_surges_beyond_the_partitions():
    strategy = render().deployment("worker")["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


# ---- ConfigMap layout (config/fleet.yaml) ----------------------------------------------------------------

@pytest.mark.parametrize("extra", [{}, EVERYTHING], ids=["defaults", "everything"])
def test_configmap_has_the_contract_layout(extra):
    cfg = render(extra).fleet_config()
    assert set(cfg) == {"kafka", "worker", "sink"}
    assert set(cfg["kafka"]) <= CONTRACT_KAFKA_KEYS and "bootstrap-servers" in cfg["kafka"]
    assert set(cfg["worker"]) <= CONTRACT_WORKER_KEYS
    assert set(cfg["sink"]) <= CONTRACT_SINK_KEYS - {"database-url"}
    for key in ("group", "input-topic", "result-topic", "rejected-topic", "root-certificate", "bundle-id",
                "environment", "metrics-port", "shutdown-deadline-seconds"):
        assert key in cfg["worker"], key
    assert isinstance(cfg["worker"]["input-topic"], list) and isinstance(cfg["worker"]["environment"], list)
    assert isinstance(cfg["kafka"]["properties"], dict)
    assert all(re.fullmatch(r"[a-z]+(-[a-z]+)*", k) for k in list(cfg["worker"]) + list(cfg["sink"]))


def test_example_config_file_has_every_contract_key_and_the_chart_uses_only_its_keys():
    example = yaml.safe_load((REPO / "config" / "fleet.yaml").read_text())
    # The chart renders the long-running consumers' sections; the file also documents the API commands' section.
    assert set(example) == {"kafka", "worker", "sink", "ingest", "appstore-api"}
    assert set(example["kafka"]) == CONTRACT_KAFKA_KEYS
    assert set(example["worker"]) == CONTRACT_WORKER_KEYS
    assert set(example["sink"]) == CONTRACT_SINK_KEYS
    cfg = render(EVERYTHING).fleet_config()
    for section in ("kafka", "worker", "sink"):
        assert set(cfg[section]) <= set(example[section])
    # The ingest section (rendered when ingest.enabled) uses only the file's keys, plus the token path it mounts.
    ingest = render({"ingest": {"enabled": True, "apiToken": {"existingSecret": "t"}}}).fleet_config()["ingest"]
    assert set(ingest) <= set(example["ingest"]) | {"api-token-file"}
    assert {k: v for k, v in ingest.items() if k not in ("host", "metrics-host", "log-format", "api-token-file")} == \
        {k: v for k, v in example["ingest"].items() if k not in ("host", "metrics-host", "log-format")}
    # the chart's defaults are the contract's defaults
    defaults = render().fleet_config()
    assert defaults["worker"]["group"] == example["worker"]["group"] == "fleet-verifiers"
    assert defaults["sink"]["group"] == example["sink"]["group"] == "fleet-sink"
    assert defaults["worker"]["input-topic"] == example["worker"]["input-topic"] == ["appstore.raw"]
    assert defaults["worker"]["result-topic"] == defaults["sink"]["result-topic"] == "entitlements.verified"
    assert defaults["worker"]["rejected-topic"] == "appstore.rejected"
    assert defaults["sink"]["rejected-topic"] == "entitlements.sink-rejected"
    assert (defaults["worker"]["metrics-port"], defaults["sink"]["metrics-port"]) == (9090, 9091)


def test_example_product_catalogue():
    cat = yaml.safe_load((REPO / "config" / "products.example.yaml").read_text())["products"]
    assert cat["com.example.tickets.10"] == {"type": "consumable", "entitlement": "tickets", "units": 10}
    assert cat["com.example.tickets.50"]["units"] == 50
    for pid in ("com.example.pro.monthly", "com.example.pro.yearly", "com.example.premium.monthly"):
        assert cat[pid]["type"] == "auto-renewable"
    assert any(p["type"] == "non-consumable" for p in cat.values())
    passes = [p for p in cat.values() if p["type"] == "non-renewing"]
    assert passes and passes[0]["duration"] == "P30D"
    # the same catalogue is accepted inline by the chart's schema and rendered
    r = render({"products": {"catalogue": cat}})
    assert yaml.safe_load(r.one("ConfigMap", "products")["data"]["products.yaml"])["products"] == cat


# ---- dashboard ------------------------------------------------------------------------------------

def test_dashboard_json_parses_and_covers_the_contract_metrics():
    dash = json.loads((CHART / "dashboards" / "entitlement-fleet.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    text = "\n".join(exprs)
    for metric in CONTRACT_METRICS:
        assert metric in text, metric
    assert "kube_deployment_status_replicas" in text or "kube_deployment_spec_replicas" in text
    assert re.search(r"by \(reason|by \(verdict, reason\)", text)
    assert re.search(r"by \([^)]*partition", text)
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for word in ("throughput", "reason", "lag", "replicas", "verify latency", "cache hit ratio", "sink batch latency"):
        assert word in titles, word
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_configmap_for_the_grafana_sidecar():
    r = render({"dashboard": {"enabled": True, "namespace": "monitoring"}})
    cm = r.one("ConfigMap", "dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert json.loads(cm["data"]["entitlement-fleet.json"]) == json.loads(
        (CHART / "dashboards" / "entitlement-fleet.json").read_text())
    assert [c for c in render().of_kind("ConfigMap") if c["metadata"]["labels"]["app.kubernetes.io/component"] == "dashboard"] == []


# ---- migrate job ----------------------------------------------------------------------------------

def test_migrate_job_is_an_optional_pre_install_hook():
    assert render().of_kind("Job") == []
    job = render({"migrate": {"enabled": True}}).one("Job", "migrate")
    ann = job["metadata"]["annotations"]
    assert ann["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert "before-hook-creation" in ann["helm.sh/hook-delete-policy"]
    assert "serviceAccountName" not in job["spec"]["template"]["spec"]  # the release's account does not exist yet
    plain = render({"migrate": {"enabled": True, "hook": False}}).one("Job", "migrate")
    assert "annotations" not in plain["metadata"]


def test_tls_with_the_system_trust_store_needs_no_trigger_authentication():
    r = render(with_mode("keda", {"kafkaAuth": {"tls": {"enabled": True, "caKey": ""}}}))
    assert r.of_kind("TriggerAuthentication") == []
    for t in r.one("ScaledObject")["spec"]["triggers"]:
        assert t["metadata"]["tls"] == "enable" and "authenticationRef" not in t
    props = r.fleet_config()["kafka"]["properties"]
    assert props["security.protocol"] == "SSL" and "ssl.ca.location" not in props
    assert all(v["name"] != "kafka-tls" for v in r.deployment("worker")["spec"]["template"]["spec"]["volumes"])
