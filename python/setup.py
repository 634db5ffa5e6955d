"""Builds the package, generating the gRPC stubs of ../proto/loraplex/v1
into loraplex/v1/ first (messages, type stubs and service stubs)."""

import glob
import os

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.join(HERE, "..", "proto")


def generate_stubs():
    from grpc_tools import protoc
    import grpc_tools

    protos = sorted(glob.glob(os.path.join(PROTO_ROOT, "loraplex", "v1",
                                           "*.proto")))
    if not protos:
        raise SystemExit(
            f"no .proto files under {PROTO_ROOT}: build the package from "
            "the loraplex source tree (pip install ./python)")
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__),
                              "_proto")
    out = os.path.join(HERE)
    args = ["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}",
            f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}"] + protos
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed on " + " ".join(protos))
    init = os.path.join(out, "loraplex", "v1", "__init__.py")
    if not os.path.exists(init):
        open(init, "w").close()


# Before setup(): setuptools checks the package directories early.
generate_stubs()
setup()
