"""pip's entry to the CMake build: `pip install --no-build-isolation .` (see pyproject.toml).

The compiled half of the package, kvpool._kvpool, is the CMake target kvpool_python. It is
built in $KVPOOL_BUILD_DIR (default: build/, the tree scripts/build.sh uses, so an existing
build is reused) with this interpreter, and copied into the wheel next to the Python sources.
$KVPOOL_JOBS sets the build's parallelism.
"""

import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent
(ROOT / "build").mkdir(exist_ok=True)  # setuptools' egg-info and staging go under it


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = pathlib.Path(os.environ.get("KVPOOL_BUILD_DIR", ROOT / "build"))
        jobs = os.environ.get("KVPOOL_JOBS", str(os.cpu_count() or 1))
        if not (build_dir / "CMakeCache.txt").exists():
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            subprocess.check_call(
                ["cmake", "-S", str(ROOT), "-B", str(build_dir), *generator,
                 "-DCMAKE_BUILD_TYPE=" + os.environ.get("KVPOOL_BUILD_TYPE", "RelWithDebInfo"),
                 "-DPython_EXECUTABLE=" + sys.executable,
                 "-DPYTHON_EXECUTABLE=" + sys.executable])
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "kvpool_python",
                               "-j", jobs])
        built = sorted((build_dir / "engine_plugin/python/site/kvpool").glob("_kvpool*.so"))
        if not built:
            raise RuntimeError(f"the CMake build left no _kvpool*.so in {build_dir}")
        target = pathlib.Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[-1], target)


setup(ext_modules=[CMakeExtension("kvpool._kvpool")], cmdclass={"build_ext": CMakeBuild},
      # setuptools' own staging stays out of the CMake tree's top level.
      options={"build": {"build_base": str(ROOT / "build" / "setuptools")},
               "egg_info": {"egg_base": str(ROOT / "build")}})
