"""``msgq spark``: helpers for running msgq's Spark pipeline on a cluster."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from msgq.cli.output import EXIT_OK, CommandError, human_bytes, paint

DESCRIPTION = """\
Helpers for running msgq's Spark pipeline (msgq logstats, msgq.spark) on a cluster.

  pack-env OUT.tar.gz   pack this virtual environment, msgq included, for executors that
                        lack msgq: PySpark's packed-virtualenv route. Then run
                          msgq logstats PATH --master spark://HOST:7077 \\
                            --conf spark.archives=OUT.tar.gz#environment \\
                            --conf spark.pyspark.python=./environment/bin/python
                        The executors need the base Python of this venv at the same path
                        (the archive links bin/python to it); pyspark's jars are left out
                        (executors run their own Spark's). Zips via --py-files cannot
                        carry msgq: no compiled extensions or schema files from a zip.

See docs/spark.md ("On a cluster")."""

EPILOG = """\
examples:
  msgq spark pack-env msgq-env.tar.gz            this venv, msgq included, for executors
  msgq logstats /shared/rec --master spark://head:7077 \\
      --conf spark.archives=msgq-env.tar.gz#environment \\
      --conf spark.pyspark.python=./environment/bin/python"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers ``msgq spark``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "spark", help="cluster helpers for the Spark pipeline (pack-env)",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="spark_command", metavar="<action>", required=True)
    pack = actions.add_parser("pack-env", help="this venv, msgq included, as a tar.gz for "
                                               "spark.archives",
                              description="Pack this virtual environment (msgq included) "
                                          "for spark.archives; see msgq spark --help.",
                              epilog="examples:\n  msgq spark pack-env msgq-env.tar.gz",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    pack.add_argument("output", metavar="OUT.tar.gz", help="the archive to write")
    return parser


def run(args: argparse.Namespace) -> int:
    """Runs the chosen action."""
    # loaded when the command runs, not at CLI start-up
    from msgq.spark.pack import ARCHIVE_ROOT, pack_env

    def progress(text: str) -> None:
        if sys.stderr.isatty():
            print(paint(text, "dim", sys.stderr), file=sys.stderr)

    try:
        info = pack_env(args.output, progress)
    except (ValueError, OSError) as e:
        raise CommandError(str(e)) from None
    print(f"wrote {info['path']} ({human_bytes(int(info['bytes']))}, {info['files']} files; "
          f"Python {info['python']} at {info['base_python']} needed on every executor)")
    print(f"use: --conf spark.archives={info['path']}#{ARCHIVE_ROOT} "
          f"--conf spark.pyspark.python=./{ARCHIVE_ROOT}/bin/python")
    return EXIT_OK
