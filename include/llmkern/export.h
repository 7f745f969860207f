/* export.h — LK_API, the mark of the public API. libllmkern.so is compiled with
 * -fvisibility=hidden (CMakeLists.txt), so its dynamic symbol table (`nm -D
 * --defined-only`) holds exactly the functions and objects that a header of
 * include/llmkern/ declares with LK_API: what a C program, bench/peers_shim.c or
 * python/llmkern (ctypes) may call. Everything else (the registry's tables, kernels,
 * harnesses, the ce_* helpers) stays inside the library; the CLI and the tests, which
 * call some of it, link the same objects statically (llmkern_internal, CMakeLists.txt).
 * LK_INTERNAL_API exports an internal function that a separate module of this project
 * calls (bench/peers_shim.c): not API, kept to the few that need it. */
#ifndef LLMKERN_EXPORT_H
#define LLMKERN_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define LK_API __attribute__((visibility("default")))
#else
#define LK_API
#endif
#define LK_INTERNAL_API LK_API

#endif
