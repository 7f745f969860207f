"""shim.py — bench/peers_shim.c's library from a build folder, bound to that folder's libllmkern.so.

The shim links libllmkern.so by name, so the dynamic linker takes the first one on LD_LIBRARY_PATH
(in an A/B, the other build's: the thirtieth session's A rows of .carry's flex script ran B's
library). Opened first, by path, the build's own copy is the one the shim's dependency finds (a
loaded library answers to its soname). RTLD_LOCAL, as the shim itself: llmkern's CUDA runtime
pieces loaded globally met torch's copies and the process aborted in free() (peers_cuda.py).

    import shim; LIB = shim.load(build)
"""
import ctypes
import os


def load(build):
    own = os.path.join(build, "libllmkern.so")
    if os.path.exists(own):   # a build folder; an installed shim finds the installed library
        ctypes.CDLL(own, mode=os.RTLD_LOCAL)
    return ctypes.CDLL(os.path.join(build, "libllmkern_peers_shim.so"))
