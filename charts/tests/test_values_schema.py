"""values.yaml against values.schema.json (jsonschema), and bad values refused by Helm itself."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
import yaml

import helm_python
from conftest import CHART, EVERYTHING, render


@pytest.fixture(scope="module")
def schema():
    s = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(s)
    return s


@pytest.fixture(scope="module")
def defaults():
    return yaml.safe_load((CHART / "values.yaml").read_text())


def merged(base, override):
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merged(out[k], v)
        else:
            out[k] = v
    return out


def test_values_yaml_is_valid(schema, defaults):
    jsonschema.validate(defaults, schema, cls=jsonschema.Draft7Validator)


def test_everything_values_are_valid(schema, defaults):
    jsonschema.validate(merged(defaults, EVERYTHING), schema, cls=jsonschema.Draft7Validator)


BAD = {
    "unknown-mode": {"autoscaling": {"mode": "both"}},
    "typo-top-level-key": {"autoscalling": {"mode": "keda"}},
    "database-url-in-values": {"config": {"sink": {"database-url": "postgres://u:p@db/fleet"}}},
    "sasl-password-in-properties": {"config": {"kafka": {"properties": {"sasl.password": "hunter2"}}}},
    "root-certificate-in-values": {"config": {"worker": {"root-certificate": ["/tmp/x.cer"]}}},
    "no-input-topic": {"config": {"worker": {"input-topic": []}}},
    "bad-topic-name": {"config": {"worker": {"input-topic": ["has space"]}}},
    "unknown-environment": {"config": {"worker": {"environment": ["Staging"]}}},
    "port-out-of-range": {"config": {"worker": {"metrics-port": 70000}}},
    "port-as-string": {"config": {"worker": {"metrics-port": "9090"}}},
    "unknown-worker-flag": {"config": {"worker": {"input-topics": ["a"]}}},
    "bad-log-format": {"config": {"sink": {"log-format": "xml"}}},
    "zero-lag-threshold": {"autoscaling": {"keda": {"lagThreshold": 0}}},
    "idle-and-limit-to-lag": {"autoscaling": {"keda": {"allowIdleConsumers": True, "limitToPartitionsWithLag": True}}},
    "bad-offset-reset": {"autoscaling": {"keda": {"offsetResetPolicy": "smallest"}}},
    "writable-root-fs": {"containerSecurityContext": {"readOnlyRootFilesystem": False}},
    "privilege-escalation": {"containerSecurityContext": {"allowPrivilegeEscalation": True}},
    "root-user-allowed": {"podSecurityContext": {"runAsNonRoot": False}},
    "capabilities-not-dropped": {"containerSecurityContext": {"capabilities": {"drop": ["NET_RAW"]}}},
    "added-capability": {"containerSecurityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}}},
    "sasl-without-secret": {"kafkaAuth": {"sasl": {"enabled": True}}},
    "tls-ca-without-secret": {"kafkaAuth": {"tls": {"enabled": True}}},
    "tls-cert-without-key": {"kafkaAuth": {"tls": {"enabled": True, "existingSecret": "t", "certKey": "tls.crt"}}},
    "bad-sasl-mechanism": {"kafkaAuth": {"sasl": {"mechanism": "GSSAPI"}}},
    "roots-of-unknown-kind": {"rootCertificates": {"kind": "PersistentVolume"}},
    "no-root-files": {"rootCertificates": {"files": []}},
    "consumable-without-units": {"products": {"catalogue": {"com.example.t": {"type": "consumable", "entitlement": "t"}}}},
    "pass-without-duration": {"products": {"catalogue": {"com.example.p": {"type": "non-renewing", "entitlement": "p"}}}},
    "bad-duration": {"products": {"catalogue": {"com.example.p": {"type": "non-renewing", "entitlement": "p", "duration": "30 days"}}}},
    "hpa-min-zero": {"autoscaling": {"mode": "hpa", "minReplicas": 0}},
    "negative-grace": {"worker": {"terminationGracePeriodSeconds": -1}},
    "bad-image-digest": {"image": {"digest": "latest"}},
    "extra-env-overrides-group": {"worker": {"extraEnv": [{"name": "FLEET_GROUP", "value": "other"}]}},
    "extra-env-overrides-database-url": {"sink": {"extraEnv": [{"name": "FLEET_DATABASE_URL", "value": "postgres://x"}]}},
    "bad-unhealthy-eviction-policy": {"worker": {"podDisruptionBudget": {"unhealthyPodEvictionPolicy": "Never"}}},
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_values_rejected_by_the_schema(schema, defaults, name):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(merged(defaults, BAD[name]), schema, cls=jsonschema.Draft7Validator)


@pytest.mark.parametrize("name", ["unknown-mode", "database-url-in-values", "writable-root-fs", "idle-and-limit-to-lag",
                                  "sasl-without-secret", "tls-ca-without-secret", "port-as-string"])
def test_bad_values_rejected_by_helm(name):
    # Helm validates user values against values.schema.json before rendering anything.
    with pytest.raises(helm_python.HelmError, match="schema"):
        render(BAD[name])


@pytest.mark.parametrize("values,message", [
    ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}, "must not exceed"),
    ({"config": {"worker": {"require-known-products": True}}}, "no product catalogue"),
], ids=["min-above-max", "require-products-without-catalogue"])
def test_inconsistent_values_fail_the_render_with_a_clear_message(values, message):
    with pytest.raises(helm_python.HelmRenderError, match=message):
        render(values)
