"""The values example of docs/kubernetes.md (the README's `helm install ... -f my-values.yaml`) renders and
validates: the documented install works as written."""

from __future__ import annotations

import re

import kubernetes_validate
import yaml

from conftest import KUBE_VERSION, REPO, clean, render

DOC = REPO / "docs" / "kubernetes.md"
CUSTOM_KINDS = {"ScaledObject", "TriggerAuthentication", "ServiceMonitor"}


def documented_values() -> dict:
    text = DOC.read_text()
    blocks = re.findall(r"```yaml\n(# my-values\.yaml\n.*?)```", text, flags=re.S)
    assert len(blocks) == 1, "docs/kubernetes.md has exactly one `# my-values.yaml` block"
    return yaml.safe_load(blocks[0])


def test_documented_values_render_and_validate():
    values = documented_values()
    r = render(values)
    for doc in r.docs:
        if doc["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(clean(doc), KUBE_VERSION, strict=True)
    worker = r.deployment("worker")
    container = worker["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].startswith(values["image"]["repository"] + ":" + values["image"]["tag"])
    env = {e["name"]: e for e in container.get("env", [])}
    # SASL credentials come from the named Secret, never from the values.
    assert env["FLEET_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "kafka-credentials"
    scaled = [d for d in r.docs if d["kind"] == "ScaledObject"]
    assert len(scaled) == 1
    assert scaled[0]["spec"]["triggers"][0]["metadata"]["topic"] == "appstore.raw"


def test_readme_helm_commands_name_the_chart_path():
    readme = (REPO / "README.md").read_text()
    for line in re.findall(r"^helm .*$", readme, flags=re.M):
        assert "charts/entitlement-fleet" in line
    assert (REPO / "charts" / "entitlement-fleet" / "Chart.yaml").exists()
