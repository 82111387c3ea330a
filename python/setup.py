"""Builds the `ckpt` package's _ckpt extension with the project's CMake build.

    pip install --no-build-isolation ./python      (from the repository root)

Needs the same Debian packages as the C++ build (tools/install-deps.sh) and pybind11."""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.path.join(ROOT, "build-pip")
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                               "-DCKPT_BUILD_TESTS=OFF", f"-DPython3_EXECUTABLE={sys.executable}"])
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "_ckpt", "-j", str(os.cpu_count() or 2)])
        built = os.path.join(build_dir, "python", "ckpt")
        target = os.path.dirname(self.get_ext_fullpath(ext.name))
        os.makedirs(target, exist_ok=True)
        for name in os.listdir(built):
            if name.startswith("_ckpt") and name.endswith(".so"):
                shutil.copy2(os.path.join(built, name), os.path.join(target, name))


setup(packages=["ckpt"], ext_modules=[Extension("ckpt._ckpt", sources=[])], cmdclass={"build_ext": CMakeBuild})
