/* checked.c — checked size arithmetic (checked.h): the one place sizes from user input
 * are multiplied, so an impossible size is LK_EINVAL naming the argument instead of a
 * wrapped allocation. */
#include <stdio.h>
#include "core/checked.h"
#include "llmkern/registry.h"

lk_status lk_checked_prod(const char *what, const int64_t *f, int n, int64_t *out) {
    int64_t p = 1;
    int bad = 0;
    for (int i = 0; i < n; i++) bad |= f[i] < 0 || __builtin_mul_overflow(p, f[i], &p);
    if (!bad) { *out = p; return LK_OK; }
    char list[256];
    size_t k = 0;
    for (int i = 0; i < n && k < sizeof list; i++)
        k += (size_t)snprintf(list + k, sizeof list - k, "%s%lld", i ? " x " : "", (long long)f[i]);
    for (int i = 0; i < n; i++)
        if (f[i] < 0) return lk_error(LK_EINVAL, "%s: %s: expected non-negative factors, got %lld", what, list,
                                      (long long)f[i]);
    return lk_error(LK_EINVAL, "%s: %s does not fit in 64 bits", what, list);
}

lk_status lk_checked_mul(const char *what, int64_t a, int64_t b, int64_t *out) {
    int64_t f[2] = {a, b};
    return lk_checked_prod(what, f, 2, out);
}

lk_status lk_checked_add(const char *what, int64_t a, int64_t b, int64_t *out) {
    int64_t s;
    if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &s))
        return lk_error(LK_EINVAL, "%s: %lld + %lld %s", what, (long long)a, (long long)b,
                        a < 0 || b < 0 ? "has a negative term" : "does not fit in 64 bits");
    *out = s;
    return LK_OK;
}

lk_status lk_checked_bytes(const char *what, int64_t count, size_t elem, size_t *out) {
    int64_t bytes;
    if (elem > (size_t)INT64_MAX) return lk_error(LK_EINVAL, "%s: element size %zu is too large", what, elem);
    int64_t f[2] = {count, (int64_t)elem};
    if (count < 0 || __builtin_mul_overflow(count, (int64_t)elem, &bytes) || (uint64_t)bytes > (uint64_t)PTRDIFF_MAX) {
        if (count < 0) return lk_checked_prod(what, f, 2, &bytes);
        return lk_error(LK_EINVAL, "%s: %lld x %zu bytes does not fit in 64 bits", what, (long long)count, elem);
    }
    *out = (size_t)bytes;
    return LK_OK;
}

const char *lk_bytes_str(uint64_t b, char *buf, size_t n) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 6) v /= 1024.0, u++;
    if (u == 0) snprintf(buf, n, "%llu B", (unsigned long long)b);
    else snprintf(buf, n, "%.1f %s", v, unit[u]);
    return buf;
}

lk_status lk_check_fits_memory(const char *what, uint64_t bytes) {
    const lk_hw *hw = lk_hw_get();
    uint64_t have = hw ? (uint64_t)hw->cpu_mem_bytes : 0;
    if (have == 0 || bytes <= have) return LK_OK;
    char need_s[32], have_s[32];
    return lk_error(LK_ENOMEM, "%s: needs %s, more than this machine's %s of memory", what,
                    lk_bytes_str(bytes, need_s, sizeof need_s), lk_bytes_str(have, have_s, sizeof have_s));
}
