"""Render the chart for the default values and each autoscaling mode; lint it; validate the manifests
against the Kubernetes schemas (kubernetes-validate) and the ScaledObject against KEDA's CRD schema."""

from __future__ import annotations

import json

import jsonschema
import kubernetes_validate
import pytest
import yaml

import helm_python
from conftest import (CHART, EVERYTHING, KEDA_CRD, KUBE_VERSION, KUBE_VERSION_OLDEST, MODES, clean, render,
                      with_mode)

# Kinds that are CRDs: kubernetes-validate has no schema for them; checked separately.
CUSTOM_KINDS = {"ScaledObject", "TriggerAuthentication", "ServiceMonitor"}


def test_default_values_render_the_expected_objects():
    r = render()
    assert r.kinds() == sorted([
        "ConfigMap", "Deployment", "Deployment", "PodDisruptionBudget", "PodDisruptionBudget",
        "ScaledObject", "Service", "Service", "ServiceAccount",
    ])


@pytest.mark.parametrize("extra", [{}, EVERYTHING], ids=["defaults", "everything"])
def test_lint_is_clean(mode, extra):
    report = helm_python.lint(CHART, with_mode(mode, extra), strict=True, kube_version="v" + KUBE_VERSION)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], json.dumps(report, indent=1)


@pytest.mark.parametrize("kube_version", [KUBE_VERSION, KUBE_VERSION_OLDEST])
@pytest.mark.parametrize("extra", [{}, EVERYTHING], ids=["defaults", "everything"])
def test_manifests_validate_against_kubernetes_schemas(mode, extra, kube_version):
    r = render(with_mode(mode, extra), kube_version=kube_version)
    checked = 0
    for doc in r.docs:
        if doc["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(clean(doc), kube_version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} ({doc['_template']}) invalid for "
                        f"Kubernetes {kube_version} at {path}: {e.message}")
        checked += 1
    assert checked >= 7


def test_strict_validation_catches_a_broken_manifest():
    # The validator really is strict: an unknown field in a rendered Deployment is reported.
    doc = clean(render().deployment("worker"))
    doc["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["paht"] = "/healthz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


@pytest.fixture(scope="module")
def scaledobject_schema():
    if not KEDA_CRD.exists():
        pytest.skip(f"KEDA CRD fixture absent: {KEDA_CRD}")
    crd = yaml.safe_load(KEDA_CRD.read_text())
    assert crd["spec"]["names"]["kind"] == "ScaledObject"
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1"
    return version["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("extra", [
    {},
    EVERYTHING,
    {"config": {"worker": {"input-topic": ["appstore.raw", "storekit.raw", "appstore.replay"]}}},
    {"autoscaling": {"minReplicas": 0, "keda": {"idleReplicaCount": 0, "activationLagThreshold": 5,
                                                "fallback": {"enabled": False}}}},
    {"autoscaling": {"keda": {"limitToPartitionsWithLag": False, "allowIdleConsumers": True}}},
], ids=["defaults", "everything", "three-topics", "scale-to-zero", "idle-consumers"])
def test_scaledobject_validates_against_keda_crd(scaledobject_schema, extra):
    so = clean(render(with_mode("keda", extra)).one("ScaledObject"))
    jsonschema.validate(so, scaledobject_schema, cls=jsonschema.Draft7Validator)


def test_keda_crd_schema_rejects_a_broken_scaledobject(scaledobject_schema):
    so = clean(render(with_mode("keda")).one("ScaledObject"))
    so["spec"]["triggers"][0]["metadata"]["lagThreshold"] = 100  # KEDA metadata values must be strings
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(so, scaledobject_schema, cls=jsonschema.Draft7Validator)


def test_every_mode_renders():
    for mode in MODES:
        assert render(with_mode(mode)).deployment("worker")


def test_keda_render_does_not_depend_on_announced_api_versions():
    # `helm template` without --api-versions keda.sh/v1alpha1 renders the same objects (no capability gate).
    with_api = render(with_mode("keda"), keda_api=True)
    without = render(with_mode("keda"), keda_api=False)
    assert [clean(d) for d in with_api.docs] == [clean(d) for d in without.docs]
    assert "WARNING" in without.files["entitlement-fleet/templates/NOTES.txt"]
    assert "WARNING" not in with_api.files["entitlement-fleet/templates/NOTES.txt"]
