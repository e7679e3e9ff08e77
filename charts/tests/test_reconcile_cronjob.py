"""The `fleet reconcile` CronJob: off by default; when on, it takes the App Store Server API key from a Secret
(mounted as a file, never rendered), runs under the fleet's security contexts and validates against Kubernetes."""

from __future__ import annotations

import pytest

from conftest import (APP_STORE_API, KUBE_VERSION, KUBE_VERSION_OLDEST, assert_app_store_key_from_secret,
                      assert_refused_without_api_ids, render, validates)

RECONCILE = {
    "reconcile": {
        "enabled": True,
        "window": "6h",
        "skipStored": True,
        "api": APP_STORE_API,
    },
}


def test_reconcile_is_off_by_default():
    assert render().of_kind("CronJob") == []


@pytest.mark.parametrize("kube_version", [KUBE_VERSION, KUBE_VERSION_OLDEST])
def test_reconcile_cronjob_validates(kube_version):
    validates(RECONCILE, "CronJob", "reconcile", kube_version)


def test_reconcile_cronjob_takes_the_key_from_the_secret_and_passes_the_flags():
    r = render(RECONCILE)
    job = r.one("CronJob", "reconcile")
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    args = container["args"]
    assert args[0] == "reconcile"
    assert "--since=6h" in args
    assert "--api-key-id=2X9R4HXF34" in args
    assert "--api-issuer-id=57246542-96fe-1a63-e053-0824d011072a" in args
    assert "--api-private-key=/etc/fleet/appstore-api/key.p8" in args
    assert "--bundle-id=com.example.app" in args
    assert "--environment=Sandbox" in args
    assert "--topic=appstore.raw" in args
    assert_app_store_key_from_secret(r, pod, container, "appstore-api-key")


def test_reconcile_without_the_secret_or_ids_is_refused():
    assert_refused_without_api_ids("reconcile", RECONCILE)


def test_reconcile_values_are_schema_checked():
    with pytest.raises(Exception):
        render({"reconcile": {**RECONCILE["reconcile"], "window": "yesterday"}})
    with pytest.raises(Exception):
        render({"reconcile": {**RECONCILE["reconcile"], "api": {**RECONCILE["reconcile"]["api"], "privateKey": "inline"}}})
