/* png.c — a minimal PNG writer (8-bit RGB, zlib "stored" blocks, so no compressor is
 * needed) and the loss plot the trainer writes with it (train.h: lk_png_write,
 * lk_plot_png). Files are written atomically through checkpoint.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/checkpoint.h"
#include "llmkern/train.h"

static uint32_t crc32_update(uint32_t crc, const uint8_t *p, size_t n) {
    static uint32_t table[256];
    static int ready;
    if (!ready) {   /* idempotent, so a race only computes the same table twice */
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static uint8_t *put32(uint8_t *o, uint32_t v) {
    o[0] = (uint8_t)(v >> 24); o[1] = (uint8_t)(v >> 16); o[2] = (uint8_t)(v >> 8); o[3] = (uint8_t)v;
    return o + 4;
}

/* Chunk at o: length, type, data (already in place at o + 8), CRC over type + data. */
static uint8_t *chunk(uint8_t *o, const char *type, size_t len) {
    put32(o, (uint32_t)len);
    memcpy(o + 4, type, 4);
    return put32(o + 8 + len, crc32_update(0, o + 4, len + 4));
}

lk_status lk_png_write(const char *path, const uint8_t *rgb, int w, int h) {
    if (path == NULL || rgb == NULL || w < 1 || h < 1 || w > 16384 || h > 16384)
        return lk_error(LK_EINVAL, "png: expected a path, pixels and 1..16384 x 1..16384, got %d x %d", w, h);
    size_t row = (size_t)w * 3 + 1, raw = row * (size_t)h;
    size_t n_blocks = (raw + 65534) / 65535;
    size_t idat = 2 + raw + 5 * n_blocks + 4;          /* zlib header, blocks, Adler-32 */
    size_t total = 8 + (12 + 13) + (12 + idat) + 12;
    uint8_t *buf = malloc(total), *o = buf;
    if (buf == NULL) return lk_error(LK_ENOMEM, "png: %zu bytes", total);
    memcpy(o, "\x89PNG\r\n\x1a\n", 8);
    o += 8;
    uint8_t *d = o + 8;
    d = put32(d, (uint32_t)w);
    d = put32(d, (uint32_t)h);
    memcpy(d, "\x08\x02\x00\x00\x00", 5);               /* 8-bit, RGB, deflate, no filter, no interlace */
    o = chunk(o, "IHDR", 13);
    d = o + 8;
    *d++ = 0x78; *d++ = 0x01;                           /* deflate, 32K window, no preset dictionary */
    uint32_t a = 1, b = 0;                              /* Adler-32 of the raw (filtered) rows */
    size_t left = raw, y = 0, x = 0;                    /* position in the raw stream: row y, byte x */
    while (left > 0) {
        size_t n = left < 65535 ? left : 65535;
        left -= n;
        *d++ = left == 0;                               /* BFINAL, BTYPE 00 (stored) */
        *d++ = (uint8_t)n; *d++ = (uint8_t)(n >> 8);
        *d++ = (uint8_t)~n; *d++ = (uint8_t)(~n >> 8);
        for (size_t i = 0; i < n; i++) {
            uint8_t c = x == 0 ? 0 : rgb[y * (row - 1) + x - 1];   /* filter byte 0, then pixels */
            *d++ = c;
            a = (a + c) % 65521;
            b = (b + a) % 65521;
            if (++x == row) { x = 0; y++; }
        }
    }
    d = put32(d, (b << 16) | a);
    o = chunk(o, "IDAT", idat);
    o = chunk(o, "IEND", 0);
    lk_status s = lk_write_file_atomic(path, buf, (size_t)(o - buf));
    free(buf);
    return s;
}

/* --- the plot: axes, ticks, grid and a polyline, drawn into an RGB buffer ------------- */
typedef struct { uint8_t *px; int w, h; } canvas;

static void dot(canvas *c, int x, int y, const uint8_t col[3]) {
    if (x < 0 || y < 0 || x >= c->w || y >= c->h) return;
    memcpy(c->px + ((size_t)y * c->w + x) * 3, col, 3);
}

static void line(canvas *c, int x0, int y0, int x1, int y1, const uint8_t col[3], int thick) {
    int dx = abs(x1 - x0), dy = -abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1, e = dx + dy;
    for (;;) {   /* Bresenham */
        for (int t = 0; t < thick; t++) { dot(c, x0, y0 + t, col); dot(c, x0 + t, y0, col); }
        if (x0 == x1 && y0 == y1) return;
        int e2 = 2 * e;
        if (e2 >= dy) { e += dy; x0 += sx; }
        if (e2 <= dx) { e += dx; y0 += sy; }
    }
}

/* A 3x5 pixel font for the tick labels and axis names: five rows of three bits. */
static const struct { char c; uint16_t rows; } glyphs[] = {
    {'0', 075557}, {'1', 026227}, {'2', 071747}, {'3', 071717}, {'4', 055711}, {'5', 074717},
    {'6', 074757}, {'7', 071111}, {'8', 075757}, {'9', 075717}, {'.', 000002}, {'-', 000700},
    {'e', 075647}, {'s', 034216}, {'t', 027223}, {'p', 075744}, {'l', 044447}, {'o', 007557},
};

/* Draws text with its top-left corner at (x, y), each font pixel a scale x scale block. */
static void text(canvas *c, int x, int y, const char *str, int scale, const uint8_t col[3]) {
    for (; *str; str++, x += 4 * scale)
        for (size_t g = 0; g < sizeof glyphs / sizeof *glyphs; g++) {
            if (glyphs[g].c != *str) continue;
            for (int r = 0; r < 5; r++)
                for (int b = 0; b < 3; b++)
                    if (glyphs[g].rows >> ((4 - r) * 3 + (2 - b)) & 1)
                        for (int dy = 0; dy < scale; dy++)
                            for (int dx = 0; dx < scale; dx++) dot(c, x + b * scale + dx, y + r * scale + dy, col);
        }
}

static int text_width(const char *str, int scale) { return (int)strlen(str) * 4 * scale - scale; }

/* Round tick spacing (1, 2 or 5 times a power of ten) giving about n ticks over span. */
static double tick_step(double span, int n) {
    double raw = span / n, p = pow(10.0, floor(log10(raw))), f = raw / p;
    return p * (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10);
}

lk_status lk_plot_png(const char *path, const float *x, const float *y, int64_t n, int w, int h) {
    if (w < 64 || h < 64 || n < 0 || (n > 0 && (x == NULL || y == NULL)))
        return lk_error(LK_EINVAL, "plot: expected at least 64 x 64 and points, got %d x %d, n %lld", w, h, (long long)n);
    canvas c = {malloc((size_t)w * h * 3), w, h};
    if (c.px == NULL) return lk_error(LK_ENOMEM, "plot: %d x %d", w, h);
    memset(c.px, 255, (size_t)w * h * 3);
    static const uint8_t black[3] = {0, 0, 0}, grid[3] = {225, 225, 225}, blue[3] = {31, 119, 180};
    double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
    int first = 1;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i]) || !isfinite(y[i])) continue;
        if (first) { x0 = x1 = x[i]; y0 = y1 = y[i]; first = 0; }
        x0 = fmin(x0, x[i]); x1 = fmax(x1, x[i]); y0 = fmin(y0, y[i]); y1 = fmax(y1, y[i]);
    }
    if (x1 - x0 < 1e-9) x1 = x0 + 1;
    if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
    double ys = tick_step(y1 - y0, 6), xs = tick_step(x1 - x0, 8);
    y0 = floor(y0 / ys) * ys; y1 = ceil(y1 / ys) * ys;
    const int L = 64, R = w - 16, T = 16, B = h - 44;   /* plot area inside the margins */
#define PX(v) (L + (int)lround(((v) - x0) / (x1 - x0) * (R - L)))
#define PY(v) (B - (int)lround(((v) - y0) / (y1 - y0) * (B - T)))
    char label[32];
    for (double t = y0; t <= y1 + ys * 0.5; t += ys) {
        line(&c, L, PY(t), R, PY(t), grid, 1);
        line(&c, L - 6, PY(t), L, PY(t), black, 1);
        snprintf(label, sizeof label, "%.4g", fabs(t) < ys * 1e-6 ? 0.0 : t);
        text(&c, L - 10 - text_width(label, 2), PY(t) - 5, label, 2, black);
    }
    for (double t = ceil(x0 / xs) * xs; t <= x1 + xs * 0.5; t += xs) {
        line(&c, PX(t), T, PX(t), B, grid, 1);
        line(&c, PX(t), B, PX(t), B + 6, black, 1);
        snprintf(label, sizeof label, "%.6g", t);
        text(&c, PX(t) - text_width(label, 2) / 2, B + 10, label, 2, black);
    }
    text(&c, (L + R) / 2 - text_width("step", 2) / 2, h - 14, "step", 2, black);
    text(&c, 4, T, "loss", 2, black);
    line(&c, L, T, L, B, black, 2);
    line(&c, L, B, R, B, black, 2);
    int have = 0, px = 0, py = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i]) || !isfinite(y[i])) { have = 0; continue; }
        int qx = PX(x[i]), qy = PY(y[i]);
        if (have) line(&c, px, py, qx, qy, blue, 2);
        else dot(&c, qx, qy, blue);
        px = qx; py = qy; have = 1;
    }
#undef PX
#undef PY
    lk_status s = lk_png_write(path, c.px, w, h);
    free(c.px);
    return s;
}
