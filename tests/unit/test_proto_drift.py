"""The committed generated modules are exactly what the .proto files generate today, and the
package that holds them defers only what nothing uses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("agent_pb2.py", "agent_pb2.pyi", "agent_pb2_grpc.py",
             "coordinator_pb2.py", "coordinator_pb2.pyi", "coordinator_pb2_grpc.py")


def test_committed_modules_match_protos(tmp_path: Path) -> None:
    sources = (ROOT / "protos/holdfast/v1").glob("*.proto")
    protos = sorted(str(p.relative_to(ROOT / "protos")) for p in sources)
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT / "protos"), f"--python_out={tmp_path}",
         f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", *protos],
        check=True, cwd=ROOT,
    )
    drifted = [name for name in GENERATED
               if (tmp_path / "holdfast/v1" / name).read_bytes()
               != (ROOT / "protos/holdfast/v1" / name).read_bytes()]
    assert drifted == [], f"regenerate with ./scripts/gen-protos: {drifted} differ from the .proto files"


def test_deferred_message_module_loads_when_used() -> None:
    """holdfast.v1 defers protobuf's pure-Python message module on upb: messages work without it,
    and reaching it loads it whole (the deferral changes what is loaded, never what runs)."""
    program = """if True:
        import sys
        from google.protobuf.internal import api_implementation
        from holdfast.v1 import coordinator_pb2 as pb
        request = pb.AcquireRequest(session_id="s", takeover=True)
        assert pb.AcquireRequest.FromString(request.SerializeToString()) == request
        assert "session_id" in str(request)
        deferred = "google.protobuf.text_format" not in sys.modules
        assert deferred == (api_implementation.Type() == "upb"), api_implementation.Type()
        from google.protobuf.internal import python_message
        assert isinstance(python_message.GeneratedProtocolMessageType, type)
        assert "google.protobuf.text_format" in sys.modules
    """
    subprocess.run([sys.executable, "-c", program], check=True, cwd=ROOT)
