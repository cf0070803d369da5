"""Builds ridgescope._C with CMake (the single build truth) and installs it into the package.

Use ``pip install --no-build-isolation -e .`` (or without -e): the extension must be built
against the torch already installed in this environment, which an isolated build would not see.
Environment: RIDGESCOPE_BUILD_DIR (default build/py), RIDGESCOPE_DEBUG=1, CMAKE_ARGS.
"""
import os
import shlex
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        # .../ridgescope/_C.<soabi>.so -> install the package files into .../ridgescope
        target = Path(self.get_ext_fullpath(ext.name)).resolve()
        prefix = target.parent.parent
        build_dir = Path(os.environ.get("RIDGESCOPE_BUILD_DIR", ROOT / "build" / "py"))
        build_dir.mkdir(parents=True, exist_ok=True)
        config = "Debug" if os.environ.get("RIDGESCOPE_DEBUG") == "1" else "Release"
        args = [
            f"-DCMAKE_BUILD_TYPE={config}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_INSTALL_PREFIX={prefix}",
            "-DRIDGESCOPE_PACKAGE_DIR=ridgescope",
            "-DRIDGESCOPE_BUILD_TORCH=ON",
        ]
        generator = []
        if not (build_dir / "CMakeCache.txt").exists():
            if subprocess.run(["ninja", "--version"], capture_output=True).returncode == 0:
                generator = ["-G", "Ninja"]
        args += shlex.split(os.environ.get("CMAKE_ARGS", ""))
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build_dir), *generator, *args], check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "_C", "-j", jobs], check=True)
        # Unlink the old module first: processes that have it loaded keep their copy, where
        # overwriting the file in place would change the pages under them.
        for old in target.parent.glob("_C*.so"):
            old.unlink()
        subprocess.run(["cmake", "--install", str(build_dir), "--component", "python"], check=True)


setup(ext_modules=[CMakeExtension("ridgescope._C")], cmdclass={"build_ext": CMakeBuild})
