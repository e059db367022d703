"""Builds the Cython extensions of msgq from the C core in msgq/src."""

import os

from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

C_CORE = [
    "msgq/src/msgq.c",
    "msgq/src/msgq_ring.c",
    "msgq/src/queue_file.c",
    "msgq/src/os_wait.c",
    "msgq/src/msgq_errors.c",
    "msgq/src/crc32c.c",
]

extra_compile_args = ["-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-Wno-unused-function"]
if os.environ.get("MSGQ_WERROR"):
    extra_compile_args.append("-Werror")

extensions = [
    Extension(
        "msgq.shm_backend",
        sources=["msgq/shm_backend.pyx", *C_CORE],
        include_dirs=["msgq"],
        extra_compile_args=extra_compile_args,
        depends=[p.replace(".c", ".h") for p in C_CORE] + ["msgq/ring.pxd"],
    ),
    # VisionIPC's frame copy (streaming stores for large frames; numpy is the fallback).
    Extension(
        "msgq.visionipc._frame_copy",
        sources=["visionipc/_frame_copy.pyx", "visionipc/src/frame_copy.c"],
        include_dirs=["visionipc"],
        extra_compile_args=extra_compile_args,
        depends=["visionipc/src/frame_copy.h"],
    ),
]

setup(
    ext_modules=cythonize(extensions, language_level=3),
    package_dir={
        "msgq": "msgq",
        "msgq.visionipc": "visionipc",
        "msgq.schemas": "schemas",
    },
    # msgq and its subpackages, plus the two top-level folders mapped into it.
    packages=[
        "msgq",
        *(f"msgq.{name}" for name in find_packages("msgq")),
        "msgq.visionipc",
        "msgq.schemas",
    ],
    package_data={"msgq": ["py.typed", "*.pyi"], "msgq.schemas": ["*.capnp"]},
)
