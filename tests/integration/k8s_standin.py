"""A stand-in Kubernetes API server on loopback HTTPS: TokenReview, pod reads and node reads.

It answers the JSON shapes of the Kubernetes API reference
(https://kubernetes.io/docs/reference/kubernetes-api/authentication-resources/token-review-v1/,
.../workload-resources/pod-v1/, .../cluster-resources/node-v1/, and the `Status` object of a 404).
Tokens are real JWTs (ES256) signed by the stand-in's own key, with the claims Kubernetes puts in a
projected pod token (iss, sub, aud, exp, iat, nbf, jti and the `kubernetes.io` claim with namespace,
pod, serviceaccount and, on 1.30+ clusters, node). A TokenReview checks them as the API server
does: signature, expiry, audience against spec.audiences, and that the bound pod (and node) still
exists with the token's uid; anything else answers `authenticated` absent with an `error`. Every
request needs the issuer's bearer token. One thread; `close()` stops it.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature
from cryptography.x509.oid import NameOID

ISSUER = "https://kubernetes.default.svc.cluster.local"
DEFAULT_API_AUDIENCES = [ISSUER]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class ApiState:
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The real API server refuses a bound token whose pod (or node) is gone; off, the stand-in
    # models the moment between a TokenReview and the issuer's own pod read.
    check_bound_objects: bool = True
    reviews: int = 0
    node_reads: int = 0  # Node GETs answered (counted once the answer is sent)


def _self_signed_server(directory: Path) -> tuple[Path, Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stand-in kube-apiserver")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "apiserver.pem", directory / "apiserver.key"
    ca_path = directory / "ca.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    ca_path.write_bytes(cert_path.read_bytes())
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path, ca_path


class KubeStandIn:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.state = ApiState()
        self.signing_key = ec.generate_private_key(ec.SECP256R1())
        self.issuer_token = _b64(uuid.uuid4().bytes)
        self.issuer_token_file = directory / "issuer-token"
        self.issuer_token_file.write_text(self.issuer_token)
        cert, key, self.ca_file = _self_signed_server(directory)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="kube-standin", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    # -- the cluster's objects --------------------------------------------------------------------
    def add_node(self, name: str) -> dict[str, Any]:
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "uid": str(uuid.uuid4()),
                             "labels": {"kubernetes.io/hostname": name}},
                "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
        self.state.nodes[name] = node
        return node

    def add_pod(self, namespace: str, name: str, node: str,
                owner: tuple[str, str] = ("DaemonSet", "holdfast-agent"), phase: str = "Running",
                service_account: str = "holdfast-agent") -> dict[str, Any]:
        kind, owner_name = owner
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": owner_name,
                                                 "uid": str(uuid.uuid4()), "controller": True,
                                                 "blockOwnerDeletion": True}]},
               "spec": {"nodeName": node, "serviceAccountName": service_account,
                        "containers": [{"name": "agent", "image": "holdfast:test"}]},
               "status": {"phase": phase}}
        self.state.pods[(namespace, name)] = pod
        return pod

    def token(self, pod: dict[str, Any], audience: str = "holdfast", with_node: bool = False,
              service_account: str = "", expires_in: int = 600, now: float | None = None,
              signing_key: ec.EllipticCurvePrivateKey | None = None) -> str:
        """A projected token for `pod`, as kubelet would mount it."""
        meta = pod["metadata"]
        namespace, sa = meta["namespace"], service_account or pod["spec"]["serviceAccountName"]
        issued = int(now if now is not None else time.time())
        k8s: dict[str, Any] = {"namespace": namespace, "pod": {"name": meta["name"], "uid": meta["uid"]},
                               "serviceaccount": {"name": sa, "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, sa))}}
        if with_node:
            node = self.state.nodes[pod["spec"]["nodeName"]]["metadata"]
            k8s["node"] = {"name": node["name"], "uid": node["uid"]}
        claims = {"aud": [audience], "exp": issued + expires_in, "iat": issued, "iss": ISSUER,
                  "jti": str(uuid.uuid4()), "kubernetes.io": k8s, "nbf": issued,
                  "sub": f"system:serviceaccount:{namespace}:{sa}"}
        header = {"alg": "ES256", "kid": "standin"}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        der = (signing_key or self.signing_key).sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
        r, s = decode_dss_signature(der)
        return f"{signing_input}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    # -- TokenReview as the API server does it --------------------------------------------------
    def _authenticate(self, token: str, audiences: list[str]) -> tuple[dict[str, Any] | None, str]:
        try:
            head, body, sig = token.split(".")
            raw = _unb64(sig)
            der = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
            self.signing_key.public_key().verify(der, f"{head}.{body}".encode(), ec.ECDSA(hashes.SHA256()))
            claims = json.loads(_unb64(body))
        except (ValueError, InvalidSignature):
            return None, "[invalid bearer token, square/go-jose: error in cryptographic primitive]"
        now = time.time()
        if claims.get("exp", 0) < now or claims.get("nbf", 0) > now + 60:
            return None, "[invalid bearer token, service account token has expired]"
        wanted = audiences or DEFAULT_API_AUDIENCES
        token_aud = claims.get("aud", [])
        matched = [a for a in wanted if a in token_aud]
        if not matched:
            return None, (f"[invalid bearer token, token audiences {token_aud} is invalid for the target "
                          f"audiences {wanted}]")
        k8s = claims.get("kubernetes.io", {})
        pod_ref = k8s.get("pod", {})
        if self.state.check_bound_objects:
            pod = self.state.pods.get((k8s.get("namespace"), pod_ref.get("name")))
            if pod is None or pod["metadata"]["uid"] != pod_ref.get("uid"):
                return None, (f"[invalid bearer token, pods \"{pod_ref.get('name')}\" not found or uid "
                              "does not match]")
            if "node" in k8s:
                node = self.state.nodes.get(k8s["node"]["name"])
                if node is None or node["metadata"]["uid"] != k8s["node"]["uid"]:
                    return None, f"[invalid bearer token, nodes \"{k8s['node']['name']}\" not found]"
        extra = {"authentication.kubernetes.io/credential-id": [f"JTI={claims.get('jti')}"],
                 "authentication.kubernetes.io/pod-name": [pod_ref.get("name")],
                 "authentication.kubernetes.io/pod-uid": [pod_ref.get("uid")]}
        if "node" in k8s:
            extra["authentication.kubernetes.io/node-name"] = [k8s["node"]["name"]]
            extra["authentication.kubernetes.io/node-uid"] = [k8s["node"]["uid"]]
        namespace = k8s.get("namespace")
        user = {"username": claims["sub"], "uid": k8s.get("serviceaccount", {}).get("uid", ""),
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                           "system:authenticated"], "extra": extra}
        return {"authenticated": True, "user": user, "audiences": matched}, ""

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # quiet test output
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {standin.issuer_token}":
                    return True
                self._send(401, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                 "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
                return False

            def _not_found(self, kind: str, name: str) -> None:
                self._send(404, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                 "message": f"{kind} \"{name}\" not found", "reason": "NotFound",
                                 "details": {"name": name, "kind": kind}, "code": 404})

            def do_POST(self) -> None:
                if not self._authorized():
                    return
                if self.path.split("?")[0] != "/apis/authentication.k8s.io/v1/tokenreviews":
                    self._not_found("paths", self.path)
                    return
                review = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                spec = review.get("spec", {})
                standin.state.reviews += 1
                status, error = standin._authenticate(spec.get("token", ""), spec.get("audiences") or [])
                self._send(201, {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
                                 "metadata": {"creationTimestamp": None}, "spec": spec,
                                 "status": status or {"user": {}, "error": error}})

            def do_GET(self) -> None:
                if not self._authorized():
                    return
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 6 and parts[4] == "pods":
                    pod = standin.state.pods.get((parts[3], parts[5]))
                    self._send(200, pod) if pod else self._not_found("pods", parts[5])
                elif parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
                    node = standin.state.nodes.get(parts[3])
                    self._send(200, node) if node else self._not_found("nodes", parts[3])
                    standin.state.node_reads += 1
                else:
                    self._not_found("paths", self.path)

        return Handler


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[KubeStandIn]:
    """A stand-in API server for one test (a fixture plugin: list this module in pytest_plugins)."""
    standin = KubeStandIn(tmp_path / "apiserver")
    try:
        yield standin
    finally:
        standin.close()
