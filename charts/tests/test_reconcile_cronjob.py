"""The `fleet reconcile` CronJob: off by default; when on, it takes the App Store Server API key from a Secret
(mounted as a file, never rendered), runs under the fleet's security contexts and validates against Kubernetes."""

from __future__ import annotations

import kubernetes_validate
import pytest

from conftest import KUBE_VERSION, KUBE_VERSION_OLDEST, clean, render

RECONCILE = {
    "reconcile": {
        "enabled": True,
        "window": "6h",
        "skipStored": True,
        "api": {"keyId": "2X9R4HXF34", "issuerId": "57246542-96fe-1a63-e053-0824d011072a",
                "existingSecret": "appstore-api-key", "environment": "Sandbox"},
    },
}


def test_reconcile_is_off_by_default():
    assert render().of_kind("CronJob") == []


@pytest.mark.parametrize("kube_version", [KUBE_VERSION, KUBE_VERSION_OLDEST])
def test_reconcile_cronjob_validates(kube_version):
    doc = render(RECONCILE, kube_version=kube_version).one("CronJob", "reconcile")
    kubernetes_validate.validate(clean(doc), kube_version, strict=True)


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
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    secret_volume = next(v for v in pod["volumes"] if v["name"] == "appstore-api-key")
    assert secret_volume["secret"]["secretName"] == "appstore-api-key"
    assert secret_volume["secret"]["items"] == [{"key": "key.p8", "path": "key.p8"}]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["appstore-api-key"]["mountPath"] == "/etc/fleet/appstore-api"
    assert mounts["appstore-api-key"]["readOnly"] is True
    env = {e["name"]: e for e in container["env"]}
    assert env["FLEET_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "url", "skipStored passes the sink database"
    assert env["FLEET_CONFIG"]["value"] == "/etc/fleet/fleet.yaml"
    # No key material or secret value anywhere in the render.
    text = "\n".join(r.files.values())
    assert "PRIVATE KEY" not in text


def test_reconcile_without_the_secret_or_ids_is_refused():
    for missing in ["existingSecret", "keyId", "issuerId"]:
        values = {"reconcile": {**RECONCILE["reconcile"], "api": {**RECONCILE["reconcile"]["api"], missing: ""}}}
        with pytest.raises(Exception) as e:
            render(values)
        assert f"reconcile.api.{missing}" in str(e.value)


def test_reconcile_values_are_schema_checked():
    with pytest.raises(Exception):
        render({"reconcile": {**RECONCILE["reconcile"], "window": "yesterday"}})
    with pytest.raises(Exception):
        render({"reconcile": {**RECONCILE["reconcile"], "api": {**RECONCILE["reconcile"]["api"], "privateKey": "inline"}}})
