"""setup.py — `pip install ./python` copies a built libllmkern.so into the package, so
the installed package needs no LD_LIBRARY_PATH: $LLMKERN_LIB if set, else the checkout's
build/libllmkern.so (build it first: make build). Without either the package installs
without the library and finds one at import time through $LLMKERN_LIB (llmkern/_lib.py)."""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def built_library():
    for p in (os.environ.get("LLMKERN_LIB"), os.path.join(HERE, "..", "build", "libllmkern.so")):
        if p and os.path.isfile(p):
            return os.path.realpath(p)
    return None


class BuildPy(build_py):
    def run(self):
        super().run()
        lib = built_library()
        if lib:
            dst = os.path.join(self.build_lib, "llmkern", "libllmkern.so")
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(lib, dst)
            print(f"llmkern: bundled {lib}")
        else:
            print("llmkern: no libllmkern.so found (set LLMKERN_LIB or build ../build); "
                  "the package will look for it at import time")


class BinaryDistribution(Distribution):
    def has_ext_modules(self):      # the wheel carries a platform library
        return built_library() is not None


setup(cmdclass={"build_py": BuildPy}, distclass=BinaryDistribution)
