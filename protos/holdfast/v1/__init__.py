"""holdfast's wire messages (generated from the .proto files beside this one; scripts/gen-protos).

Importing this package defers protobuf's pure-Python message module until something uses it.
Why: every generated module imports `descriptor_pool`, which imports
`google.protobuf.internal.python_message` (and with it `text_format` and the Python decoder) even
on the upb backend, where no message ever goes through it: ~7 ms of every `holdfast run`'s start,
before CMD runs (docs/benchmarks.md). On the pure-Python backend `message_factory` uses the module
as it is imported, which loads it at once, so the deferral changes what is loaded, never what
runs; it is made only on upb, where nothing on any path of ours reaches it (3.11's LazyLoader is
not safe against two threads loading a module first at once, so a module that is used is not
deferred).
"""

from __future__ import annotations

import importlib.util
import sys

from google.protobuf.internal import api_implementation


def _defer(name: str) -> None:
    if name in sys.modules:  # already imported: nothing to save
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        return
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    # `from google.protobuf.internal import python_message` finds it on its package: without this
    # the import machinery looks the module up again, which reads an attribute and loads it.
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, module)


if api_implementation.Type() == "upb":
    _defer("google.protobuf.internal.python_message")
