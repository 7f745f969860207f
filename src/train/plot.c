/* plot.c — the loss plot the trainer writes beside loss.csv (train.h: lk_plot_png) and the
 * PNG writer under it (lk_png_write), drawn with cairo (Debian's libcairo2-dev): real
 * text in the system's sans-serif face and anti-aliased lines, encoded by cairo's own PNG
 * writer (libpng). Cairo rather than a script of our own reading loss.csv: the plot
 * stays current at every save of a run (a script would have to be run, and need
 * matplotlib or another encoder), and the hand-written encoder, CRC and 3x5 pixel font
 * this file held before (issue 21) go. Files are written atomically through
 * checkpoint.h: the PNG is encoded into memory, then renamed into place. With no font
 * installed cairo draws the labels as nothing; the axes and the curve stay. */
#include <cairo.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llmkern/checkpoint.h"
#include "llmkern/train.h"

typedef struct { unsigned char *buf; size_t len, cap; int failed; } png_bytes;

static cairo_status_t append(void *closure, const unsigned char *data, unsigned int n) {
    png_bytes *b = closure;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->len + n) cap *= 2;
        unsigned char *p = realloc(b->buf, cap);
        if (!p) { b->failed = 1; return CAIRO_STATUS_WRITE_ERROR; }
        b->buf = p;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, data, n);
    b->len += n;
    return CAIRO_STATUS_SUCCESS;
}

/* Encodes surface as PNG and writes it to path atomically. */
static lk_status save(cairo_surface_t *surface, const char *path, const char *who) {
    png_bytes b = {0};
    cairo_status_t cs = cairo_surface_write_to_png_stream(surface, append, &b);
    lk_status s;
    if (b.failed) s = lk_error(LK_ENOMEM, "%s: %s: out of memory encoding the PNG", who, path);
    else if (cs != CAIRO_STATUS_SUCCESS) s = lk_error(LK_EIO, "%s: %s: cairo: %s", who, path, cairo_status_to_string(cs));
    else s = lk_write_file_atomic(path, b.buf, b.len);
    free(b.buf);
    return s;
}

lk_status lk_png_write(const char *path, const uint8_t *rgb, int w, int h) {
    if (path == NULL || rgb == NULL || w < 1 || h < 1 || w > 16384 || h > 16384)
        return lk_error(LK_EINVAL, "png: expected a path, pixels and 1..16384 x 1..16384, got %d x %d", w, h);
    cairo_surface_t *sf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, w, h);
    if (cairo_surface_status(sf) != CAIRO_STATUS_SUCCESS) {
        cairo_surface_destroy(sf);
        return lk_error(LK_ENOMEM, "png: %d x %d: %s", w, h, cairo_status_to_string(cairo_surface_status(sf)));
    }
    cairo_surface_flush(sf);
    unsigned char *px = cairo_image_surface_get_data(sf);
    int stride = cairo_image_surface_get_stride(sf);
    for (int y = 0; y < h; y++) {   /* RGB24: one native-endian 0x00RRGGBB word a pixel */
        uint32_t *row = (uint32_t *)(px + (size_t)y * stride);
        const uint8_t *src = rgb + (size_t)y * w * 3;
        for (int x = 0; x < w; x++) row[x] = (uint32_t)src[3 * x] << 16 | (uint32_t)src[3 * x + 1] << 8 | src[3 * x + 2];
    }
    cairo_surface_mark_dirty(sf);
    lk_status s = save(sf, path, "png");
    cairo_surface_destroy(sf);
    return s;
}

/* Round tick spacing (1, 2 or 5 times a power of ten) giving about n ticks over span. */
static double tick_step(double span, int n) {
    double raw = span / n, p = pow(10.0, floor(log10(raw))), f = raw / p;
    return p * (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10);
}

/* Text with its anchor at (x, y): ax 0 / 0.5 / 1 = left / centre / right, vertically centred. */
static void label(cairo_t *cr, double x, double y, const char *s, double ax) {
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    cairo_move_to(cr, x - ax * e.x_advance, y - (e.y_bearing + e.height / 2));
    cairo_show_text(cr, s);
}

lk_status lk_plot_png(const char *path, const float *x, const float *y, int64_t n, int w, int h) {
    if (w < 64 || h < 64 || w > 16384 || h > 16384 || n < 0 || (n > 0 && (x == NULL || y == NULL)))
        return lk_error(LK_EINVAL, "plot: expected 64..16384 x 64..16384 and points, got %d x %d, n %lld", w, h,
                        (long long)n);
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

    cairo_surface_t *sf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, w, h);
    cairo_t *cr = cairo_create(sf);
    if (cairo_status(cr) != CAIRO_STATUS_SUCCESS) {
        lk_status s = lk_error(LK_ENOMEM, "plot: %d x %d: %s", w, h, cairo_status_to_string(cairo_status(cr)));
        cairo_destroy(cr);
        cairo_surface_destroy(sf);
        return s;
    }
    const double L = 64, R = w - 16, T = 16, B = h - 44;   /* the plot area inside the margins */
#define PX(v) (L + ((v) - x0) / (x1 - x0) * (R - L))
#define PY(v) (B - ((v) - y0) / (y1 - y0) * (B - T))
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 12);
    char text[32];
    cairo_set_line_width(cr, 1);
    for (double t = y0; t <= y1 + ys * 0.5; t += ys) {   /* grid, ticks and labels: y */
        double py = floor(PY(t)) + 0.5;                  /* 1-pixel lines on pixel centres: crisp */
        cairo_set_source_rgb(cr, 225 / 255.0, 225 / 255.0, 225 / 255.0);
        cairo_move_to(cr, L, py); cairo_line_to(cr, R, py); cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        cairo_move_to(cr, L - 6, py); cairo_line_to(cr, L, py); cairo_stroke(cr);
        snprintf(text, sizeof text, "%.4g", fabs(t) < ys * 1e-6 ? 0.0 : t);
        label(cr, L - 9, py, text, 1);
    }
    for (double t = ceil(x0 / xs) * xs; t <= x1 + xs * 0.5; t += xs) {   /* and x */
        double px = floor(PX(t)) + 0.5;
        cairo_set_source_rgb(cr, 225 / 255.0, 225 / 255.0, 225 / 255.0);
        cairo_move_to(cr, px, T); cairo_line_to(cr, px, B); cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        cairo_move_to(cr, px, B); cairo_line_to(cr, px, B + 6); cairo_stroke(cr);
        snprintf(text, sizeof text, "%.6g", t);
        label(cr, px, B + 16, text, 0.5);
    }
    label(cr, (L + R) / 2, h - 10, "step", 0.5);
    cairo_save(cr);                                       /* the y axis name, turned */
    cairo_translate(cr, 12, (T + B) / 2);
    cairo_rotate(cr, -M_PI / 2);
    label(cr, 0, 0, "loss", 0.5);
    cairo_restore(cr);
    cairo_set_line_width(cr, 2);                          /* the axes, on whole pixels */
    cairo_move_to(cr, L, T); cairo_line_to(cr, L, B + 1); cairo_line_to(cr, R, B + 1);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 31 / 255.0, 119 / 255.0, 180 / 255.0);   /* the loss, gaps at NaN */
    cairo_set_line_width(cr, 2);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
    int have = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i]) || !isfinite(y[i])) { have = 0; continue; }
        if (have) cairo_line_to(cr, PX(x[i]), PY(y[i]));
        else { cairo_move_to(cr, PX(x[i]), PY(y[i])); cairo_close_path(cr); cairo_move_to(cr, PX(x[i]), PY(y[i])); }
        have = 1;
    }
    cairo_stroke(cr);   /* a lone point: a round-capped closed path of length 0, a dot */
#undef PX
#undef PY
    cairo_status_t cs = cairo_status(cr);
    lk_status s = cs == CAIRO_STATUS_SUCCESS ? save(sf, path, "plot")
                                             : lk_error(LK_EIO, "plot: %s: cairo: %s", path, cairo_status_to_string(cs));
    cairo_destroy(cr);
    cairo_surface_destroy(sf);
    return s;
}
