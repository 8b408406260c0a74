"""``python -m dagster_sideinputs.core.spark.jars fetch``: put every JVM package in the Ivy cache.

``make install`` runs it, so tests, CI and the operator start Spark without downloading,
and a machine that cannot reach Maven Central fails here with one clear message rather
than at the first session. With everything cached it is a file check (no JVM). A module
of its own because ``python -m`` on a module the package already imported warns.
"""

import argparse
import sys
from collections.abc import Sequence

from dagster_sideinputs.core.spark.packages import (
    OPTIONAL_PACKAGES,
    default_ivy_dir,
    fetch_packages,
    missing_packages,
)
from dagster_sideinputs.delta.spark.setup import delta_package


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2: a package could not be resolved)."""
    parser = argparse.ArgumentParser(
        prog="python -m dagster_sideinputs.core.spark.jars",
        description="Resolve the JVM packages Spark sessions load (Delta, Kafka, avro, "
        "S3A) into the Ivy cache, so sessions start without downloading.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="resolve every package once (skipped when cached)")
    fetch.add_argument("--ivy", default=None, help="Ivy directory (default ~/.ivy2.5.2)")
    fetch.add_argument("--repositories", default=None, help="extra Maven repositories")
    fetch.add_argument("--no-delta", action="store_true", help="leave Delta's jar out")
    fetch.add_argument("--force", action="store_true", help="resolve even when cached")
    sub.add_parser("list", help="print the coordinates, one a line")
    args = parser.parse_args(argv)

    coordinates = list(OPTIONAL_PACKAGES)
    if not getattr(args, "no_delta", False):
        # Ours, not the pip package: the coordinate follows the installed delta-spark.
        coordinates.insert(0, delta_package())
    if args.command == "list":
        print("\n".join(coordinates))
        return 0
    ivy = args.ivy or default_ivy_dir()
    if not args.force and not missing_packages(coordinates, ivy):
        print(f"JVM packages: all {len(coordinates)} already in {ivy}/jars")
        return 0
    result = fetch_packages(coordinates, ivy_dir=ivy, repositories=args.repositories)
    if not result.ok:
        print(
            f"JVM packages: could not resolve {', '.join(coordinates)} into {ivy} after "
            f"{result.seconds:.0f} s: {result.reason}.\n"
            "Fix: make Maven Central (https://repo1.maven.org/maven2) reachable, or name a "
            "mirror with DEFAULT_ARTIFACT_REPOSITORY=<url> or --repositories <url>; "
            "docs/JVM_PACKAGES.md shows a `mvn dependency:copy-dependencies` fallback.",
            file=sys.stderr,
        )
        return 2
    print(
        f"JVM packages: {len(coordinates)} resolved ({result.jars} jars) into {ivy} "
        f"in {result.seconds:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
