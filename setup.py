"""Builds the Cython extensions of msgq from the C core in msgq/src.

Release builds (the default: wheels, ``pip install``) carry no debug info and their
shared objects are stripped; ``MSGQ_DEBUG=1`` builds with ``-g`` and keeps the symbols
(``MSGQ_DEBUG=1 ./test.sh`` rebuilds a checkout that way). ``MSGQ_WERROR=1`` makes
warnings errors. The extensions compile in parallel, one per core.
"""

import copy
import glob
import multiprocessing
import os
import re
from concurrent.futures import ThreadPoolExecutor

from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

C_CORE = [
    "msgq/src/msgq.c",
    "msgq/src/msgq_ring.c",
    "msgq/src/queue_file.c",
    "msgq/src/os_wait.c",
    "msgq/src/msgq_errors.c",
    "msgq/src/crc32c.c",
]

#: The public repository's address: none yet (the sdist is where the source lives). The
#: README's relative links (docs/, examples/, LICENSE: files the sdist holds) link there on
#: the package index page once it is set; until then they become their text and path.
REPOSITORY = ""

DEBUG = os.environ.get("MSGQ_DEBUG", "") not in ("", "0")

# -g0 after Python's own CFLAGS (which carry -g) drops the debug info of a release build.
extra_compile_args = ["-std=c11", "-O2", "-g" if DEBUG else "-g0", "-Wall", "-Wextra",
                      "-Wno-unused-function"]
if os.environ.get("MSGQ_WERROR"):
    extra_compile_args.append("-Werror")
#: Link flags of every shared object: unused sections dropped; stripped unless MSGQ_DEBUG.
strip_args = ["-Wl,--gc-sections", *([] if DEBUG else ["-s"])]
#: Compile flags of the extension modules: each function and datum in a section of its
#: own, so that the link (--gc-sections) drops what a module never calls (most of the C
#: core in VisionIPC's module: 11.7 KB of the wheel). Not for the libraries' objects,
#: whose static archives only grow with it.
#: No unwind tables either: nothing unwinds through these C frames (no C++ exception, no
#: thread cancellation; Python's tracebacks are its own frames): 50 KB of the wheel.
ext_compile_args = [*extra_compile_args, "-ffunction-sections", "-fdata-sections",
                    "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"]

#: VisionIPC's C code: the wire formats and the server (libvisionipc, over libmsgq).
VISIONIPC_C = [
    "visionipc/src/vipc_errors.c",
    "visionipc/src/vipc_layout.c",
    "visionipc/src/vipc_packet.c",
    "visionipc/src/vipc_handshake.c",
    "visionipc/src/vipc_buffer.c",
    "visionipc/src/vipc_names.c",
    "visionipc/src/vipc_server.c",
    "visionipc/src/vipc_listener.c",
    "visionipc/src/vipc_client.c",
    "visionipc/src/frame_copy.c",
]

#: The public C API's headers, installed in msgq/include for C programs.
PUBLIC_HEADERS = [
    "msgq/src/msgq.h",
    "msgq/src/msgq_errors.h",
    "visionipc/src/visionipc.h",
    "visionipc/src/vipc_errors.h",
    "visionipc/src/vipc_layout.h",
    "visionipc/src/vipc_packet.h",
    "visionipc/src/vipc_handshake.h",
]


class build_ext_with_c_library(build_ext):  # noqa: N801 (setuptools command style)
    """Also builds the C libraries for native programs: msgq/lib/libmsgq.{so,a} from the
    same C core as the extension and msgq/lib/libvisionipc.{so,a} (the VisionIPC server),
    and copies the public headers to msgq/include (``python -m msgq.cflags`` prints the
    flags that find them)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        # The extensions build side by side, one per core (unless -j says otherwise):
        # the build is most of a fresh checkout's set-up time.
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def _cythonize(self) -> None:
        """Translates the .pyx sources to C (one process per core where children fork),
        when something is built rather than whenever setup.py is loaded: an sdist holds
        no generated C, so building one never runs Cython. Each extension keeps its
        object (setuptools has noted it), with the C file as its source."""
        translated = {ext.name: ext for ext in cythonize(
            self.extensions, language_level=3, nthreads=cython_processes())}
        for ext in self.extensions:
            ext.sources = translated[ext.name].sources

    def _compile_each(self, sources: list[str], **options: object) -> list[str]:
        """The objects of ``sources``, compiled side by side like the extensions."""
        with ThreadPoolExecutor(self.parallel or 1) as pool:
            parts = pool.map(lambda source: self.compiler.compile([source], **options),
                             sources)
            return [obj for part in parts for obj in part]

    def build_extension(self, ext: Extension) -> None:
        """Builds ``ext`` with its objects in a folder of its own: msgq.shm_backend (with
        link-time optimisation) and msgq.visionipc._native (without) both compile the C
        core's sources, and side by side in one folder they would write the same object
        files at once (a torn or wrong-flavoured object reaches the other's link)."""
        own = copy.copy(self)
        own.build_temp = os.path.join(self.build_temp, ext.name)
        super(build_ext_with_c_library, own).build_extension(ext)

    def run(self) -> None:
        self._cythonize()
        super().run()
        in_source = self.inplace or getattr(self, "editable_mode", False)
        package_dir = "msgq" if in_source else os.path.join(self.build_lib, "msgq")
        lib_dir = os.path.join(package_dir, "lib")
        include_dir = os.path.join(package_dir, "include")
        os.makedirs(lib_dir, exist_ok=True)
        os.makedirs(include_dir, exist_ok=True)
        objects = self._compile_each(
            C_CORE, output_dir=os.path.join(self.build_temp, "libmsgq"),
            extra_preargs=["-fPIC", "-fvisibility=default"],
            extra_postargs=extra_compile_args)
        self.compiler.link_shared_object(
            objects, "libmsgq.so", output_dir=lib_dir, libraries=["pthread"],
            extra_preargs=["-Wl,-soname,libmsgq.so"], extra_postargs=strip_args)
        self.compiler.create_static_lib(objects, "msgq", output_dir=lib_dir)
        vipc_objects = self._compile_each(
            VISIONIPC_C, output_dir=os.path.join(self.build_temp, "libvisionipc"),
            include_dirs=["msgq/src", "visionipc/src"],
            extra_preargs=["-fPIC"], extra_postargs=extra_compile_args)
        self.compiler.link_shared_object(
            vipc_objects, "libvisionipc.so", output_dir=lib_dir,
            libraries=["msgq", "pthread"], library_dirs=[lib_dir],
            # $ORIGIN: libvisionipc.so finds libmsgq.so beside it, whatever the program's
            # own search path.
            extra_preargs=["-Wl,-soname,libvisionipc.so", "-Wl,-rpath,$ORIGIN"],
            extra_postargs=strip_args)
        self.compiler.create_static_lib(vipc_objects, "visionipc", output_dir=lib_dir)
        for header in PUBLIC_HEADERS:
            self.copy_file(header, include_dir)


extensions = [
    Extension(
        "msgq.shm_backend",
        sources=["msgq/shm_backend.pyx", *C_CORE],
        include_dirs=["msgq"],
        # Hidden visibility (only PyInit_shm_backend is exported) makes the calls between
        # the binding and the C core direct instead of through the PLT, and link-time
        # optimisation then inlines the public API's thin wrappers (msgq_pub_send,
        # msgq_sub_view, ...) into the hot paths: calling msgq.h costs nothing over
        # calling the ring directly.
        extra_compile_args=[*ext_compile_args, "-fvisibility=hidden", "-flto"],
        extra_link_args=["-flto", "-O2", *strip_args],
        # msgq/shm/*.pyx: the files of the module's source that shm_backend.pyx includes,
        # one per concept; msgq/cdefs/*.pxd: the C declarations it cimports.
        depends=[p.replace(".c", ".h") for p in C_CORE] + sorted(glob.glob("msgq/shm/*.pyx"))
        + sorted(glob.glob("msgq/cdefs/*.pxd")) + ["msgq/_reservation.pxd"],
    ),
    # The Reservation base (reserve()'s commit/abort protocol): backend-neutral, no C core,
    # so that the ZMQ backend subclasses it without importing the shared-memory extension.
    Extension(
        "msgq._reservation",
        sources=["msgq/_reservation.pyx"],
        extra_compile_args=ext_compile_args,
        extra_link_args=strip_args,
    ),
    # VisionIPC's C code in one module (each extension costs its own start-up and utility
    # code, about 4 s of compiling): the wire formats (packet, handshake, buffer layout)
    # that packet.py, handshake.py and buffer.py use, the frame copy (streaming stores for
    # large frames; numpy is the fallback), and the server and client (visionipc.h) that
    # VisionIpcServer and VisionIpcClient wrap: the C library that C programs link. Its
    # packet queues are the caller's (a Python socket on the selected backend), but the
    # C core is linked in for the library's own msgq calls; hidden visibility keeps it
    # private to this module.
    Extension(
        "msgq.visionipc._native",
        sources=["visionipc/_native.pyx", *VISIONIPC_C, *C_CORE],
        include_dirs=["visionipc", "msgq/src", "visionipc/src"],
        extra_compile_args=[*ext_compile_args, "-fvisibility=hidden", "-flto"],
        extra_link_args=["-flto", "-O2", *strip_args],
        depends=sorted(glob.glob("visionipc/src/*.h")) + sorted(glob.glob("visionipc/*.pxi"))
        + [p.replace(".c", ".h") for p in C_CORE],
    ),
    # The typed reader: fields read straight from Cap'n Proto bytes, every pointer checked
    # (pycapnp is the fallback), for SubMaster's payload views and Spark's typed columns.
    Extension(
        "msgq.schemas._typed_reader",
        sources=["schemas/_typed_reader.pyx"],
        extra_compile_args=ext_compile_args,
        extra_link_args=strip_args,
        depends=["schemas/_capnp_wire.pxd"],  # the wire walk both readers cimport
    ),
    # Its writing twin: the Event builder that new_message returns (the same kind codes).
    Extension(
        "msgq.schemas._event_builder",
        sources=["schemas/_event_builder.pyx"],
        extra_compile_args=ext_compile_args,
        extra_link_args=strip_args,
        depends=["schemas/_capnp_wire.pxd"],
    ),
    # The log scanner: messages of a decompressed log split and peeked in C, in batches.
    Extension(
        "msgq.messaging._update",
        sources=["msgq/messaging/_update.pyx"],
        extra_compile_args=ext_compile_args,
        extra_link_args=strip_args,
    ),
    Extension(
        "msgq.logs._scan",
        sources=["msgq/logs/_scan.pyx", "msgq/logs/src/log_scan.c"],
        include_dirs=["msgq/logs/src"],
        extra_compile_args=ext_compile_args,
        extra_link_args=strip_args,
        depends=["msgq/logs/src/log_scan.h"],
    ),
    # The benchmark's cache bound: a model pipeline of two copies on two CPUs (C threads),
    # the physical limit the copying rows of `python -m msgq.bench` are reported against.
    Extension(
        "msgq.bench._bound",
        sources=["msgq/bench/_bound.pyx", "msgq/bench/src/cache_bound.c"],
        include_dirs=["msgq/bench/src"],
        extra_compile_args=ext_compile_args,
        extra_link_args=strip_args,
        libraries=["pthread"],
        depends=["msgq/bench/src/cache_bound.h"],
    ),
    # The MCAP export's JSON writer: Cap'n Proto bytes to JSON text, a batch per call.
    Extension(
        "msgq.viz._json_writer",
        sources=["msgq/viz/_json_writer.pyx"],
        # for size (-Os after -O2): an export's writer, not a hot path of messaging or
        # the lake; 30 KB of the wheel, which the typed reader's columnar walk needed
        extra_compile_args=[*ext_compile_args, "-Os"],
        extra_link_args=strip_args,
        depends=["schemas/_capnp_wire.pxd"],  # the wire walk both readers cimport
    ),
]


def selected(modules: list[Extension], skip: str) -> list[Extension]:
    """``modules`` less those named in ``skip`` (comma-separated module names, from
    MSGQ_SKIP_EXTENSIONS): ./run.sh's set-up leaves out msgq.viz._json_writer, which only
    the viz extra's MCAP export uses (./test.sh and wheels build every one)."""
    names = {name.strip() for name in skip.split(",") if name.strip()}
    unknown = names - {m.name for m in modules}
    if unknown:
        raise SystemExit(f"MSGQ_SKIP_EXTENSIONS names no extension: {', '.join(sorted(unknown))}"
                         f" (these are: {', '.join(m.name for m in modules)})")
    return [m for m in modules if m.name not in names]


def long_description(readme: str = "README.md", repository: str = REPOSITORY) -> str:
    """README.md for the package index page, where links relative to the source tree
    (docs/, examples/, LICENSE) lead nowhere: with a ``repository`` they point into it;
    without one each becomes its text and the file's path in the sdist."""
    with open(readme, encoding="utf-8") as f:
        text = f.read()

    def rewritten(match: re.Match) -> str:
        label, target = match.group(1), match.group(2)
        if re.match(r"[a-z]+:|#|/", target):
            return match.group(0)
        if repository:
            kind = "tree" if target.rstrip("/").split("#")[0].count(".") == 0 else "blob"
            return f"[{label}]({repository}/{kind}/main/{target})"
        path = target.split("#")[0].rstrip("/")
        if label.strip("`") in (target, path, os.path.basename(path)):
            return f"`{target}`"  # the label names the file: the path says it all
        return f"{label} (`{target}`)"

    return re.sub(r"\[([^\]]*)\]\(([^)\s]+)\)", rewritten, text)


def cython_processes() -> int:
    """How many processes translate the .pyx files: one per core where child processes
    fork (a spawned child would run this script again), else none besides this one."""
    if multiprocessing.get_start_method() != "fork":
        return 0
    return os.cpu_count() or 1


setup(
    long_description=long_description(),
    long_description_content_type="text/markdown",
    ext_modules=selected(extensions, os.environ.get("MSGQ_SKIP_EXTENSIONS", "")),
    cmdclass={"build_ext": build_ext_with_c_library},
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
    package_data={
        "": ["*.pyi"],
        "msgq": ["py.typed", "include/*.h", "lib/*.so", "lib/*.a"],
        "msgq.schemas": ["*.capnp"],
    },
    # The wheel holds what runs: the sources the sdist carries (C trees, Cython files, the
    # C that Cython generates) stay out of it.
    exclude_package_data={
        "": ["*.c", "*.pyx", "*.pxd", "*.pxi"],
        "msgq": ["src/*", "logs/src/*", "bench/src/*"],
        "msgq.logs": ["src/*"],
        "msgq.bench": ["src/*"],
        "msgq.visionipc": ["src/*"],
    },
)
