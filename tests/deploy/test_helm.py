"""The Helm chart (deploy/helm/holdfast) is the kustomize manifests, with values.

`helm lint --strict` passes for every documented values file (the chart's ci/*-values.yaml), and
`helm template` of each renders exactly the objects its kustomize overlay renders: every kind, name
and field, Helm's own labels aside. Every test of tests/deploy/test_manifests.py on an overlay
(schemas, the agent's capabilities, the non-root coordinator, RBAC, mTLS wiring) therefore holds for
the chart too, and neither can change without the other. The values an operator sets (image,
resources, tolerations, node selectors, replicas, TLS mode, etcd endpoints) land where they should
and leave the security context and RBAC as they were; values.schema.json refuses what the servers
would refuse. The chart's real `helm` is the pinned one scripts/setup unzips into tools/helm/bin.
"""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.test_manifests import CRD_GROUPS, K8S_VERSION, OVERLAYS, Obj, one, pod_spec, render

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "holdfast"
HELM = ROOT / "tools" / "helm" / "bin" / "helm"
NAMESPACE = "holdfast"
# Labels Helm adds that kustomize does not: everything else must be equal.
HELM_LABELS = {"app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart"}
CUSTOM: dict[str, Any] = {
    "image": {"repository": "registry.example.internal/holdfast", "tag": "9.9.9", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "namespace": {"create": True},
    "etcd": {"endpoints": ["https://etcd.example.internal:2379"], "prefix": "/team/"},
    "tls": {"mode": "cert-manager"},
    "sessionNamespaces": "team-a,team-b=shared",
    "agent": {"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
              "nodeSelector": {"holdfast.io/agent": "yes"}, "priorityClassName": "",
              "resources": {"requests": {"cpu": "100m", "memory": "96Mi"},
                            "limits": {"cpu": "1", "memory": "300Mi"}}},
    "coordinator": {"replicas": 3, "nodeSelector": {"node-role": "infra"},
                    "tolerations": [{"key": "infra", "operator": "Equal", "value": "yes",
                                     "effect": "NoSchedule"}]},
    "purgeArchives": {"schedule": "5 1 * * *", "olderThanDays": 90},
}


def _helm() -> str:
    log = ROOT / "tools" / "helm" / "npm-ci.log"
    assert HELM.exists(), ("no helm: run ./scripts/setup --with-clis, as scripts/test does (it unzips "
                           "tools/helm's pinned layer); "
                           + (log.read_text()[-2000:] if log.exists() else ""))
    return str(HELM)


def values_file(overlay: str) -> Path:
    return CHART / "ci" / f"{overlay}-values.yaml"


def helm(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_helm(), *argv], capture_output=True, text=True, timeout=60)


@cache
def template(*values: str) -> tuple[Obj, ...]:
    """`helm template` of the chart into NAMESPACE with these values files."""
    done = helm("template", "holdfast", str(CHART), "--namespace", NAMESPACE,
                *[arg for v in values for arg in ("-f", v)])
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def custom(tmp_path: Path) -> tuple[Obj, ...]:
    path = tmp_path / "custom-values.yaml"
    path.write_text(yaml.safe_dump(CUSTOM))
    return template(str(path))


def without_helm_labels(obj: Obj) -> Obj:
    labels = {k: v for k, v in obj["metadata"].get("labels", {}).items() if k not in HELM_LABELS}
    return {**obj, "metadata": {**obj["metadata"], "labels": labels}}


def by_identity(objs: tuple[Obj, ...]) -> dict[tuple[str, str], Obj]:
    keyed = {(o["kind"], o["metadata"]["name"]): without_helm_labels(o) for o in objs}
    assert len(keyed) == len(objs), "two objects of one kind and name"
    return keyed


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_helm_lint_is_clean_for_every_documented_values_file(overlay: str) -> None:
    done = helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, "-f", str(values_file(overlay)))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_chart_renders_exactly_what_its_overlay_renders(overlay: str) -> None:
    # The namespace is the release's (`helm install -n holdfast --create-namespace`): no object of
    # the chart's unless namespace.create, whose object is compared below.
    ours = by_identity(template(str(values_file(overlay))))
    theirs = by_identity(tuple(o for o in render(overlay) if o["kind"] != "Namespace"))
    assert ours.keys() == theirs.keys(), (ours.keys() - theirs.keys(), theirs.keys() - ours.keys())
    for key, obj in theirs.items():
        assert ours[key] == obj, f"{overlay}: {key} differs between the chart and kustomize"


def test_the_namespace_the_chart_may_create_is_the_overlays(tmp_path: Path) -> None:
    (ours,) = [o for o in custom(tmp_path) if o["kind"] == "Namespace"]
    assert without_helm_labels(ours) == one(render("external-etcd"), "Namespace", NAMESPACE)


def test_a_customised_release_validates_and_keeps_the_security_context_and_rbac(tmp_path: Path) -> None:
    objs = custom(tmp_path)
    for obj in (o for o in objs if not o["apiVersion"].startswith(CRD_GROUPS)):
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}")
    reference = render("cert-manager")
    for kind, name in (("DaemonSet", "holdfast-agent"), ("Deployment", "holdfast-coordinator")):
        ours, theirs = pod_spec(objs, kind, name), pod_spec(reference, kind, name)
        assert ours["securityContext"] == theirs["securityContext"], name
        assert ours.get("hostPID") == theirs.get("hostPID") and ours["volumes"] == theirs["volumes"], name
        ((container,), (expected,)) = ours["containers"], theirs["containers"]
        assert container["securityContext"] == expected["securityContext"], name
        assert container["args"] == expected["args"] and container["volumeMounts"] == expected["volumeMounts"]
        assert container["image"] == "registry.example.internal/holdfast:9.9.9", name
        assert container["imagePullPolicy"] == "Always" and ours["imagePullSecrets"] == [{"name": "regcred"}]
    rbac = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
    assert {k: v for k, v in by_identity(objs).items() if k[0] in rbac} == \
        {k: v for k, v in by_identity(reference).items() if k[0] in rbac}


def test_values_land_where_an_operator_expects(tmp_path: Path) -> None:
    objs = custom(tmp_path)
    agent = pod_spec(objs, "DaemonSet", "holdfast-agent")
    assert agent["tolerations"] == CUSTOM["agent"]["tolerations"]
    assert agent["nodeSelector"] == {"holdfast.io/agent": "yes"} and "priorityClassName" not in agent
    assert agent["containers"][0]["resources"] == CUSTOM["agent"]["resources"]
    coordinator = one(objs, "Deployment", "holdfast-coordinator")
    assert coordinator["spec"]["replicas"] == 3
    assert coordinator["spec"]["template"]["spec"]["nodeSelector"] == {"node-role": "infra"}
    assert coordinator["spec"]["template"]["spec"]["tolerations"] == CUSTOM["coordinator"]["tolerations"]
    config = one(objs, "ConfigMap", "holdfast-config")["data"]
    assert config["HOLDFAST_ETCD"] == "https://etcd.example.internal:2379"
    assert config["HOLDFAST_ETCD_PREFIX"] == "/team/"
    assert config["HOLDFAST_SESSION_NAMESPACES"] == "team-a,team-b=shared"
    cronjob = one(objs, "CronJob", "holdfast-purge-archives")
    assert cronjob["spec"]["schedule"] == "5 1 * * *"
    (purge,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert "--older-than-days=90" in purge["args"]


@pytest.mark.parametrize("bad,says", [
    (["--set", "tls.mode=self-signed"], "/tls/mode"),
    (["--set", "etcd.endpoints[0]=http://etcd:2379"], "/etcd/endpoints/0"),
    (["--set", "coordinator.replicas=1"], "/coordinator/replicas"),
    (["--set", "agent.hostNetwork=true"], "hostNetwork"),
    (["--set", "logFormat=xml"], "/logFormat"),
])
def test_the_values_schema_refuses_what_the_servers_would(bad: list[str], says: str) -> None:
    done = helm("template", "holdfast", str(CHART), "--namespace", NAMESPACE, *bad)
    assert done.returncode != 0 and "schema" in done.stderr and says in done.stderr, done.stderr
