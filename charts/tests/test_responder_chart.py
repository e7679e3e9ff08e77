"""The `fleet responder` Deployment: off by default; when on, it takes the App Store Server API key from a Secret
(mounted as a file, never rendered), reads the sink's database URL from its Secret, exposes its operations port to the
kubelet's probes, runs under the fleet's security contexts and validates against Kubernetes."""

from __future__ import annotations

import pytest

from conftest import (APP_STORE_API, KUBE_VERSION, KUBE_VERSION_OLDEST, assert_app_store_key_from_secret,
                      assert_refused_without_api_ids, render, validates)

RESPONDER = {
    "responder": {
        "enabled": True,
        "refundPreference": "decline",
        "sampleContentProvided": True,
        "api": APP_STORE_API,
    },
}


def test_responder_is_off_by_default():
    assert [d for d in render().of_kind("Deployment") if d["metadata"]["name"].endswith("responder")] == []


@pytest.mark.parametrize("kube_version", [KUBE_VERSION, KUBE_VERSION_OLDEST])
def test_responder_deployment_validates(kube_version):
    validates(RESPONDER, "Deployment", "responder", kube_version)


def test_responder_takes_the_key_and_database_from_secrets_and_passes_the_flags():
    r = render(RESPONDER)
    deployment = r.one("Deployment", "responder")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    args = container["args"]
    assert args[0] == "responder"
    for flag in ["--api-key-id=2X9R4HXF34", "--api-issuer-id=57246542-96fe-1a63-e053-0824d011072a",
                 "--api-private-key=/etc/fleet/appstore-api/key.p8", "--bundle-id=com.example.app",
                 "--environment=Sandbox", "--group=fleet-responder", "--result-topic=entitlements.verified",
                 "--refund-preference=decline", "--sample-content-provided", "--retry-interval-seconds=60",
                 "--metrics-host=0.0.0.0", "--metrics-port=9093"]:
        assert flag in args, flag
    assert_app_store_key_from_secret(r, pod, container, "appstore-api-key")
    # The probes reach the operations port the process binds on every interface.
    assert container["ports"] == [{"name": "metrics", "containerPort": 9093, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}


def test_responder_without_the_secret_or_ids_is_refused():
    assert_refused_without_api_ids("responder", RESPONDER)


def test_responder_values_are_schema_checked():
    with pytest.raises(Exception):
        render({"responder": {**RESPONDER["responder"], "refundPreference": "always"}})
    with pytest.raises(Exception):
        render({"responder": {**RESPONDER["responder"], "api": {**RESPONDER["responder"]["api"], "privateKey": "inline"}}})
    with pytest.raises(Exception):
        render({"responder": {**RESPONDER["responder"], "metricsPort": 0}})
