"""`kvpool --version` / `python3 -m kvpool --version`: the installed package's version."""

import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="kvpool", description="kvpool's Python package")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("--info", action="store_true",
                        help="print the version, where the package is and what it was built with")
    args = parser.parse_args(argv)
    import kvpool
    if args.info:
        print(f"kvpool {kvpool.__version__}")
        print(f"package: {kvpool.__file__}")
        print(f"module: {kvpool._kvpool.__file__}")
        print(f"built with CUDA kernels: {'yes' if kvpool.HAS_CUDA else 'no'}")
        return 0
    if args.version:
        print(f"kvpool {kvpool.__version__}")
        return 0
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
