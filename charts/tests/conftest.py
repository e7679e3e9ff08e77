"""Shared helpers for the chart tests: render the chart with Helm's Go SDK (PyPI helm-python-sdk)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "entitlement-fleet"
KEDA_CRD = REPO.parent / "shared" / "fixtures" / "keda" / "keda.sh_scaledobjects.yaml"

# Kubernetes version the chart is rendered for and validated against (kubernetes-validate ships
# schemas 1.25 .. 1.37; pinned so a new kubernetes-validate release cannot change the outcome).
KUBE_VERSION = "1.30.0"
# The oldest version Chart.yaml's kubeVersion admits: manifests must validate there too.
KUBE_VERSION_OLDEST = "1.25.0"
KEDA_API = "keda.sh/v1alpha1"
RELEASE = "demo"
NAMESPACE = "fleet"

import helm_python  # noqa: E402  (after constants so an import error names the missing package clearly)
from helm_python import _native  # noqa: E402
import kubernetes_validate  # noqa: E402


class Rendered:
    """The manifests of one render, parsed."""

    def __init__(self, files: dict[str, str]):
        self.files = files
        self.docs: list[dict[str, Any]] = []
        for name, text in sorted(files.items()):
            if name.endswith("NOTES.txt"):
                continue
            for doc in yaml.safe_load_all(text):
                if doc:
                    doc.setdefault("_template", name)
                    self.docs.append(doc)

    def kinds(self) -> list[str]:
        return sorted(d["kind"] for d in self.docs)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, component: str | None = None) -> dict[str, Any]:
        found = [
            d for d in self.of_kind(kind)
            if component is None or d["metadata"]["labels"].get("app.kubernetes.io/component") == component
        ]
        assert len(found) == 1, f"expected one {kind} {component or ''}, found {len(found)}"
        return found[0]

    def deployment(self, component: str) -> dict[str, Any]:
        return self.one("Deployment", component)

    def container(self, component: str) -> dict[str, Any]:
        containers = self.deployment(component)["spec"]["template"]["spec"]["containers"]
        assert len(containers) == 1
        return containers[0]

    def fleet_config(self) -> dict[str, Any]:
        cm = self.one("ConfigMap", "config")
        return yaml.safe_load(cm["data"]["fleet.yaml"])


def clean(doc: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of a manifest without the test's bookkeeping key (renders are cached: never mutate them)."""
    return copy.deepcopy({k: v for k, v in doc.items() if k != "_template"})


_chart: helm_python.Chart | None = None
_cache: dict[str, Rendered] = {}


def chart() -> helm_python.Chart:
    global _chart
    if _chart is None:
        _chart = helm_python.Chart.load(CHART)
    return _chart


def render(values: dict[str, Any] | None = None, *, keda_api: bool = True, kube_version: str = KUBE_VERSION) -> Rendered:
    """Render like `helm template demo charts/entitlement-fleet -n fleet --kube-version 1.30.0
    [--api-versions keda.sh/v1alpha1] -f values`. Helm validates the values against values.schema.json
    first. `kube_version` is what `.Capabilities.KubeVersion` reports. `Chart.render` of helm-python-sdk does not expose kube/api versions, so the same C call is made
    with the two documented render options it lacks (`kube_version`, `api_versions`)."""
    values = copy.deepcopy(values or {})
    key = json.dumps([values, keda_api, kube_version], sort_keys=True)
    if key not in _cache:
        opts = {
            "name": RELEASE,
            "namespace": NAMESPACE,
            "kube_version": "v" + kube_version,
            "api_versions": [KEDA_API] if keda_api else [],
        }
        out = _native.call_string("helm_render", chart()._raw(), json.dumps(values), json.dumps(opts))
        _cache[key] = Rendered(json.loads(out))
    return _cache[key]


MODES = ["keda", "hpa", "none"]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


def with_mode(mode: str, values: dict[str, Any] | None = None) -> dict[str, Any]:
    v = copy.deepcopy(values or {})
    v.setdefault("autoscaling", {})["mode"] = mode
    return v


# Values that switch on every optional object, so validation covers all templates.
EVERYTHING: dict[str, Any] = {
    "kafkaAuth": {
        "sasl": {"enabled": True, "existingSecret": "kafka-credentials"},
        "tls": {"enabled": True, "existingSecret": "kafka-tls", "certKey": "tls.crt", "keyKey": "tls.key"},
    },
    "rootCertificates": {"kind": "Secret", "name": "apple-roots", "files": ["AppleRootCA-G3.cer", "AppleRootCA-G2.cer"]},
    "products": {"catalogue": {
        "com.example.pro.monthly": {"type": "auto-renewable", "entitlement": "pro"},
        "com.example.tickets.10": {"type": "consumable", "entitlement": "tickets", "units": 10},
    }},
    "config": {"worker": {"require-known-products": True, "app-apple-id": 1234567890}},
    "worker": {"preStopSleepSeconds": 5, "nodeSelector": {"kubernetes.io/os": "linux"},
               "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "fleet", "effect": "NoSchedule"}],
               "priorityClassName": "fleet",
               "extraEnv": [{"name": "FLEET_LOG_LEVEL", "value": "debug"}]},
    "sink": {"autoscaling": {"enabled": True}},
    "migrate": {"enabled": True},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
    "dashboard": {"enabled": True},
    "liveDashboard": {"enabled": True},
    "imagePullSecrets": [{"name": "registry"}],
}


# The App Store Server API values of `reconcile` and `responder` in the tests: ids, the key's Secret, the environment.
APP_STORE_API = {"keyId": "2X9R4HXF34", "issuerId": "57246542-96fe-1a63-e053-0824d011072a",
                 "existingSecret": "appstore-api-key", "environment": "Sandbox"}


def validates(values: dict[str, Any], kind: str, component: str, kube_version: str) -> None:
    """The rendered `kind` of `component` is valid for `kube_version` (strict)."""
    doc = render(values, kube_version=kube_version).one(kind, component)
    kubernetes_validate.validate(clean(doc), kube_version, strict=True)


def assert_app_store_key_from_secret(rendered: Rendered, pod: dict[str, Any], container: dict[str, Any], secret: str) -> None:
    """The App Store Server API key (.p8) of `fleet reconcile` / `fleet responder`: the Secret's one item mounted
    read-only as a file, the sink's database URL from its Secret, the fleet's config file, and no key in the render."""
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    secret_volume = next(v for v in pod["volumes"] if v["name"] == "appstore-api-key")
    assert secret_volume["secret"]["secretName"] == secret
    assert secret_volume["secret"]["items"] == [{"key": "key.p8", "path": "key.p8"}]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["appstore-api-key"]["mountPath"] == "/etc/fleet/appstore-api"
    assert mounts["appstore-api-key"]["readOnly"] is True
    env = {e["name"]: e for e in container["env"]}
    assert env["FLEET_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "url"
    assert env["FLEET_CONFIG"]["value"] == "/etc/fleet/fleet.yaml"
    assert "PRIVATE KEY" not in "\n".join(rendered.files.values())


def assert_refused_without_api_ids(component: str, values: dict[str, Any]) -> None:
    """A component that talks to the App Store Server API is refused without its Secret, key id or issuer id, and
    the error names the missing value."""
    for missing in ["existingSecret", "keyId", "issuerId"]:
        spec = values[component]
        with pytest.raises(Exception) as e:
            render({component: {**spec, "api": {**spec["api"], missing: ""}}})
        assert f"{component}.api.{missing}" in str(e.value)
